"""Parity of an exported graph with the PyTorch model on real sentences.

Sentences come from a ``.tsv`` with a ``sentence`` column (and optionally ``label``, as GLUE's
SST-2) or a text file with one sentence per line. Figures, per task:

* every task: ``max_abs_diff`` and ``mean_abs_diff`` of the outputs at real (non-padding) tokens (at
  the rows for classification), ``cosine_min`` / ``cosine_mean`` of those output vectors;
* ``fill-mask``: the middle word of each sentence is masked; ``top1_agreement`` at the masks;
* ``causal-lm``: ``top1_agreement`` of the next-token predictions at every real position;
* ``text-classification``: ``agreement`` of the predicted classes, and ``accuracy_torch``,
  ``accuracy_onnx``, ``accuracy_change`` when the file has labels.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sharebert.formats.bars import bar
from sharebert_runtime.textlines import check_text_file, numbered_lines

FP32_TOLERANCE = 1e-3

# The one table of parity thresholds (docs/EXPORT.md "Parity thresholds"): what an export with each
# --quantize mode must reach against PyTorch on the check sentences, else it fails and writes nothing
# (unless --allow-low-parity). ``top1``: the least agreement of the predicted token or class
# (``top1_agreement`` for fill-mask and causal-lm, ``agreement`` for a classifier); ``cosine``: the least
# mean cosine of the output vectors (logits, or hidden states for feature-extraction). fp32 is held to
# ``FP32_TOLERANCE`` on the outputs themselves instead.
THRESHOLDS = {
    "fp16": {"top1": 0.98, "cosine": 0.999},
    "int8": {"top1": 0.90, "cosine": 0.99},
    "int8-dynamic": {"top1": 0.85, "cosine": 0.98},
    "int8-static": {"top1": 0.85, "cosine": 0.98},
}
TOP1_FIGURES = ("top1_agreement", "agreement")  # the figure a task reports for its top-1 predictions


@dataclass(frozen=True)
class Check:
    """The PyTorch side of a parity check, compared with any ONNX Runtime session (the export's graph, its RAM-int8
    runtime): the model (eval) and its tokenizer, the task, the check sentences (and labels), the longest input."""

    model: object
    tokenizer: object
    task: str
    sentences: list[str]
    labels: list | None = None
    max_length: int = 128


def below_thresholds(parity: dict, quantize: str) -> list[str]:
    """The figures of ``parity`` that fall below ``THRESHOLDS[quantize]`` (``"top1_agreement 0.0069 < 0.9"``);
    empty when the mode has no thresholds or every figure meets them. NaN counts as below."""
    limits = THRESHOLDS.get(quantize)
    if not limits:
        return []
    checks = [(name, limits["top1"]) for name in TOP1_FIGURES if name in parity]
    checks.append(("cosine_mean", limits["cosine"]))
    return [f"{name} {parity[name]:.4g} < {least}" for name, least in checks if not parity[name] >= least]


def read_sentences(path: str | Path, limit: int | None = None) -> tuple[list[str], list | None]:
    """``(sentences, labels or None)`` from ``path`` (see the module docstring), read line by line in bounded
    memory (:mod:`sharebert_runtime.textlines`: a line over 1 MiB is refused); errors if none."""
    path = check_text_file(path, "sentence file")
    sentences, labels = _sentences_and_labels(_nonblank_lines(path))
    if not sentences:
        raise ValueError(
            f"{path} holds no sentences (expected a .tsv with a 'sentence' column or one sentence per line)"
        )
    if limit:
        sentences = sentences[:limit]
        labels = labels[:limit] if labels else None
    return sentences, labels


def _nonblank_lines(path: Path) -> list[str]:
    """The lines of ``path`` that hold more than white space (UTF-8 without NUL bytes, or a one-line error)."""
    lines = []
    with open(path, "rb") as f:
        for number, raw in numbered_lines(f, f"sentence file {path}"):
            try:
                if b"\0" in raw:
                    raise UnicodeError("NUL bytes")
                line = raw.decode("utf-8")
            except UnicodeError as e:
                raise ValueError(
                    f"{path} is not a UTF-8 text file ({e}; line {number}): expected sentences, one per line or a .tsv"
                ) from None
            lines.extend(x for x in line.splitlines() if x.strip())
    return lines


def _sentences_and_labels(lines: list[str]) -> tuple[list[str], list | None]:
    """A .tsv's ``sentence`` column (and its ``label`` column, or None), or one sentence per line."""
    if not (lines and "\t" in lines[0] and "sentence" in lines[0].split("\t")):
        return [line.strip() for line in lines], None
    rows = list(csv.DictReader(lines, delimiter="\t", quoting=csv.QUOTE_NONE))
    sentences = [r["sentence"].strip() for r in rows if (r.get("sentence") or "").strip()]
    labels = None
    if rows and "label" in rows[0]:
        labels = [r["label"] for r in rows if (r.get("sentence") or "").strip()]
    return sentences, labels


