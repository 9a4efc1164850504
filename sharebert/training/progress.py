"""Trainer progress where bars cannot go: one plain line per log event (step, loss, learning rate, rate, ETA)."""
from __future__ import annotations

import sys
import time

from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback

from ..progress import interactive


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


class LogLines(TrainerCallback):
    """Prints ``step 120/1000 (12%) loss 3.2100 lr 4.50e-05 2.31 steps/s ETA 6m21s`` at each Trainer log
    (every ``logging_steps``) and each evaluation, to ``stream`` (default standard error)."""

    def __init__(self, stream=None):
        self.stream, self.start, self.first = stream, None, 0

    def on_train_begin(self, args, state, control, **kwargs):
        self.start, self.first = time.monotonic(), state.global_step  # a resumed run counts its own rate

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or self.start is None:
            return
        step, total = state.global_step, state.max_steps
        rate = (step - self.first) / max(time.monotonic() - self.start, 1e-9)
        parts = [f"step {step}/{total} ({100 * step / max(total, 1):.0f}%)"]
        parts += [f"{k} {v:.4f}" for k, v in logs.items() if k in ("loss", "eval_loss", "train_loss") or k.startswith("eval_")
                  and isinstance(v, float) and not k.endswith(("_runtime", "_per_second"))]
        if "learning_rate" in logs:
            parts.append(f"lr {logs['learning_rate']:.2e}")
        if rate > 0:
            parts.append(f"{rate:.2f} steps/s ETA {_duration((total - step) / rate)}")
        print(" ".join(parts), file=self.stream or sys.stderr, flush=True)


def no_bars(progress: bool) -> bool:
    """``TrainingArguments.disable_tqdm``: bars only with ``progress`` on a terminal."""
    return not (progress and interactive())


def show_progress(trainer, progress: bool) -> None:
    """Off a terminal, :class:`LogLines` in place of the Trainer's printed log dictionaries."""
    if progress and not interactive():
        trainer.remove_callback(PrinterCallback)
        trainer.add_callback(LogLines())
