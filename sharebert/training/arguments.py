"""The training and evaluation commands' options and defaults, torch-free, so that ``sharebert <command>
--help`` and argument errors answer before torch is imported (the commands' ``add_arguments`` read
them). One home for each default: the training modules import these classes from here.

``PretrainArgs`` (``pretrain``), ``FinetuneArgs`` (``finetune``), ``DistillWeights`` and ``DistillArgs``
(``distill``), and the evaluation choices ``NOISE_LEVELS``, ``WORDSIM_SETS``, ``MULTI_TOKEN``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields


@dataclass
class PretrainArgs:
    """The reference recipe; every field is a ``sharebert pretrain`` option. The reference batch is
    4000 sequences for 23k steps: reach it with ``batch_size`` x ``grad_accum`` x processes."""

    objective: str = "mlm"  # mlm | clm
    char_level: bool = False
    max_steps: int = 23000
    # seconds of training (the whole run: a --resume goes on from the seconds its checkpoint kept) before stopping
    max_time: float | None = None
    batch_size: int = 32  # per process
    grad_accum: int = 1
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-6
    weight_decay: float = 0.01
    max_grad_norm: float = 0.5
    warmup_ratio: float = 0.06
    seq_len: int | None = None  # None: 128 (capped by the model), or the model's block size when char_level
    mlm_probability: float = 0.15
    valid_fraction: float = 0.1  # held out from the end of the train stream when no valid files are given
    max_eval_sequences: int | None = 2048  # --eval-samples: validation sequences scored (None: all)
    eval_on_start: bool = False  # also score the untrained model at step 0
    save_steps: int = 1000
    save_minutes: float | None = (
        10.0  # also a checkpoint at least this often (minutes of training); None or 0: none by time
    )
    eval_steps: int = 1000
    logging_steps: int = 50
    keep_checkpoints: int | None = 3
    precision: str = "auto"  # auto (bf16/fp16 on CUDA, fp32 on CPU) | fp32 | bf16 | fp16
    seed: int = 0
    depth_sampling: int | None = None  # train_min_depth: each training forward runs a depth from MIN..N
    convert_to_sharebert: bool = False  # a transformers BERT folder is saved as BERT unless this asks for ShareBERT
    resume: bool = False
    progress: bool = True
    dataloader_workers: int = 0
    overrides: dict = field(default_factory=dict)  # config fields for a preset build


@dataclass(frozen=True)
class FinetuneArgs:
    """The reference recipe; every field is a ``sharebert finetune`` option."""

    epochs: float = 5.0
    batch_size: int = 64
    lr: float = 5e-5
    warmup_steps: int = 50
    weight_decay: float = 0.01
    seq_len: int = 128
    max_steps: int | None = None
    max_train_samples: int | None = None
    max_eval_samples: int | None = None
    eval_steps: int | None = None  # None: score the dev set after every epoch
    save_minutes: float | None = (
        10.0  # a checkpoint at least this often (minutes of training); None or 0: no time saves
    )
    seed: int = 0
    depth_sampling: int | None = None  # train_min_depth: each training forward runs a depth from MIN..N
    convert_to_sharebert: bool = False  # a transformers BERT folder is saved as BERT unless this asks for ShareBERT


@dataclass(frozen=True)
class DistillWeights:
    """Weight of each loss term and the softmax temperature (every field is a ``sharebert distill`` option)."""

    temperature: float = 2.0
    kl: float = 1.0
    hard: float = 1.0
    hidden: float = 1.0
    attention: float = 1.0
    embedding: float = 1.0
    layer_map: tuple[tuple[int, int], ...] | None = None  # (student iteration, teacher layer), 1-based

    def __post_init__(self):
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ValueError(f"--temperature must be a positive number, got {self.temperature}")
        for name in ("kl", "hard", "hidden", "attention", "embedding"):
            w = getattr(self, name)
            if not (w >= 0 and math.isfinite(w)):
                raise ValueError(f"--{name}-weight must be a finite number >= 0, got {w}")

    def check_teaches(self) -> None:
        """``ValueError`` when every term is 0 (task and general distillation learn from these terms alone; the
        embedding objective adds its own sentence loss, so it does not call this)."""
        if not any(getattr(self, name) for name in ("kl", "hard", "hidden", "attention", "embedding")):
            raise ValueError(
                "every loss weight is 0 (--kl-weight, --hard-weight, --hidden-weight, --attention-weight, "
                "--embedding-weight): the student would learn nothing; give at least one a weight > 0"
            )


def parse_layer_map(text: str | None) -> tuple[tuple[int, int], ...] | None:
    """``"1:3,2:6"`` -> ``((1, 3), (2, 6))`` (student iteration : teacher layer)."""
    if not text:
        return None
    try:
        pairs = tuple(tuple(int(x) for x in item.split(":")) for item in text.split(","))
    except ValueError:
        pairs = ((),)
    if any(len(p) != 2 for p in pairs):
        raise ValueError(f"--layer-map {text!r}: expected STUDENT:TEACHER pairs like 1:3,2:6")
    return pairs


@dataclass(frozen=True)
class DistillArgs(FinetuneArgs):
    """The fine-tuning recipe plus the distillation losses and, for a task, its augmentation."""

    weights: DistillWeights = field(default_factory=DistillWeights)
    augment: int = 0  # --objective glue: perturbed copies of each training example, taught by the teacher's logits


EMBEDDING_LOSSES = ("cosine", "mse")  # the sentence-vector losses of embedding distillation
# Strings of the student's vocabulary words per training sentence (``corpus.with_word_strings``), compress's default:
# search top-1 agreement 0.971 vs 0.800 without, held-out cosine 0.558 vs 0.540 (400 steps, docs/RESULTS.md).
WORD_STRINGS = 1.0
EMBEDDING_LOSS = "cosine"  # its default: STS-B dev 0.8025 vs mse 0.7784, same run otherwise (docs/DISTILLATION.md)


@dataclass(frozen=True)
class EmbeddingArgs(DistillArgs):
    """The distillation recipe plus the embedding loss; token-level terms are off unless asked for."""

    loss: str = EMBEDDING_LOSS
    init: str = "teacher"  # or "random"
    words: float = 0.0  # strings of the student's vocabulary words per training sentence (``corpus.with_word_strings``)
    max_time: float | None = None  # seconds of training (a checkpoint, then the student is saved)


# A student built from a preset for embedding distillation trains without dropout (``--set`` overrides it):
# STS-B dev 0.8183 vs 0.8025 with the presets' 0.1, the same 1,500-step run otherwise (docs/RESULTS.md).
STUDENT_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}

NOISE_LEVELS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4)
WORDSIM_SETS = {  # name -> (path inside data/wordsim, word1 field, word2 field, score field)
    "wordsim353": ("wordsim353/wordsim353.tsv", 0, 1, 2),
    "simlex999": ("simlex999/simlex999.txt", 0, 1, 2),
    "scws": ("SCWS/ratings.txt", 1, 3, 7),
}
MULTI_TOKEN = ("mean", "first", "skip")  # how a word that WordPiece splits gets a vector


def from_options(cls, options, **given):
    """A ``cls`` (one of the dataclasses above) from a command's parsed ``options``: every field that an option of
    the same name sets, then ``given``: the fields an option sets through a conversion, or none sets."""
    named = {f.name: getattr(options, f.name) for f in fields(cls) if hasattr(options, f.name)}
    return cls(**(named | given))
