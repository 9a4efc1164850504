"""Trainer helpers for pre-training: checkpoint completion markers, JSONL logging, signal checkpoints.

A ``checkpoint-N`` folder counts only once :func:`mark_complete` has written its marker (after every
file in it was flushed to disk), so a save killed halfway is never resumed from and never makes
rotation delete the previous good checkpoint. The marker records each file's size (checked whenever
checkpoints are listed) and SHA-256 (checked by :func:`resume_checkpoint` before a resume).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import threading
import time
from pathlib import Path

import torch
from transformers import TrainerCallback
from transformers.integrations import TensorBoardCallback
from transformers.trainer_callback import ExportableState

from sharebert_runtime.outdir import CHECKPOINT_MARK, file_sha256, read_json, seal_out, write_json

MARKER = CHECKPOINT_MARK  # outdir vouches for a copied stopped run by it
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def mark_complete(folder: str | Path, step: int) -> None:
    """Flush ``folder`` to disk, then atomically write its completion marker (temp file + rename)."""
    folder = Path(folder)
    _fsync_tree(folder)
    files = {
        p.name: {"size": p.stat().st_size, "sha256": file_sha256(p)}
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name != MARKER
    }
    tmp = folder / f".{MARKER}.tmp"
    with open(tmp, "w") as f:
        json.dump({"step": step, "time": time.time(), "files": files}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / MARKER)


def _recorded(folder: Path) -> dict | None:
    """``{name: {"size", "sha256"}}`` from the marker, or None without a readable marker: one that is no regular
    file of bounded size (a FIFO was waited on forever, a link to /dev/zero read without end), or that lists a file
    by any other name than a plain one in the checkpoint (``../`` led outside it)."""
    try:
        files = read_json(folder / MARKER)["files"]
        if any(Path(n).name != n for n in files):
            return None
        return {n: r if isinstance(r, dict) else {"size": r} for n, r in files.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def is_complete(folder: str | Path) -> bool:
    """Whether ``folder`` has a marker and still holds every file, at the recorded size."""
    folder = Path(folder)
    files = _recorded(folder)
    return files is not None and all(
        (folder / n).is_file() and (folder / n).stat().st_size == r.get("size") for n, r in files.items()
    )


def corrupt_file(folder: str | Path) -> Path | None:
    """The first file of a complete checkpoint whose SHA-256 differs from its marker's, else None."""
    folder = Path(folder)
    for name, r in (_recorded(folder) or {}).items():
        if "sha256" in r and file_sha256(folder / name) != r["sha256"]:
            return folder / name
    return None


def resume_checkpoint(out: str | Path, say=print) -> Path | None:
    """The newest complete checkpoint whose files match their hashes. A corrupt one is renamed
    ``corrupt-checkpoint-N`` (kept, never resumed from) and the previous one is tried, saying so;
    ``ValueError`` naming the file when no intact checkpoint is left. An incomplete one (a save killed
    halfway) is renamed ``incomplete-checkpoint-N`` (kept): left as ``checkpoint-N``, transformers' rotation
    would count it as the newest and delete the checkpoints the resumed run saves."""
    found = checkpoints(out)
    for _, ckpt, ok in found:
        if not ok:
            aside = _set_aside(ckpt, "incomplete")
            say(f"{ckpt.name} was never completed (a save stopped halfway); set aside as {aside.name}")
    complete = [p for _, p, ok in found if ok]
    bad = None
    for ckpt in reversed(complete):
        bad = corrupt_file(ckpt)
        if bad is None:
            return ckpt
        aside = _set_aside(ckpt, "corrupt")
        say(
            f"{bad} does not match the SHA-256 recorded when it was saved; set aside as {aside.name}, "
            f"trying the previous checkpoint"
        )
    if bad is not None:
        raise ValueError(f"no intact checkpoint left in {out} ({bad.name} was corrupt); start a new --out")
    return None


_ASIDE = re.compile(r"(?:(?:incomplete|corrupt)-checkpoint-\d+(?:\.\d+)?|checkpoint-\d+)")  # ours, by name


