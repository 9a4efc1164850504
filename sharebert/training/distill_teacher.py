"""A distillation's teacher: its checks (an encoder, the student's tokenizer, a classifier's labels), loaded on the
training device, its logits (cached by its fingerprint) beside a split, and a prepared ``--data``
folder of its tokens."""

from __future__ import annotations

import copy
import hashlib
import os
from pathlib import Path

import torch

from sharebert_runtime.artifact import sha256
from sharebert_runtime.errors import first_line
from sharebert_runtime.outdir import (
    local_rank,
)

from .augment import IGNORE_LABEL
from .glue import GlueTask


def tokenizer_fingerprint(tokenizer) -> tuple[int, str]:
    """``(vocabulary size, sha256 prefix of the token -> id table)``."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    digest = hashlib.sha256("\n".join(f"{t}\t{i}" for t, i in vocab).encode()).hexdigest()[:12]
    return len(vocab), digest


def check_tokenizers(teacher_tok, student_tok, teacher_dir, student_name) -> None:
    """Refuse a student whose token ids mean other tokens than the teacher's."""
    t, s = tokenizer_fingerprint(teacher_tok), tokenizer_fingerprint(student_tok)
    if t != s:
        raise ValueError(
            f"the teacher's tokenizer ({teacher_dir}: {t[0]} tokens, sha256 {t[1]}) differs from the "
            f"student's ({student_name}: {s[0]} tokens, sha256 {s[1]}); distillation needs one tokenizer"
        )


def check_encoder(teacher_dir) -> dict:
    """The teacher's config dict; ``ValueError`` for a model that is not a bidirectional encoder
    (``teacher.read_teacher``: any encoder architecture of transformers)."""
    from .teacher import read_teacher

    return read_teacher(teacher_dir)


def check_teacher_labels(teacher_dir, config, task: GlueTask) -> None:
    """The teacher must be a classifier (or regressor) over exactly the task's labels: told by its ``config`` (its
    transformers config, checked an encoder when it was made: :func:`~.teacher.teacher_config`), not read again."""
    archs = config.architectures or []
    if not any(a.endswith("ForSequenceClassification") for a in archs):
        raise ValueError(
            f"{teacher_dir} is not a sequence classifier (architectures: {', '.join(archs) or 'none'}); "
            f"fine-tune the teacher on {task.name} first (`sharebert finetune`)"
        )
    want = 1 if task.is_regression else task.num_labels
    if config.num_labels != want:
        raise ValueError(f"the teacher in {teacher_dir} has {config.num_labels} labels, task {task.name} has {want}")
    if not task.is_regression:
        names = [config.id2label[i] for i in range(config.num_labels)]
        generic = [f"LABEL_{i}" for i in range(config.num_labels)]
        if names != generic and names != list(task.label_names):
            raise ValueError(
                f"the teacher in {teacher_dir} has labels {names}, task {task.name} has {list(task.label_names)}"
            )


def training_device() -> str:
    """Where this process trains: its own GPU (``LOCAL_RANK`` under torchrun) where CUDA is available, else the
    CPU. The teacher goes there, beside the student the Trainer places."""
    if not torch.cuda.is_available():
        return "cpu"
    return f"cuda:{local_rank()}"


def load_teacher(teacher_dir, head: str = "classifier", config=None):
    """The teacher through the transformers Auto classes (sharebert folders included): eval mode, no gradients.
    ``head``: ``classifier``, ``mlm`` or ``encoder`` (the backbone alone: hidden and attention terms only).
    ``config``: its transformers config where the caller made it already (a copy is loaded with; the folder's
    ``config.json`` is then not read again).

    On a CUDA device with bf16 support it is loaded in bf16 (the student's losses are computed in fp32).
    """
    from transformers import AutoModel, AutoModelForMaskedLM, AutoModelForSequenceClassification

    import sharebert.model.modeling_sharebert  # noqa: F401  (registers the sharebert Auto classes)

    cls = {"classifier": AutoModelForSequenceClassification, "mlm": AutoModelForMaskedLM, "encoder": AutoModel}[head]
    cuda = torch.cuda.is_available()
    dtype = torch.bfloat16 if cuda and torch.cuda.is_bf16_supported() else torch.float32
    try:
        given = {} if config is None else {"config": copy.deepcopy(config)}
        model = cls.from_pretrained(teacher_dir, dtype=dtype, attn_implementation="eager", **given)
    except (OSError, ValueError) as e:
        raise ValueError(f"--teacher {teacher_dir} cannot be loaded: {first_line(e)}") from None
    model.requires_grad_(False)
    from .teacher import accept_known_inputs

    accept_known_inputs(model)
    return model.to(training_device()).eval()