def encode(tokenizer, sentences: list[str], max_length: int, mask_middle: bool = False) -> dict[str, np.ndarray]:
    """Padded int64 ``input_ids``, ``attention_mask``, ``token_type_ids`` ``(B, T)``; with
    ``mask_middle`` the middle non-special token of each row becomes ``[MASK]``."""
    enc = tokenizer(sentences, padding=True, truncation=True, max_length=max_length, return_tensors="np")
    feeds = {k: np.asarray(enc[k], dtype=np.int64) for k in ("input_ids", "attention_mask")}
    feeds["token_type_ids"] = (
        np.asarray(enc["token_type_ids"], dtype=np.int64)
        if "token_type_ids" in enc
        else np.zeros_like(feeds["input_ids"])
    )
    if mask_middle:
        lengths = feeds["attention_mask"].sum(1)
        positions = np.maximum(1, (lengths - 1) // 2)  # inside [CLS] ... [SEP]
        feeds["input_ids"][np.arange(len(sentences)), positions] = tokenizer.mask_token_id
    return feeds


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    den = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    return (a * b).sum(-1) / np.maximum(den, 1e-30)


OUTPUT_BUDGET = 64 << 20  # bytes of one batch's fp32 outputs, per side: bounds the export's peak memory


def _batches(tokenizer, sentences: list[str], order: list[int], max_length: int, width: int, batch_size: int):
    """``order`` cut into batches of at most ``batch_size`` sentences whose padded ``(B, T, width)`` fp32
    outputs stay within ``OUTPUT_BUDGET`` (a 30k-word vocabulary allows about 16 sequences of 128)."""
    lengths = [
        min(len(ids), max_length) for ids in tokenizer(sentences, truncation=True, max_length=max_length)["input_ids"]
    ]
    batches, batch = [], []
    for i in order:
        longest = max([lengths[j] for j in batch] + [lengths[i]])
        if batch and (len(batch) >= batch_size or (len(batch) + 1) * longest * width * 4 > OUTPUT_BUDGET):
            batches.append(batch)
            batch = []
        batch.append(i)
    return batches + ([batch] if batch else [])


def check_parity(check: Check, session, batch_size: int = 32, progress: bool = True, depth: int | None = None) -> dict:
    """Run ``check.model`` (torch, eval) and ``session`` (ONNX Runtime) on ``check.sentences``; return the figures.

    ``depth``: run both with only the first ``depth`` encoder layers (the session's ``depth`` input)."""
    from sharebert_runtime.artifact import model_feeds

    model, tokenizer, task = check.model, check.tokenizer, check.task
    sentences, max_length = check.sentences, check.max_length
    names = [i.name for i in session.get_inputs()]
    torch_names = [n for n in ("input_ids", "attention_mask", "token_type_ids", "position_ids") if n in names]
    output = session.get_outputs()[0].name
    seen = {"diffs": [], "cosines": [], "agree": [], "torch": [], "onnx": [], "n_diff": 0}
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))  # similar lengths: little padding
    width = _output_width(model.config, task)
    batches = _batches(
        tokenizer, sentences, order, max_length, width if task != "text-classification" else 1, batch_size
    )
    for batch in bar(batches, desc=f"parity ({task})", progress=progress, leave=False):
        feeds = encode(tokenizer, [sentences[i] for i in batch], max_length, mask_middle=task == "fill-mask")
        feeds = {
            **model_feeds(session.get_inputs(), feeds["input_ids"], feeds["attention_mask"]),
            **{k: v for k, v in feeds.items() if k in names},
        }  # the tokenizer's own token_type_ids
        ref, got = _both_outputs(check, session, feeds, torch_names, output, depth)
        _compare(task, ref, got, feeds, tokenizer.mask_token_id, seen)
    cos = np.concatenate(seen["cosines"])
    diffs = seen["diffs"]
    report = {
        "sentences": len(sentences),
        "max_abs_diff": max(d[0] for d in diffs),
        "mean_abs_diff": sum(d[1] for d in diffs) / max(seen["n_diff"], 1),
        "cosine_min": float(cos.min()),
        "cosine_mean": float(cos.mean()),
    }
    if seen["agree"]:
        report["top1_agreement"] = float(np.concatenate(seen["agree"]).mean())
    if task == "text-classification" and model.config.num_labels > 1:
        back = np.argsort(order)  # predictions in the sentences' own order, to match the labels
        report.update(
            _label_agreement(
                np.concatenate(seen["torch"])[back], np.concatenate(seen["onnx"])[back], check.labels, model.config
            )
        )
    return report


def _output_width(config, task: str) -> int:
    """The size of the last axis of the task's output."""
    if task == "feature-extraction":
        return config.hidden_size
    return config.num_labels if task == "text-classification" else config.vocab_size


def _both_outputs(check: Check, session, feeds: dict, torch_names: list[str], output: str, depth: int | None):
    """``(torch's, ONNX Runtime's)`` fp32 outputs for ``feeds`` (``depth`` added to them when given)."""
    import torch

    from sharebert_runtime.artifact import DEPTH

    with torch.no_grad():
        out = check.model(**{k: torch.from_numpy(feeds[k]) for k in torch_names}, **({"depth": depth} if depth else {}))
    ref = (out.logits if check.task != "feature-extraction" else out.last_hidden_state).float().numpy()
    if depth:
        feeds[DEPTH] = np.array(depth, dtype=np.int64)
    return ref, session.run([output], feeds)[0].astype(np.float32)


