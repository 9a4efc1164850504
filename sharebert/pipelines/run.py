"""What a compress run knows, passed as one object instead of parameter lists: the user's options
(:class:`CompressOptions`: the command's flags), the teacher read once (:class:`Teacher`: its ``config.json`` read and
checked once, its transformers config, tokenizer, recipe and fingerprint made from that read when first asked), the
student the limits pick (:class:`Student`) and the run itself (:class:`CompressRun`: options, teacher, the checked
``--out``, how it speaks and stops, its time budget). Torch-free at import: ``plan.precheck`` builds the run before
any model loads."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any


@dataclass
class CompressOptions:
    """What the user asked of ``sharebert compress`` (the command's flags, ``commands/compress.py``)."""

    teacher: Path
    out: Path
    limits: dict  # --max-params / --max-bytes / ... (``budget.student_for``)
    args: Any  # EmbeddingArgs: the embedding distillation (a classifier's general phase)
    task_args: Any = None  # DistillArgs: a classifier's task phase (its max_eval_samples bounds the report's dev rows)
    task: str | None = None
    train: list | None = None
    data: Path | None = None
    eval_pairs: Path | None = None
    overwrite: bool = False
    resume: bool = False
    progress: bool = True
    portable: bool = True
    keep_work: bool = False
    vocab_size: int | None = None
    web: bool = False  # also out/web: the student as transformers.js loads it
    max_eval_samples: int | None = None  # tests and the docs check only: the quality measures' first N (none: all)


class Teacher:
    """A teacher folder whose ``config.json`` is read and checked once (``model_folder.read_config``, any model
    type): what the run needs of it is made from that read when first asked, and kept."""

    def __init__(self, folder: Path, raw: dict):
        self.folder, self.raw = Path(folder), raw

    @classmethod
    def read(cls, folder) -> Teacher:
        from ..formats.model_folder import read_config

        return cls(Path(folder), read_config(folder, model_types=None))

    @property
    def is_classifier(self) -> bool:
        """Whether it is a sequence classifier (``...ForSequenceClassification``)."""
        return any(a.endswith("ForSequenceClassification") for a in self.raw.get("architectures") or [])

    def check_encoder(self) -> dict:
        """Its config dict; ``ValueError`` for a model that is not a bidirectional encoder
        (``teacher.check_teacher``)."""
        from ..training.teacher import check_teacher

        return check_teacher(self.raw, self.folder / "config.json")

    @cached_property
    def config(self):
        """Its transformers config, built from the one read (``teacher.teacher_config``)."""
        from ..training.teacher import teacher_config

        return teacher_config(self.folder, self.check_encoder())

    @cached_property
    def shape(self) -> dict:
        """What ``budget.student_for`` reads of it (``teacher.teacher_shape``)."""
        from ..training.teacher import teacher_shape

        return teacher_shape(self.folder, self.config)

    @cached_property
    def tokenizer(self):
        from ..training.teacher import teacher_tokenizer

        return teacher_tokenizer(self.folder, self.config)

    @cached_property
    def recipe(self):
        """Its sentence-transformers recipe (``formats.recipe``; the default one without ``modules.json``)."""
        from ..formats.recipe import read_recipe

        return read_recipe(self.folder, self.raw)

    @cached_property
    def max_length(self) -> int:
        """The tokens it reads: its recipe's ``max_seq_length``, else its position embeddings; never more than its
        position embeddings."""
        positions = int(self.raw.get("max_position_embeddings", 512))
        return min(self.recipe.max_seq_length or positions, positions)

    @cached_property
    def fingerprint(self) -> list[str]:
        """Its files' hashes (``fingerprint.teacher_fingerprint``): the caches' keys and ``--resume``'s check."""
        from ..training.fingerprint import teacher_fingerprint

        return teacher_fingerprint(self.folder)


@dataclass
class Student:
    """The student the limits pick: the budget's candidate (``cand``, ``head``: its output projection's or
    classifier's parameters), its config overrides, its vocabulary cut (None: the teacher's whole), and the
    distillation's options (``args``: it reads what its teacher reads)."""

    cand: Any
    head: int
    overrides: dict
    vocab: Any
    args: Any


@dataclass
class CompressRun:
    """One compress run: its options, its teacher (read once), ``out`` as checked (absolute), ``say`` for its lines,
    ``stopper`` (a ``SignalCheckpoint``: SIGTERM/SIGINT save a checkpoint) and ``budget`` (a ``TimeBudget``:
    ``--max-time`` for the whole command; None: ``args.max_time`` bounds the training alone)."""

    options: CompressOptions
    teacher: Teacher
    out: Path
    say: Callable = field(default=print)
    stopper: Any = None
    budget: Any = None

    def stopped(self) -> bool:
        """Whether SIGINT/SIGTERM stopped the run (its checkpoint is saved)."""
        return self.stopper is not None and self.stopper.received is not None

    def callbacks(self) -> tuple:
        """The Trainer callbacks every training phase takes: the stopper, where there is one."""
        return (self.stopper,) if self.stopper is not None else ()
