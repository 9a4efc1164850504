"""An embedding distillation's set-up before the teacher's pass: its options and inputs checked, the teacher read
(recipe, config, tokenizer), the student built and started from the teacher, and what the run trains on (kept
with its checkpoints for ``--resume``)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from ..formats.model_folder import load_config, load_tokenizer
from ..model.modeling_sharebert import TORCH_POOLING
from .arguments import EMBEDDING_LOSSES, STUDENT_DROPOUT, EmbeddingArgs
from .depth_table import check_depth_sampling
from .distill_sentences import sts_dev
from .distill_teacher import (
    check_encoder,
    check_tokenizers,
    teacher_data,
    training_device,
)


def check_data(data, train, t_tok, teacher_dir) -> dict | None:
    """The manifest of the prepared ``data`` folder (``distill.teacher_data``: complete, intact, the teacher's
    tokenizer), None without one; ``ValueError`` for ``--data`` together with ``--train``."""
    if data is None:
        return None
    if train:
        raise ValueError("--data and --train are alternatives: give the prepared folder or the text files, not both")
    return teacher_data(data, t_tok, teacher_dir)


def check_cut(vocab, manifest, weights, student_folder: bool):
    """The cut vocabulary's tokenizer, for a run that can use it: the student's inputs are its own tokens and the
    teacher's targets come from the teacher's tokens of the same sentences, so only sentence vectors of --train text."""
    if manifest is not None or student_folder or weights.hidden or weights.embedding or weights.attention:
        raise ValueError(
            "a cut vocabulary trains a new student on --train text with sentence vectors only (no --data, "
            "no student folder, no token-level terms): the teacher reads other tokens than the student"
        )
    return vocab.tokenizer


def build_student(student: str, overrides: dict, vocab_size: int):
    """A fresh ``ShareBertModel`` from a preset (``overrides``: ``--set``) with the teacher's vocabulary size,
    no dropout (``options.STUDENT_DROPOUT``) and no pooler (the sentence vector is pooled from the token
    states), or a model folder's backbone."""
    from ..model.configuration_sharebert import ShareBertConfig
    from ..model.modeling_sharebert import ShareBertModel
    from ..model.shape import PRESETS

    if Path(student).exists():
        from ..formats.model_folder import load_model

        if overrides:
            raise ValueError("--set shapes a new student from a preset; a model folder keeps its own shape")
        config = load_config(student)
        if config.vocab_size != vocab_size:
            raise ValueError(
                f"the student {student} has vocab_size {config.vocab_size}, the teacher "
                f"{vocab_size}: they do not share a tokenizer"
            )
        return load_model(ShareBertModel, student, config)[0]
    if student not in PRESETS:
        raise ValueError(f"--student {student} is neither a model folder nor a preset ({', '.join(PRESETS)})")
    fields = {"pooler": "none", **STUDENT_DROPOUT, **overrides, "vocab_size": vocab_size}
    if overrides.get("vocab_size", vocab_size) != vocab_size:
        raise ValueError(
            f"--set vocab_size={overrides['vocab_size']}: the student takes the teacher's vocabulary "
            f"({vocab_size} tokens)"
        )
    return ShareBertModel(ShareBertConfig.from_preset(student, **fields))


@dataclass
class _Teacher:
    """The teacher's side of a run: its folder's recipe and tokenizer, then its encoder and frozen Dense head."""

    dir: object
    recipe: object
    config: object
    tokenizer: object
    model: nn.Module | None = None
    head: nn.Module | None = None
    files: list | None = None  # its files' hashes (``fingerprint.teacher_fingerprint``): made once, when first needed
    artifact: Path | None = None  # its ONNX artifact (compress exports one), for the pass over the training sentences
    vectors: object = None  # its pass (``teacher_vectors.TeacherPass``), once the run's length is known

    @property
    def width(self) -> int:
        """The width of the teacher's sentence vectors: its last Dense layer's, else its hidden size."""
        return self.recipe.dense[-1].out_features if self.recipe.dense else self.model.config.hidden_size


@dataclass
class _EmbeddingRun:
    """One embedding distillation as its steps read it, passed instead of their parameter lists: the call's options
    (``distill_embedding``'s keywords), the teacher, and what the run made before its training sentences (the
    student, the tokenizer it reads, its projections onto the teacher, the length both read)."""

    args: EmbeddingArgs
    teacher: _Teacher
    student: str  # a preset's name or a model folder
    student_folder: bool
    overrides: dict  # --set, shaping a preset
    vocab: object  # a ``vocab.CutVocabulary`` the student speaks, or None (the teacher's tokens)
    out: Path
    start_from: str | None  # the checkpoint a --resume continues from
    progress: bool
    budget: object  # compress's ``plan.TimeBudget``, or None
    callbacks: tuple
    model: nn.Module  # the student
    s_tok: object  # the student's tokenizer
    projections: nn.Module  # ``EmbeddingProjections``
    seq_len: int


