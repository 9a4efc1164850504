"""One training run's skeleton, shared by ``finetune``, ``distill`` (task, general, embedding) and ``pretrain``.

Every training command runs the same phases; each supplies only what differs (its folder's :class:`RunKind`, its
model, data, ``Trainer`` and what it publishes):

1. :func:`open_run`: ``--out`` checked before any work (``outdir.check_out_dir``: a folder is the command's by its
   marker; one that only looks like its result is refused).
2. :meth:`TrainingRun.resume`: the checkpoint a ``--resume`` continues (finetune takes it under its lock).
3. :meth:`TrainingRun.start`: once every input is checked, a ``--resume`` of another run refused (its fingerprint),
   then ``--out`` marked the command's.
4. :meth:`TrainingRun.kept`, :meth:`TrainingRun.train`: a resumed run that had finished keeps its results; otherwise
   an earlier run's checkpoints are cleared and the ``Trainer`` trains from the resumed checkpoint.
5. :meth:`TrainingRun.publish`: after the command saved its model in ``--out``, the results (log, curves,
   ``metrics.json``) and the marker sealed; the checkpoints dropped unless kept.

Pretraining differs in two phases, kept in ``pretrain.py``: its checkpoints live in ``--out`` itself (a missing one
restarts from step 0 rather than refusing), and it publishes through a temporary folder with a signal-stopped run
left unsealed. The lock is the command's (``run_lock``), or the library function's where it has none above it.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sharebert_runtime.outdir import check_out_dir, check_same_run, finite, made_by, mark_out

from .callbacks import (
    NonFiniteLoss,
    finite_weights,
    kept_result,
    latest_checkpoint,
    resume_from,
    start_checkpoints,
    write_results,
)


@dataclass(frozen=True)
class RunKind:
    """What a command's ``--out`` is: ``what`` names it in errors ("fine-tuning result"), ``command`` is its marker's
    (``outdir.MARK``), ``legacy`` tells a folder that looks like its result without the marker (refused, never
    replaced), ``checkpoints`` is the sub-folder the Trainer saves into ("": ``--out`` itself)."""

    what: str
    command: str
    legacy: Callable[[Path], bool]
    checkpoints: str = "checkpoints"

    def is_ours(self, path: Path) -> bool:
        """``path`` carries this command's marker."""
        return made_by(self.command)(path)


@dataclass
class TrainingRun:
    """One run of a training command: its kind, its checked ``--out``, the checkpoint it resumes (None: a new run)
    and whether its checkpoints stay once the result is published."""

    kind: RunKind
    out: Path
    start_from: Path | None = None
    keep_checkpoints: bool = True

    @property
    def checkpoints(self) -> Path:
        return self.out / self.kind.checkpoints

    def resume(self, resume: bool) -> Path | None:
        """The newest complete checkpoint with ``resume`` (``ValueError`` when there is none); None without."""
        self.start_from = resume_from(self.checkpoints, resume, out=self.out)
        return self.start_from

    def start(self, fingerprint: dict, resume: bool | None = None, restart: str | None = None) -> None:
        """Before the run's first write: a resume of another run refused (``restart``: how the command starts
        afresh instead), then ``out`` marked the command's. ``resume``: default, whether a checkpoint is resumed."""
        if self.start_from is not None if resume is None else resume:
            check_same_run(self.out, fingerprint, **({"restart": restart} if restart else {}))
        mark_out(self.out, self.kind.command, fingerprint)

    def kept(self, trainer, expect=(), **kwargs) -> dict | None:
        """The results a resumed run that had finished wrote (holding every key of ``expect``), kept as they are;
        None: train (``callbacks.kept_result``, whose keywords ``kwargs`` passes on)."""
        return kept_result(trainer, self.start_from, self.out, expect=expect, **kwargs)

    def train(self, trainer):
        """A new run's folder cleared of an earlier run's checkpoints, then ``trainer.train`` from the resumed
        checkpoint: its ``TrainOutput``; :class:`~.callbacks.NonFiniteLoss` when the trained weights are NaN or
        inf."""
        start_checkpoints(self.checkpoints, self.start_from)
        result = trainer.train(resume_from_checkpoint=str(self.start_from) if self.start_from else None)
        if not finite_weights(trainer.model):  # a last update that blew up with every loss finite: never published
            raise NonFiniteLoss(trainer.state.global_step, None, latest_checkpoint(self.checkpoints))
        return result

    def publish(self, trainer, metrics: dict) -> dict:
        """Once the command saved its model in ``out``: on the main process the results written and the marker
        sealed (``callbacks.write_results``), the checkpoints dropped unless kept. The metrics, NaN as None."""
        metrics = finite(metrics)
        if trainer.is_world_process_zero():
            write_results(trainer, self.out, metrics)
            if not self.keep_checkpoints:
                shutil.rmtree(self.checkpoints, ignore_errors=True)
        return metrics


def open_run(kind: RunKind, out, inputs=(), replace: bool = False, keep_checkpoints: bool = True) -> TrainingRun:
    """``out`` checked for ``kind`` (``replace``: an earlier result there may be replaced, with ``--overwrite`` or
    ``--resume``; ``inputs``: the paths the run reads, which ``out`` must not hold)."""
    out = check_out_dir(out, kind.what, kind.is_ours, replace, inputs=inputs, legacy=kind.legacy)
    return TrainingRun(kind, out, keep_checkpoints=keep_checkpoints)


def best_step(trainer) -> int:
    """The step of the checkpoint the Trainer kept as best (the last step without one)."""
    best = trainer.state.best_model_checkpoint
    return int(best.rsplit("-", 1)[1]) if best else trainer.state.global_step