def _compare(task: str, ref: np.ndarray, got: np.ndarray, feeds: dict, mask_token_id, seen: dict) -> None:
    """One batch's differences, cosines and top-1 agreement (or predictions) over its real tokens, added to ``seen``."""
    real = feeds["attention_mask"].astype(bool)
    r, o = (ref, got) if task == "text-classification" else (ref[real], got[real])
    diff = np.abs(r - o)
    seen["diffs"].append((float(diff.max()), float(diff.sum())))
    seen["n_diff"] += diff.size
    seen["cosines"].append(_cosines(r, o))
    if task == "fill-mask":
        at = feeds["input_ids"] == mask_token_id
        seen["agree"].append(ref[at].argmax(-1) == got[at].argmax(-1))
    elif task == "causal-lm":
        seen["agree"].append(r.argmax(-1) == o.argmax(-1))
    elif task == "text-classification":
        seen["torch"].append(ref.argmax(-1))
        seen["onnx"].append(got.argmax(-1))


def _label_agreement(pt: np.ndarray, po: np.ndarray, labels: list | None, config) -> dict:
    """How often the two predictions agree, and each one's accuracy on the gold ``labels`` when they fit."""
    report = {"agreement": float((pt == po).mean())}
    gold = _label_ids(labels, config)
    if gold is not None:
        report["accuracy_torch"] = float((pt == gold).mean())
        report["accuracy_onnx"] = float((po == gold).mean())
        report["accuracy_change"] = report["accuracy_onnx"] - report["accuracy_torch"]
    return report


def _label_ids(labels: list | None, config) -> np.ndarray | None:
    """Gold label ids: integers in range, or names from ``config.label2id``; None if neither fits."""
    if not labels:
        return None
    label2id = {str(k): int(v) for k, v in (config.label2id or {}).items()}
    try:
        ids = [int(label) if str(label).lstrip("-").isdigit() else label2id[str(label)] for label in labels]
    except KeyError:
        return None
    ids = np.asarray(ids)
    return ids if ids.min() >= 0 and ids.max() < config.num_labels else None


def reference_thresholds(quantize: str, ram_int8: bool) -> dict:
    """The manifest's ``reference.thresholds`` by the runtime's RAM mode (the runtime reads no ``export/``): ``fp32``
    (the graph as exported) the export's own, ``THRESHOLDS[quantize]`` or ``FP32_TOLERANCE`` on the outputs; ``int8``
    (an artifact with RAM-int8 graphs: dynamic-int8 products on top of its weights) the looser of those and int8's."""
    own = dict(THRESHOLDS[quantize]) if quantize in THRESHOLDS else {"max_abs_diff": FP32_TOLERANCE}
    table = {"fp32": own}
    if ram_int8:
        table["int8"] = {k: min(own.get(k, least), least) for k, least in THRESHOLDS["int8"].items()}
    return table


def reference_entry(check: Check, session, embedding=None) -> dict | None:
    """The manifest's ``reference`` (``sharebert_runtime.reference``, without its thresholds): the first check
    sentences that fit, as token ids and mask, PyTorch's outputs on them, and the exported graph's figures on them
    here (``at_export``); None when no sentence fits. ``embedding``: ``(graph output, f(token states, mask))``, the
    sentence embedding a feature-extraction graph computes (before normalisation), stored instead of the states."""
    import torch

    from sharebert_runtime import reference as ref
    from sharebert_runtime.artifact import model_feeds

    model, tokenizer, task = check.model, check.tokenizer, check.task
    sentences, max_length = check.sentences, check.max_length
    lengths = [len(x) for x in tokenizer(sentences, truncation=True, max_length=max_length)["input_ids"]]
    chosen = ref.choose(lengths, model.config.hidden_size if task == "feature-extraction" else 1)
    if not chosen:
        return None
    enc = encode(
        tokenizer, [sentences[i] for i in chosen], min(max_length, ref.MAX_TOKENS), mask_middle=task == "fill-mask"
    )
    ids, mask = enc["input_ids"], enc["attention_mask"]
    feeds = model_feeds(session.get_inputs(), ids, mask)  # as the runtime feeds them: token types 0
    torch_names = [n for n in ("input_ids", "attention_mask", "token_type_ids", "position_ids") if n in feeds]
    with torch.no_grad():
        out = model(**{k: torch.from_numpy(feeds[k]) for k in torch_names})
    first = session.get_outputs()[0].name
    if task != "feature-extraction":
        want = {first: out.logits.float().numpy()}
    elif embedding is None:
        want = {first: out.last_hidden_state.float().numpy()}
    else:
        want = {embedding[0]: embedding[1](out.last_hidden_state.float().numpy(), mask).astype(np.float32)}
    entry = ref.build(task, want, ids, mask, tokenizer.mask_token_id, embedding and embedding[0])
    got = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    entry["at_export"] = ref.figures(entry, got, mask, "the export")
    return entry
