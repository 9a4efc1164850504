"""Trainer progress where bars cannot go: one plain line per log event (step, loss, learning rate, rate, ETA),
and a line every ``LINE_SECONDS`` during an evaluation."""

from __future__ import annotations

import sys
import time

from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback

from ..formats.bars import LINE_SECONDS, interactive


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


class LogLines(TrainerCallback):
    """Prints ``step 120/1000 (12%) loss 3.2100 lr 4.50e-05 2.31 steps/s ETA 6m21s`` at each Trainer log
    (every ``logging_steps``) and each evaluation, to ``stream`` (default standard error)."""

    def __init__(self, stream=None, clock=None):
        self.stream, self.start, self.first, self.printed = stream, None, 0, 0.0
        self.clock = clock  # a ``WallClockLimit`` when time, not a step count, ends the run: progress by time
        self.eval_start, self.eval_batches, self.eval_printed = None, 0, 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        self.start, self.first = time.monotonic(), state.global_step  # a resumed run counts its own rate
        self.printed = self.start

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or self.start is None:
            return
        self._print(
            state,
            [
                f"{k} {v:.4f}"
                for k, v in logs.items()
                if k in ("loss", "eval_loss", "train_loss")
                or k.startswith("eval_")
                and isinstance(v, float)
                and not k.endswith(("_runtime", "_per_second"))
            ]
            + ([f"lr {logs['learning_rate']:.2e}"] if "learning_rate" in logs else []),
        )

    def on_step_end(self, args, state, control, **kwargs):
        """Slow steps (a big teacher, a long logging interval): a bare step line every ``LINE_SECONDS``."""
        if state.is_world_process_zero and self.start is not None and time.monotonic() - self.printed >= LINE_SECONDS:
            self._print(state, [])

    def _print(self, state, values: list[str]) -> None:
        step, total = state.global_step, state.max_steps
        self.printed = time.monotonic()
        rate = (step - self.first) / max(self.printed - self.start, 1e-9)
        if self.clock is not None:
            spent = self.clock.spent()
            parts = [
                f"step {step} ({100 * spent:.0f}% of {_duration(self.clock.seconds)})",
                *values,
                f"{rate:.2f} steps/s ETA {_duration((1 - spent) * self.clock.seconds)}",
            ]
            print(" ".join(parts), file=self.stream or sys.stderr, flush=True)
            return
        parts = [f"step {step}/{total} ({100 * step / max(total, 1):.0f}%)", *values]
        if rate > 0:
            parts.append(f"{rate:.2f} steps/s ETA {_duration((total - step) / rate)}")
        print(" ".join(parts), file=self.stream or sys.stderr, flush=True)

    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
        """Evaluations are long too: ``evaluating: batch 40/256 (16%) 3.10 batches/s ETA 1m10s`` every
        ``LINE_SECONDS``."""
        now = time.monotonic()
        if self.eval_start is None:
            self.eval_start, self.eval_batches, self.eval_printed = now, 0, now
        self.eval_batches += 1
        if now - self.eval_printed < LINE_SECONDS or not state.is_world_process_zero:
            return
        self.eval_printed = now
        n, rate = self.eval_batches, self.eval_batches / max(now - self.eval_start, 1e-9)
        total = len(eval_dataloader) if hasattr(eval_dataloader, "__len__") else None
        where = f"batch {n}/{total} ({100 * n / max(total, 1):.0f}%)" if total else f"batch {n}"
        eta = f" ETA {_duration((total - n) / rate)}" if total else ""
        print(f"evaluating: {where} {rate:.2f} batches/s{eta}", file=self.stream or sys.stderr, flush=True)

    def on_evaluate(self, args, state, control, **kwargs):
        self.eval_start = None

    on_predict = on_evaluate


def no_bars(progress: bool) -> bool:
    """``TrainingArguments.disable_tqdm``: bars only with ``progress`` on a terminal."""
    return not (progress and interactive())


def show_progress(trainer, progress: bool, clock=None) -> None:
    """Wherever there are no bars (off a terminal, or ``progress`` off: ``--no-progress``), :class:`LogLines` in
    place of the Trainer's printed log dictionaries; ``clock``: the ``WallClockLimit`` that ends a run bounded by
    time only (its lines count time, not steps)."""
    if no_bars(progress):
        trainer.remove_callback(PrinterCallback)
        trainer.add_callback(LogLines(clock=clock))