def _set_aside(ckpt: Path, why: str) -> Path:
    """Rename ``ckpt`` to ``<why>-checkpoint-N`` (``.2``, ``.3``... after it when a checkpoint of that step was set
    aside before, e.g. corrupted again after a resume); returns the new path."""
    aside, n = ckpt.with_name(f"{why}-{ckpt.name}"), 1
    while os.path.lexists(aside):  # a link counts, even one that leads nowhere
        n += 1
        aside = ckpt.with_name(f"{why}-{ckpt.name}.{n}")
    os.replace(ckpt, aside)
    return aside


def checkpoints(out: str | Path) -> list[tuple[int, Path, bool]]:
    """``(step, folder, complete)`` for every ``checkpoint-N`` in ``out``, by step."""
    out = Path(out)
    if not out.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in out.iterdir() if p.is_dir() and (m := _CHECKPOINT.match(p.name))]
    return [(step, p, is_complete(p)) for step, p in sorted(found)]


def latest_checkpoint(out: str | Path) -> Path | None:
    """The newest complete checkpoint in ``out`` (incomplete ones are ignored)."""
    complete = [p for _, p, ok in checkpoints(out) if ok]
    return complete[-1] if complete else None


def remove_incomplete(out: str | Path) -> list[Path]:
    """Delete ``checkpoint-N`` folders without a valid marker (left by a killed save); returns them."""
    removed = [p for _, p, ok in checkpoints(out) if not ok]
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    return removed


def rotate(out: str | Path, keep: int | None, spare: str | Path | None = None) -> None:
    """Keep the ``keep`` newest complete checkpoints (None: all) and ``spare`` (the best one, when the run keeps
    it); never touches incomplete ones and always keeps the newest, whatever ``keep`` says."""
    if keep is None:
        return
    spare = Path(spare).name if spare else None
    complete = [p for _, p, ok in checkpoints(out) if ok and p.name != spare]
    for p in complete[: max(0, len(complete) - max(1, keep))]:
        shutil.rmtree(p, ignore_errors=True)


def resume_from(folder: str | Path, resume: bool, say=print, out: Path | None = None) -> Path | None:
    """``--resume`` of a fine-tuning or distillation run whose checkpoints are in ``folder``: the newest intact
    complete one (:func:`resume_checkpoint`; a save killed halfway is skipped); None without ``resume``.
    ``ValueError`` when there is nothing to resume, rather than silently training from scratch, naming ``out``
    (the user's ``--out``; default ``folder``'s parent)."""
    if not resume:
        return None
    found = resume_checkpoint(folder, say) if Path(folder).is_dir() else None
    if found is None:
        from sharebert_runtime.outdir import OutLock

        out = Path(folder).parent if out is None else Path(out)  # used: holds more than the lock this run took
        used = out.is_dir() and any(p.name != OutLock.NAME for p in out.iterdir())
        if (out / "metrics.json").is_file():
            raise ValueError(
                f"--resume: {out} holds a finished run's results and no checkpoint to continue from (they "
                "are removed at its end without --keep-checkpoints): its results stand; to train again, "
                "start it with --overwrite instead of --resume"
            )
        start = "start it again with --overwrite instead of --resume" if used else "run without --resume to start"
        raise ValueError(f"--resume: {out} holds no complete checkpoint to continue from; {start}")
    say(f"resuming from {found}")
    return found


def start_checkpoints(folder: str | Path, start_from) -> None:
    """Just before training: a run that does not resume (``start_from`` None) starts with no checkpoint of an
    earlier run in ``folder`` (left by the run ``--overwrite`` replaces), else a later ``--resume`` would
    continue the older run. Only our own folders go (``checkpoint-N``, ``incomplete-`` / ``corrupt-checkpoint-N``,
    real folders, not links); anything else there stays, and a ``folder`` that is a link is left alone."""
    folder = Path(folder)
    if start_from is not None or folder.is_symlink() or not folder.is_dir():
        return
    for path in folder.iterdir():
        if _ASIDE.fullmatch(path.name) and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)


