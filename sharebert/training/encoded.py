"""Tokenized GLUE splits and what is computed over them: logits, the task's metrics (fine-tuning and evaluation).

``EncodedSplit`` is a torch ``Dataset`` of tokenized examples; ``evaluate_split`` scores a classifier
on one, mapping the model's classes onto the task's by label name.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..formats.bars import bar
from .glue import COLLAPSE, GlueSplit, GlueTask
from .metrics import predictions_from_logits, task_metrics


class EncodedSplit(torch.utils.data.Dataset):
    """Tokenized examples: ``{"input_ids", "token_type_ids", "attention_mask", "labels"}`` per item."""

    def __init__(self, encodings: dict[str, list], labels: list):
        self.encodings, self.labels = encodings, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        item = {k: v[i] for k, v in self.encodings.items()}
        item["labels"] = self.labels[i]
        return item


def encode(split: GlueSplit, tokenizer, seq_len: int, chunk: int = 8192, progress: bool = True) -> EncodedSplit:
    """Tokenize (pairs for two-sentence tasks), truncated to ``seq_len`` tokens; padding happens per batch."""
    enc: dict[str, list] = {}
    starts = range(0, len(split), chunk)
    for s in bar(starts, desc=f"tokenize {split.path.name}", progress=progress and len(starts) > 1, leave=False):
        a = split.text_a[s : s + chunk]
        b = split.text_b[s : s + chunk] if split.text_b is not None else None
        out = tokenizer(a, b, truncation=True, max_length=seq_len)
        for k, v in out.items():
            enc.setdefault(k, []).extend(v)
    return EncodedSplit(enc, list(split.labels))


def encoded_task(  # 7: the task's files and tokenizer, then the two --max-*-samples and progress, as keywords
    task: GlueTask,
    data_dir,
    tokenizer,
    seq_len: int,
    max_train: int | None = None,
    max_eval: int | None = None,
    progress: bool = True,
) -> tuple[GlueSplit, EncodedSplit, dict]:
    """A task's train split (read and encoded) and its dev splits ``{name: EncodedSplit}``, every file read
    and checked before any training starts; a classification train split of one class is refused."""
    from .glue import read_split

    train = read_split(task, data_dir, "train").head(max_train)
    devs = {s: read_split(task, data_dir, s).head(max_eval) for s in task.dev_splits}
    if not task.is_regression and len(set(train.labels)) < 2:
        raise ValueError(f"{train.path}: the training examples hold a single class; nothing to learn")
    return (
        train,
        encode(train, tokenizer, seq_len, progress=progress),
        {s: encode(d, tokenizer, seq_len, progress=progress) for s, d in devs.items()},
    )


def _batches(ds: EncodedSplit, batch_size: int, pad_id: int, device, order):
    """Padded tensors ``(B, T)`` per batch of the examples ``order`` lists, in that order."""
    keys = [k for k in ("input_ids", "token_type_ids", "attention_mask") if k in ds.encodings]
    for s in range(0, len(ds), batch_size):
        rows = {k: [ds.encodings[k][i] for i in order[s : s + batch_size]] for k in keys}
        T = max(len(r) for r in rows["input_ids"])
        fill = {"input_ids": pad_id, "token_type_ids": 0, "attention_mask": 0}
        yield {k: torch.tensor([r + [fill[k]] * (T - len(r)) for r in v], device=device) for k, v in rows.items()}


@torch.no_grad()
def predict_logits(  # 8: the model and split, then keywords with defaults (the noise: level, norm, seed)
    model,
    ds: EncodedSplit,
    batch_size: int = 64,
    noise: float = 0.0,
    mean_norm: float | None = None,
    seed: int = 0,
    progress: bool = True,
    depth: int | None = None,
) -> np.ndarray:
    """Logits ``(N, num_labels)`` in dataset order; with ``noise > 0`` Gaussian noise is added to the input
    embeddings (batches in dataset order, so a seed draws the same noise); without, batches run sorted by length
    (less padding: the teacher's pass over a training set is several times faster). ``depth``: run only the
    first ``depth`` encoder layers (a sharebert model; None: all)."""
    model.eval()
    device = next(model.parameters()).device
    embed = model.get_input_embeddings()
    gen = torch.Generator().manual_seed(seed)
    ids = ds.encodings["input_ids"]
    order = np.arange(len(ids)) if noise > 0 else np.argsort([len(r) for r in ids], kind="stable")
    out = []
    for batch in bar(
        _batches(ds, batch_size, model.config.pad_token_id or 0, device, order),
        total=math.ceil(len(ds) / batch_size),
        desc="evaluate",
        progress=progress,
        leave=False,
    ):
        if noise > 0:
            x = embed(batch.pop("input_ids"))
            sigma = noise * mean_norm / math.sqrt(x.shape[-1])
            batch["inputs_embeds"] = x + sigma * torch.randn(x.shape, generator=gen).to(x)
        out.append(model(**batch, **({} if depth is None else {"depth": depth})).logits.float().cpu())
    logits = torch.cat(out).numpy()
    unsorted = np.empty_like(logits)
    unsorted[order] = logits
    return unsorted


@torch.no_grad()
def mean_embedding_norm(model, ds: EncodedSplit) -> float:
    """Mean L2 norm of the input embeddings of every real token of ``ds``."""
    weight = model.get_input_embeddings().weight.float()
    ids = torch.tensor([i for row in ds.encodings["input_ids"] for i in row], device=weight.device)
    return float(weight[ids].norm(dim=-1).mean())


def label_map(model_config, task: GlueTask) -> np.ndarray:
    """``map[model_class] -> task_class`` by label names; ValueError when the label spaces differ."""
    if task.is_regression or model_config.num_labels == 1:
        if task.is_regression and model_config.num_labels == 1:
            return np.zeros(1, dtype=np.int64)
        raise ValueError(
            f"a {model_config.num_labels}-label model cannot be scored on {task.name} "
            f"({'regression' if task.is_regression else 'classification'})"
        )
    names = [model_config.id2label[i] for i in range(model_config.num_labels)]
    mapped = [COLLAPSE.get(n, n) if n not in task.label_names else n for n in names]
    if not all(m in task.label_names for m in mapped):
        raise ValueError(f"the model's labels {names} are not {task.name}'s label space {list(task.label_names)}")
    return np.array([task.label_names.index(m) for m in mapped])


def evaluate_split(  # 9: predict_logits' keywords, passed through, and the task
    model,
    ds: EncodedSplit,
    task: GlueTask,
    batch_size: int = 64,
    noise: float = 0.0,
    mean_norm: float | None = None,
    seed: int = 0,
    progress: bool = True,
    depth: int | None = None,
) -> dict[str, float]:
    """The task's metrics of ``model`` on ``ds`` (model classes mapped onto the task's by label name), at ``depth``."""
    logits = predict_logits(model, ds, batch_size, noise, mean_norm, seed, progress, depth)
    preds = predictions_from_logits(logits, task.is_regression)
    if not task.is_regression:
        preds = label_map(model.config, task)[preds]
    return task_metrics(task.metrics, preds, np.asarray(ds.labels))


def evaluate_dev(
    model, dev_sets: dict, task: GlueTask, batch_size: int = 64, progress: bool = True
) -> dict[str, float]:
    """The task's metrics on each dev split (:func:`evaluate_split`): the first's as they are, a second's (MNLI's
    mismatched) suffixed ``_mismatched``."""
    out = {}
    for i, ds in enumerate(dev_sets.values()):
        scores = evaluate_split(model, ds, task, batch_size, progress=progress)
        out.update({f"{k}{'' if i == 0 else '_mismatched'}": v for k, v in scores.items()})
    return out