def logits_cache(cache_dir, teacher: list[str], split_path, seq_len: int, rows: int, variant: str = "") -> Path:
    """Where the teacher's logits on a split are kept: ``<cache_dir>/<key>.npy``, the key hashing the teacher's files
    (``teacher``: its ``fingerprint.teacher_fingerprint``, made once per run), the split file, ``seq_len``, the
    ``rows`` scored and ``variant`` (how the split was augmented; "" for none)."""
    parts = list(teacher) + [sha256(Path(split_path)), str(seq_len), str(rows)]
    parts += [variant] if variant else []
    return Path(cache_dir) / (hashlib.sha256("|".join(parts).encode()).hexdigest()[:24] + ".npy")


def teacher_logits(teacher, ds, cache: Path | None = None, progress: bool = True):
    """The teacher's logits on ``ds`` (N, labels); with ``cache`` (:func:`logits_cache`) read from / written to
    that file."""
    import numpy as np

    from .encoded import predict_logits

    if cache is None:
        return predict_logits(teacher, ds, progress=progress)
    path = cache
    if path.is_file():
        try:
            logits = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError):  # a damaged cache file: recomputed and replaced below
            logits = None
        if logits is not None and logits.shape[0] == len(ds) and np.isfinite(logits).all():
            return logits
    logits = predict_logits(teacher, ds, progress=progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp-{os.getpid()}.npy")  # two runs writing one key never share a half-written file
    np.save(tmp, logits)
    tmp.replace(path)
    return logits


class WithTeacherLogits(torch.utils.data.Dataset):
    """A tokenized split whose items also carry the teacher's logits (``"teacher_logits"``). ``agreed``: a
    classification item's gold label only where the teacher's own answer is that label (elsewhere
    ``IGNORE_LABEL``: the item teaches by the teacher's logits alone)."""

    def __init__(self, ds, logits, agreed: bool = False):
        self.ds, self.logits, self.agreed = ds, logits, agreed

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> dict:
        item = {**self.ds[i], "teacher_logits": self.logits[i].tolist()}
        if self.agreed and item["labels"] != IGNORE_LABEL and item["labels"] != int(self.logits[i].argmax()):
            item["labels"] = IGNORE_LABEL
        return item


def teacher_data(data, t_tok, teacher_dir) -> dict:
    """The manifest of a prepared ``data`` folder (``shards.read_manifest``: checksum, shard sizes and sha256,
    ids below the vocabulary), refused unless it was prepared with the teacher's tokenizer ``t_tok``."""
    from .shards import read_manifest, vocab_sha256

    manifest = read_manifest(data)
    if manifest["tokenizer"]["vocab_sha256"] != vocab_sha256(t_tok):
        raise ValueError(
            f"--data {data} was prepared with another tokenizer than the teacher's (vocab sha256 "
            f"{manifest['tokenizer']['vocab_sha256'][:12]} vs {vocab_sha256(t_tok)[:12]}); prepare it "
            f"with --tokenizer {teacher_dir}"
        )
    return manifest


def teacher_blocks(data, manifest: dict, t_tok, seq_len: int, limit: int | None = None):
    """The first ``limit`` (all when None) training sequences of a prepared folder, memory-mapped
    (``shards.StreamBlocks``): ``[CLS] + (seq_len - 2) tokens + [SEP]`` each, read on demand."""
    from .shards import StreamBlocks, TokenStream

    stream = TokenStream(data, manifest, "train")
    total = StreamBlocks.sequences(stream, seq_len, True)
    return StreamBlocks(
        stream, seq_len, count=min(total, limit or total), cls_id=t_tok.cls_token_id, sep_id=t_tok.sep_token_id
    )