class TimedSaves(TrainerCallback):
    """A checkpoint at the first step end ``minutes`` of training after the last save (or the start), whatever
    the epoch and ``save_steps`` say, so a run killed at any time (kill -9 included) loses at most about that
    much (None or 0: none by time). Distributed ranks agree (MAX), so they save at the same step."""

    def __init__(self, minutes: float | None = None):
        self.seconds = 60 * minutes if minutes else None
        self._last = None

    def on_train_begin(self, args, state, control, **kwargs):
        self._last = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        if self.seconds is not None and any_rank(time.monotonic() - self._last >= self.seconds, args.device):
            control.should_save = True
        return control

    def on_save(self, args, state, control, **kwargs):
        self._last = time.monotonic()


class MarkCheckpoints(TimedSaves):
    """:class:`TimedSaves` that also writes each checkpoint's completion marker (:func:`mark_complete`) once the
    Trainer has saved it, so the Trainers of fine-tuning and distillation skip a save killed halfway as
    pre-training does (its Trainer marks its own); then keeps the ``keep`` newest complete checkpoints and the
    best (:func:`rotate`: the Trainer's own ``save_total_limit`` must be None, as it deleted the last complete
    checkpoint before the new one was marked)."""

    def __init__(self, minutes: float | None = None, keep: int | None = None):
        super().__init__(minutes)
        self.keep = keep

    def on_train_begin(self, args, state, control, **kwargs):
        """A resumed state names its best checkpoint by the folder it was saved in: in a copy of the run (``cp -r``)
        the original's, or none where that is gone. The run's own checkpoint of that step is its best (kept by the
        rotation, loaded at the end)."""
        super().on_train_begin(args, state, control, **kwargs)
        own = Path(args.output_dir) / f"checkpoint-{state.best_global_step}" if state.best_global_step else None
        if own is not None and own.is_dir():
            state.best_model_checkpoint = str(own)

    def on_save(self, args, state, control, model=None, **kwargs):
        super().on_save(args, state, control, **kwargs)
        # weights gone NaN/inf by the step's update (the loss is checked before it) are never marked: never resumed
        if state.is_world_process_zero and (model is None or finite_weights(model)):
            mark_complete(Path(args.output_dir) / f"checkpoint-{state.global_step}", state.global_step)
            rotate(args.output_dir, self.keep, state.best_model_checkpoint)


class NonFiniteLoss(RuntimeError):
    """Training stopped on a NaN/inf loss (or, at its end, on weights that are no longer finite: ``loss`` None);
    ``step`` is the optimizer step that produced it."""

    def __init__(self, step: int, loss: float | None, checkpoint: Path | None):
        self.step, self.loss, self.checkpoint = step, loss, checkpoint
        where = f"the last good checkpoint is {checkpoint}" if checkpoint else "no checkpoint was saved before it"
        what = (
            f"loss became {loss} at step {step}; training stopped before the update"
            if loss is not None
            else f"weights became NaN or inf by step {step}; nothing was published"
        )
        super().__init__(f"{what}, {where} (lower --lr, or check the data)")


def finite_weights(model) -> bool:
    """Whether every parameter of ``model`` is finite (one pass over them, no copy)."""
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


class StopsOnNonFiniteLoss:
    """``Trainer`` mixin: a NaN or infinite training loss raises :class:`NonFiniteLoss` before the optimizer applies
    it. Without it the Trainer's ``logging_nan_inf_filter`` hid the NaN (logged as the mean of the steps before) and
    a fine-tuning or distillation at ``--lr 1e9`` published a model of NaN weights with exit 0."""

    def training_step(self, *a, **kw):
        loss = super().training_step(*a, **kw)
        value = loss.item()
        if any_rank(not math.isfinite(value), self.args.device):
            raise NonFiniteLoss(self.state.global_step + 1, value, latest_checkpoint(self.args.output_dir))
        return loss


class WarmupMayFillTheRun:
    """``Trainer`` mixin: a run whose warmup is exactly as long as the run itself (``--max-steps 50`` at the default
    ``--warmup-steps 50``, or an epochs' count equal to it) is all warmup. transformers' polynomial decay divides by
    its decay steps, 0 then, at the last step's scheduler step: ZeroDivisionError after the whole run had trained.
    Counting one step more than the run takes leaves every step's learning rate as it was (a warmup longer than
    the run is warmup throughout)."""

    def create_scheduler(self, num_training_steps, optimizer=None):
        a = self.args
        if a.lr_scheduler_type == "polynomial" and a.get_warmup_steps(num_training_steps) >= num_training_steps:
            num_training_steps += 1
        return super().create_scheduler(num_training_steps, optimizer)