def _check_args(args: EmbeddingArgs, score_sts: bool, eval_limit: int | None) -> None:
    """``ValueError`` for an option no run can take, before anything is read or made."""
    if score_sts and eval_limit is not None and eval_limit < 2:
        raise ValueError(
            f"a Spearman correlation needs at least 2 STS-B dev pairs; --max-eval-samples / --eval-limit "
            f"is {eval_limit}"
        )
    if args.loss not in EMBEDDING_LOSSES:
        raise ValueError(f"--loss {args.loss!r}: choose one of {', '.join(EMBEDDING_LOSSES)}")
    if args.init not in ("teacher", "random"):
        raise ValueError(f"--init {args.init!r}: choose teacher or random")


def _read_teacher(teacher_dir, read=None) -> _Teacher:
    """The teacher folder's recipe, config and tokenizer (any encoder architecture: ``training.teacher``), all taken
    from ``read`` where the caller has read the folder (compress: its ``pipelines.run.Teacher``, whose
    ``config.json`` is read and checked once and its files hashed once); ``ValueError`` for a folder that is no
    encoder or pools in a way the loss does not."""
    from ..formats.recipe import read_recipe
    from .teacher import teacher_config, teacher_tokenizer

    if read is not None:
        read.check_encoder()
        _check_pooling(read.recipe)
        return _Teacher(teacher_dir, read.recipe, read.config, read.tokenizer, files=read.fingerprint)
    check_encoder(teacher_dir)
    recipe = read_recipe(teacher_dir)
    _check_pooling(recipe)
    config = teacher_config(teacher_dir)
    return _Teacher(teacher_dir, recipe, config, teacher_tokenizer(teacher_dir, config))


def _check_pooling(recipe) -> None:
    if recipe.pooling not in TORCH_POOLING:  # the loss pools the student in torch, as the teacher pools
        raise ValueError(
            f"the teacher pools by {recipe.pooling!r}; embedding distillation supports {', '.join(TORCH_POOLING)}"
        )


def _new_student(student: str, overrides: dict, args: EmbeddingArgs, t: _Teacher, vocab):
    """The seeded student (:func:`build_student`) with its depth sampling; a student folder must read the
    teacher's tokens."""
    from transformers import set_seed

    set_seed(args.seed)
    model = build_student(student, overrides, t.config.vocab_size if vocab is None else vocab.table_rows)
    model.config.train_min_depth = check_depth_sampling(args.depth_sampling, model.config.num_hidden_layers)
    if Path(student).exists():
        check_tokenizers(t.tokenizer, load_tokenizer(student, model.config.vocab_size), t.dir, student)
    return model


def _init_student(model, t: _Teacher, projections, init: str, student_folder: bool, vocab) -> dict:
    """A new student started from the teacher's weights (``student_init``) under ``--init teacher``; what it
    was started from, for the metrics."""
    if init != "teacher" or student_folder:
        return {"init": "random"}
    from .student_init import init_from_teacher

    return init_from_teacher(
        model, t.model, projections.head if t.head is None else None, rows=None if vocab is None else vocab.kept
    )


def _teacher_to_device(t: _Teacher) -> None:
    """The teacher's passes (targets, terms) run on the GPU, where there is one."""
    device = training_device()
    t.model.to(device)
    if t.head is not None:
        t.head.to(device)


def _trained_on(r: _EmbeddingRun, train_ds, sentences, manifest) -> dict:
    """What the run trains on and from, kept with its checkpoints (``distill.check_same_data``)."""
    seen = (
        "\n".join(sentences) if manifest is None else f"{json.dumps(manifest, sort_keys=True, default=str)}|{r.seq_len}"
    )
    return {
        "sentences": len(train_ds),
        "sentences_sha256": hashlib.sha256(f"{len(train_ds)}|{seen}".encode()).hexdigest()[:16],
        "student": (str(Path(r.student).resolve()) if r.student_folder else r.student)
        + "".join(f" --set {k}={v}" for k, v in sorted(r.overrides.items())),
    }


def _start_metrics(r: _EmbeddingRun, init: dict, examples: int, score_sts: bool, eval_limit: int | None, data) -> dict:
    """The metrics known before training: the recipe, the student, its start and the data."""
    t, vocab = r.teacher, r.vocab
    return {
        "objective": "embedding",
        "loss": r.args.loss,
        "pooling": t.recipe.pooling,
        "normalize": t.recipe.normalize,
        "teacher_dir": str(t.dir),
        "student": r.student,
        **init,
        "seq_len": r.seq_len,
        "train_sentences": examples,
        "sts_dev_pairs": len(sts_dev(eval_limit).labels) if score_sts else None,
        **({"train_data": str(data)} if data is not None else {}),
        **({"vocabulary": vocab.as_dict()} if vocab is not None else {}),
    }