def save_checkpoint(trainer) -> None:
    """A checkpoint of ``trainer``'s last complete step outside its loop (a signal during an evaluation), then the
    ``on_save`` callbacks, as the loop runs them after a save (the marker, the rotation). ``_save_checkpoint`` is
    transformers' private method: no public one writes a resumable checkpoint (docs/MODEL.md)."""
    trainer._save_checkpoint(trainer.model, None)
    trainer.control = trainer.callback_handler.on_save(trainer.args, trainer.state, trainer.control)


class TensorBoardLogs(TensorBoardCallback):
    """transformers' TensorBoard logging into ``folder`` (transformers 5 dropped ``TrainingArguments.logging_dir``;
    its own default is a dated folder under the output folder). The writer is made by the main process only."""

    def __init__(self, folder: str | Path):
        super().__init__()
        self.folder = str(folder)

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero and self.tb_writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self.tb_writer = SummaryWriter(log_dir=self.folder)
        super().on_train_begin(args, state, control, **kwargs)


class JsonlLogger(TrainerCallback):
    """Appends one JSON object per logging event (train loss, eval loss/perplexity, ...) to ``path``."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        record = {"step": state.global_step, "epoch": state.epoch, "time": round(time.time(), 3)}
        record.update({k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in logs.items()})
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")


def any_rank(flag: bool, device) -> bool:
    """Whether ``flag`` holds on any process (a MAX all-reduce), so that every rank stops at the same step."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        t = torch.tensor([float(flag)], device=device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return bool(t.item())
    return bool(flag)


class StopRequested(Exception):
    """A SIGINT/SIGTERM arrived where no step can be finished (tokenizing, evaluating): stop now."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


class SignalCheckpoint(TrainerCallback):
    """On SIGINT/SIGTERM: finish the current step, save a checkpoint and stop (``received`` holds the
    signal). During evaluation (checked at each batch) or before training (``check()``, polled by the
    tokenizer loop) it raises :class:`StopRequested` instead. A second signal aborts at once. In
    distributed runs the ranks agree before stopping. Use as a context manager around the whole run."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.received: int | None = None
        self._previous: dict = {}

    def _handle(self, signum, frame):
        if self.received is not None:
            raise KeyboardInterrupt
        self.received = signum

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():  # handlers need the main thread
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc):
        self.restore()

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def check(self) -> None:
        if self.received is not None:
            raise StopRequested(self.received)

    def _agreed(self, args) -> bool:
        stop = any_rank(self.received is not None, args.device)
        if stop and self.received is None:
            self.received = signal.SIGTERM  # another rank was signalled
        return stop

    def on_step_end(self, args, state, control, **kwargs):
        if self._agreed(args):
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_prediction_step(self, args, state, control, **kwargs):
        if self._agreed(args):
            raise StopRequested(self.received)


class StopsAtMaxSteps:
    """``Trainer`` mixin: a run resumed from a checkpoint at its ``max_steps`` (or one :func:`kept_result` found
    finished: ``finished``) takes no step (transformers' loop draws a batch before it first checks the limit, so a
    run resumed mid-epoch trained one step past its end)."""

    finished = False

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        if 0 < self.args.max_steps <= self.state.global_step or self.finished:
            self.control.should_training_stop = True
            return [], None
        return super().get_batch_samples(epoch_iterator, num_batches, device)


class FitsCheckpoint:
    """``Trainer`` mixin: ``train(resume_from_checkpoint=...)`` first refuses, in one line naming it, a checkpoint
    whose weights do not fit the model (another ``--model`` / ``--student`` or width than the run that saved it),
    rather than the ``load_state_dict`` error the Trainer's load would raise (:func:`check_fits`)."""

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        if resume_from_checkpoint:
            check_fits(self.model, resume_from_checkpoint)
        return super().train(resume_from_checkpoint, *args, **kwargs)


def check_fits(model, checkpoint: str | Path) -> None:
    """``ValueError`` naming ``checkpoint`` when a tensor of its ``model.safetensors`` has another shape than the
    model's tensor of that name (read from the file's header: nothing is loaded)."""
    path = Path(checkpoint) / "model.safetensors"
    if not path.is_file():  # a sharded or torch checkpoint: the Trainer's own load says what is wrong
        return
    from safetensors import safe_open

    own = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    with safe_open(str(path), "pt") as f:
        saved = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    wrong = [
        f"{k}: {list(s)} in the checkpoint, {list(own[k])} in this model"
        for k, s in saved.items()
        if k in own and s != own[k]
    ]
    if wrong:
        raise ValueError(
            f"{checkpoint} does not fit this model (size mismatch for {wrong[0]}"
            f"{f', and {len(wrong) - 1} more' if len(wrong) > 1 else ''}); resume with the model options "
            "of the run that saved it, or start again with --overwrite"
        )


def finished_run(trainer, state: dict) -> str | None:
    """Why the run whose checkpoint holds ``state`` (:func:`trainer_state`) has no step left under ``trainer``'s
    limits, or None if it has some (a
    larger ``--max-steps`` / ``--max-time`` continues a finished run): its step reached the steps this run plans
    (``max_steps``, or its epochs' steps as the Trainer counts them), or its :class:`WallClockLimit` stopped it and
    the limit is no larger now."""
    step = state.get("global_step")
    saved_clock = (state.get("stateful_callbacks") or {}).get(WallClockLimit.__name__)
    a = trainer.args
    total = a.max_steps if a.max_steps > 0 else epochs_steps(trainer)
    if isinstance(step, int) and isinstance(total, int) and 0 < total <= step:
        return f"at step {step}, its last"
    clock = next((c for c in trainer.callback_handler.callbacks if isinstance(c, WallClockLimit)), None)
    if clock is not None and isinstance(saved_clock, dict):
        seconds = (saved_clock.get("args") or {}).get("seconds")
        if (
            (saved_clock.get("attributes") or {}).get("reached")
            and isinstance(seconds, (int, float))
            and clock.seconds <= seconds
        ):
            return f"at step {step}, its --max-time of {seconds:g} s spent"
    return None


def epochs_steps(trainer) -> int:
    """The optimizer steps ``trainer``'s epochs make, as transformers 5's Trainer counts them (a last short
    accumulation counts as a step; the same as transformers 4's count without accumulation)."""
    a = trainer.args
    per_epoch = max(1, math.ceil(len(trainer.get_train_dataloader()) / a.gradient_accumulation_steps))
    return math.ceil(a.num_train_epochs * per_epoch)


def kept_result(
    trainer, checkpoint: str | Path | None, out: Path, expect=(), published: bool = True, say=print
) -> dict | None:
    """A ``--resume`` of a run that had finished (:func:`finished_run`) and written ``out/metrics.json`` (holding every
    key of ``expect``) at that checkpoint's step, its model ``published`` there: those metrics, kept as they are (said
    in one line; the caller returns them instead of training again, which would rewrite its figures and checkpoint);
    None otherwise. A finished run whose results were never written (stopped while writing them) takes no step
    (``trainer.finished``) and writes them."""
    state = {} if checkpoint is None else trainer_state(checkpoint)
    why = None if checkpoint is None else finished_run(trainer, state)
    if why is None:
        return None
    trainer.finished = True
    metrics_file = out / "metrics.json"
    try:
        metrics = read_json(metrics_file)
        step = metrics.get("steps", metrics.get("global_step"))
    except (OSError, ValueError, AttributeError):
        return None
    if not (published and set(expect) <= set(metrics)):  # cut short or edited: written again
        return None
    marker = Path(checkpoint) / MARKER
    older = marker.is_file() and metrics_file.stat().st_mtime < marker.stat().st_mtime
    if step != state.get("global_step") or older:
        return None  # another run's result (an earlier one --overwrite replaces)
    say(
        f"--resume: {out} had finished ({why}); nothing left to train, its results are kept as they were "
        "(a larger limit trains on)"
    )
    return metrics


def write_results(trainer, out: Path, metrics: dict) -> None:
    """A finished run's ``log_history.json``, its curves and, last, ``metrics.json`` (which :func:`kept_result`
    reads back on a ``--resume``); then the marker lists every file the run wrote (``outdir.seal_out``: what makes
    the folder this command's)."""
    from ..accounting.curves import write_curves

    write_json(out / "log_history.json", trainer.state.log_history)
    write_curves(out, metrics)
    write_json(out / "metrics.json", metrics)
    seal_out(out)


def trainer_state(checkpoint: str | Path) -> dict:
    """A checkpoint's ``trainer_state.json`` (empty if unreadable)."""
    try:
        state = read_json(Path(checkpoint) / "trainer_state.json")
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


class WallClockLimit(TrainerCallback, ExportableState):
    """Stops training (with a checkpoint) at the first step end from which the next step and an evaluation (the
    longest seen so far, from ``eval_runtime``) would no longer fit in ``seconds`` of training, so the
    evaluations, the final one included, count in the budget; ``reached`` tells whether it did. The seconds
    used are saved in each checkpoint's trainer state, so a ``--resume`` continues the clock (and a schedule that
    follows it) where it stopped: ``seconds`` bounds the whole run, as ``--max-steps`` does. Distributed ranks
    agree (MAX) so they stop at the same step."""

    def __init__(self, seconds: float):
        self.seconds, self.reached, self._start, self._end = seconds, False, None, None
        self._step_start, self.step_seconds, self.eval_seconds = None, 0.0, 0.0

    def state(self) -> dict:
        """What a checkpoint keeps (``TrainerState.stateful_callbacks``): the seconds used so far, and whether
        they stopped the run (:func:`finished_run`)."""
        return {"args": {"seconds": self.seconds}, "attributes": {"used_seconds": self.used(), "reached": self.reached}}

    def used(self) -> float:
        """Seconds of training so far, those of the runs this one resumes included (0 before train begin; what
        follows train end, e.g. a last scoring of the best model, does not count)."""
        return 0.0 if self._start is None else (self._end or time.monotonic()) - self._start

    def on_train_begin(self, args, state, control, **kwargs):
        saved = state.stateful_callbacks.get(type(self).__name__)  # a resumed run's checkpoint
        before = saved.get("attributes", {}).get("used_seconds") if isinstance(saved, dict) else None
        before = float(before) if isinstance(before, (int, float)) and math.isfinite(before) and before > 0 else 0.0
        self._start, self._end = time.monotonic() - before, None
        state.stateful_callbacks[type(self).__name__] = self.state()  # a checkpoint without this key resumes too

    def on_train_end(self, args, state, control, **kwargs):
        self._end = time.monotonic()

    def spent(self) -> float:
        """The share of ``seconds`` used (0 before train begin), in [0, 1]."""
        return min(1.0, self.used() / self.seconds)

    WARMUP_SHARE = 0.05  # the most of the time the warmup takes: a short run's steps are too few for 100 of warmup

    def lr_factor(self, step: int, warmup_steps: int) -> float:
        """Learning-rate multiplier of a run that this clock ends: linear warmup over ``warmup_steps`` or
        :data:`WARMUP_SHARE` of the time, whichever ends first, then a linear decay to 0 as the time is spent (a
        run stopped by time ends annealed). A 5-minute compress takes ~70-200 steps: with 100 steps of warmup
        its learning rate never reached its peak."""
        spent = self.spent()
        return min(1.0, max((step + 1) / max(1, warmup_steps), spent / self.WARMUP_SHARE)) * (1.0 - spent)

    def on_step_begin(self, args, state, control, **kwargs):
        self._step_start = time.monotonic()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "eval_runtime" in logs:
            self.eval_seconds = max(self.eval_seconds, logs["eval_runtime"])

    def on_step_end(self, args, state, control, **kwargs):
        now = time.monotonic()
        if self._step_start is not None:
            self.step_seconds = now - self._step_start
        needed = self.used() + self.step_seconds + self.eval_seconds
        if any_rank(needed >= self.seconds, args.device) and not control.should_training_stop:
            self.reached = True
            control.should_save = True
            control.should_training_stop = True
        return control
