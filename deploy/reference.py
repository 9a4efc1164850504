"""An artifact's own check: the manifest's ``reference`` entry, a few inputs and what PyTorch answered to them.

At export (``export/parity.py``, :func:`build`) a few of the parity sentences are stored as token ids and attention
mask (so no tokenizer can differ), with PyTorch's outputs on them in compact form; ``sharebert verify`` and
``Runtime.verify()`` run those ids through the artifact on the device and compare (:func:`figures`).
Both sides cut the outputs down with the same functions here, so what is compared is the same thing:

* feature-extraction: the graph's sentence embedding (before normalisation) where the export's recipe put one in,
  else the token states mean-pooled over the real tokens: ``(B, D)`` vectors;
* text-classification: the logits ``(B, labels)``;
* fill-mask (at each ``[MASK]``) and causal-lm (at every real position, at most :data:`MAX_ROWS`): the logits of the
  reference's :data:`TOP_IDS` best tokens and :data:`SPREAD_IDS` evenly spaced others, and the reference's best
  token over the whole vocabulary.

This module also holds the check itself (:func:`verify_runtime`, :func:`report`), which ``verify.py`` prints.

Figures per output: ``max_abs_diff``, ``cosine_min`` and ``cosine_mean`` over the rows (of the kept logits, for
fill-mask and causal-lm), and ``top1_agreement`` (the best token or class; not for a one-output regression).
Arrays are stored as ``{"dtype", "shape", "base64"}`` of their little-endian bytes: a few KB in all.
"""

from __future__ import annotations

import base64
import binascii
import math

import numpy as np

from .artifact import MANIFEST, ArtifactError
from .cpu import cpu_info, describe
from .pooling import pool

KEY = "reference"  # the manifest's entry
SENTENCES = 16  # stored inputs (fewer for wide sentence vectors: VECTOR_VALUES)
MAX_TOKENS = 40  # a stored input's tokens at most (special tokens included): the shorter check sentences
VECTOR_VALUES = 2048  # numbers of one output's stored vectors at most (all-MiniLM-L6-v2's 384: 5 sentences)
MAX_ROWS = 32  # logits rows kept (fill-mask's masks, causal-lm's positions)
TOP_IDS, SPREAD_IDS = 6, 10  # per kept row: the reference's best tokens, and evenly spaced others for the cosine
NO_REFERENCE = "carries no reference outputs (export it again)"
THRESHOLD_KEYS = ("top1", "cosine", "max_abs_diff")
_DTYPES = {"float32": "<f4", "int32": "<i4", "uint8": "u1"}
_MAX_ELEMENTS = 1 << 20  # a stored array's numbers at most: a manifest edited by hand cannot make a huge allocation


def pack(array: np.ndarray, dtype: str) -> dict:
    """``array`` as ``dtype`` (a key of ``_DTYPES``) in the manifest's form."""
    data = np.ascontiguousarray(array, dtype=_DTYPES[dtype]).tobytes()
    return {"dtype": dtype, "shape": list(array.shape), "base64": base64.b64encode(data).decode("ascii")}


def unpack(entry, what: str, where) -> np.ndarray:
    """The array a :func:`pack` entry holds; :class:`ArtifactError` naming ``where`` and ``what`` if malformed."""
    ok = (
        isinstance(entry, dict)
        and entry.get("dtype") in _DTYPES
        and isinstance(entry.get("shape"), list)
        and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in entry["shape"])
        and isinstance(entry.get("base64"), str)
    )
    if ok and math.prod(entry["shape"]) <= _MAX_ELEMENTS:
        try:
            data = base64.b64decode(entry["base64"], validate=True)
        except (binascii.Error, ValueError):
            data = None
        dtype = np.dtype(_DTYPES[entry["dtype"]])
        if data is not None and len(data) == math.prod(entry["shape"]) * dtype.itemsize:
            return np.frombuffer(data, dtype).reshape(entry["shape"])
    raise ArtifactError(f"{where}: {KEY} {what} is not a stored array (dtype, shape and base64 bytes that agree)")


def choose(lengths: list[int], width: int) -> list[int]:
    """Which sentences (by index) to store: the first ones of 3 to :data:`MAX_TOKENS` tokens, then (a file of long
    sentences) longer ones, which the export cuts to :data:`MAX_TOKENS`; as many as :data:`SENTENCES` and, for
    outputs ``width`` numbers wide per sentence, :data:`VECTOR_VALUES` allow."""
    keep = min(SENTENCES, max(4, VECTOR_VALUES // max(width, 1)))
    short = [i for i, n in enumerate(lengths) if 3 <= n <= MAX_TOKENS]
    return (short + [i for i, n in enumerate(lengths) if n > MAX_TOKENS])[:keep]


def _rows(task: str, input_ids: np.ndarray, mask: np.ndarray, mask_id) -> np.ndarray:
    """``(M, 2)`` positions (row, token) whose logits are kept: the masks, or every real position."""
    at = input_ids == mask_id if task == "fill-mask" else mask.astype(bool)
    return np.argwhere(at)[:MAX_ROWS].astype(np.int32)


def _kept_ids(logits: np.ndarray) -> np.ndarray:
    """Per row of ``(M, V)`` logits: its :data:`TOP_IDS` best ids, then :data:`SPREAD_IDS` evenly spaced others."""
    V, k = logits.shape[-1], TOP_IDS + SPREAD_IDS
    spread = np.arange(V) if V <= k else np.linspace(0, V - 1, k).astype(np.int64)  # distinct: a step of >= 1
    out = []
    for row in logits:
        top = np.argsort(-row, kind="stable")[:TOP_IDS]
        taken = set(top.tolist())
        others = [i for i in spread if i not in taken][: min(k, V) - len(top)]
        out.append(np.concatenate([top, np.asarray(others, np.int64)]))
    return np.stack(out) if out else np.zeros((0, min(k, V)), np.int64)


def build(task: str, outputs: dict, input_ids: np.ndarray, mask: np.ndarray, mask_id, embedding: str | None) -> dict:
    """The manifest's ``reference`` from PyTorch's ``outputs`` (``{graph output: array}``) on ``input_ids`` and
    ``mask`` ``(B, T)``; ``embedding``: the graph output holding the sentence embedding (feature-extraction)."""
    entry = {"input_ids": pack(input_ids, "int32"), "attention_mask": pack(mask, "uint8"), "outputs": {}}
    for name, value in outputs.items():
        value = np.asarray(value, np.float32)
        if task == "feature-extraction":
            spec = {"kind": "vectors", "pooled": None if name == embedding else "mean"}
            spec["values"] = pack(_vectors(spec, value, mask), "float32")
        elif task == "text-classification":
            spec = {"kind": "logits", "values": pack(value, "float32")}
        else:
            rows = _rows(task, input_ids, mask, mask_id)
            at = value[rows[:, 0], rows[:, 1]]
            ids = _kept_ids(at)
            spec = {
                "kind": "rows",
                "rows": pack(rows, "int32"),
                "ids": pack(ids, "int32"),
                "values": pack(np.take_along_axis(at, ids, -1), "float32"),
                "top1": pack(at.argmax(-1), "int32"),
            }
        entry["outputs"][name] = spec
    return entry


def _vectors(spec: dict, value: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return value if spec.get("pooled") is None else pool(value, mask, "mean")


def inputs(entry, where) -> tuple[np.ndarray, np.ndarray]:
    """The stored ``(input_ids, attention_mask)``, int64 ``(B, T)``; :class:`ArtifactError` if malformed."""
    if not isinstance(entry, dict) or not isinstance(entry.get("outputs"), dict) or not entry["outputs"]:
        raise ArtifactError(f"{where}: {KEY} must hold input_ids, attention_mask and outputs")
    ids = unpack(entry.get("input_ids"), "input_ids", where).astype(np.int64)
    mask = unpack(entry.get("attention_mask"), "attention_mask", where).astype(np.int64)
    if ids.ndim != 2 or ids.shape != mask.shape or ids.size == 0 or ids.min() < 0 or mask.max() > 1:
        raise ArtifactError(f"{where}: {KEY} input_ids and attention_mask must be (B, T) ids and 0/1 of one shape")
    return ids, mask


def figures(entry: dict, outputs: dict, mask: np.ndarray, where) -> dict:
    """Per stored output, the figures of ``outputs`` (the artifact's, ``{graph output: array}`` on the stored
    inputs) against the reference; :class:`ArtifactError` naming the output when the entry does not fit them."""
    result = {}
    for name, spec in entry["outputs"].items():
        if name not in outputs:
            raise ArtifactError(f"{where}: {KEY} output {name!r} is not an output of the model")
        if not isinstance(spec, dict) or spec.get("kind") not in ("vectors", "logits", "rows"):
            raise ArtifactError(f"{where}: {KEY} output {name!r} must be of kind vectors, logits or rows")
        want, got, top1 = _pair(spec, np.asarray(outputs[name], np.float32), mask, f"output {name!r}", where)
        result[name] = _figures(want, got, top1)
    return result


def _pair(spec: dict, value: np.ndarray, mask: np.ndarray, what: str, where):
    """``(reference, artifact's, (reference's best, artifact's best) or None)`` for one output."""
    want = unpack(spec.get("values"), f"{what} values", where).astype(np.float32)
    if spec["kind"] == "vectors":
        got = _vectors(spec, value, mask) if value.ndim == 3 and value.shape[:2] == mask.shape else value
        top1 = None
    elif spec["kind"] == "logits":
        got = value
        top1 = (want.argmax(-1), got.argmax(-1)) if want.ndim == 2 and want.shape[-1] > 1 else None
    else:
        rows = unpack(spec.get("rows"), f"{what} rows", where).astype(np.int64)
        ids = unpack(spec.get("ids"), f"{what} ids", where).astype(np.int64)
        best = unpack(spec.get("top1"), f"{what} top1", where).astype(np.int64)
        fits = (
            value.ndim == 3
            and rows.ndim == 2
            and rows.shape[1:] == (2,)
            and ids.shape == want.shape == (len(rows), ids.shape[-1])
            and best.shape == (len(rows),)
            and (rows.size == 0 or (rows.min() >= 0 and (rows.max(0) < value.shape[:2]).all()))
            and (ids.size == 0 or (ids.min() >= 0 and ids.max() < value.shape[-1]))
        )
        if not fits:
            raise ArtifactError(f"{where}: {KEY} {what} does not fit the model's output of shape {list(value.shape)}")
        at = value[rows[:, 0], rows[:, 1]]
        got, top1 = np.take_along_axis(at, ids, -1), (best, at.argmax(-1))
    if want.shape != got.shape or want.ndim != 2 or want.size == 0:
        raise ArtifactError(
            f"{where}: {KEY} {what} holds {list(want.shape)} numbers, the model answers {list(got.shape)}"
        )
    return want, got, top1


def _figures(want: np.ndarray, got: np.ndarray, top1) -> dict:
    """``max_abs_diff``, ``cosine_min``, ``cosine_mean`` (per row), ``top1_agreement`` (NaN stays NaN: it fails)."""
    want, got = want.astype(np.float64), got.astype(np.float64)
    den = np.linalg.norm(want, axis=-1) * np.linalg.norm(got, axis=-1)
    cos = (want * got).sum(-1) / np.maximum(den, 1e-30)
    out = {
        "rows": int(len(want)),
        "max_abs_diff": float(np.abs(want - got).max()),
        "cosine_min": float(cos.min()),
        "cosine_mean": float(cos.mean()),
    }
    if top1 is not None:
        out["top1_agreement"] = float((top1[0] == top1[1]).mean())
    return out


def below(figures: dict, thresholds: dict) -> list[str]:
    """The figures of one output outside ``thresholds`` (``{"top1", "cosine", "max_abs_diff"}``, each optional):
    ``"cosine_mean 0.93 < 0.99"``; NaN is outside."""
    out = []
    checks = (("top1_agreement", "top1", 1), ("cosine_mean", "cosine", 1), ("max_abs_diff", "max_abs_diff", -1))
    for name, key, sign in checks:
        if key not in thresholds or name not in figures:
            continue
        value, limit = figures[name], thresholds[key]
        if not (value * sign >= limit * sign):
            out.append(f"{name} {value:.4g} {'<' if sign > 0 else '>'} {limit:g}")
    return out


def _thresholds(entry: dict, ram: str, where) -> dict:
    """The entry's thresholds for RAM mode ``ram`` (``{"top1", "cosine", "max_abs_diff"}``, each optional)."""
    table = entry.get("thresholds")
    limits = table.get(ram) if isinstance(table, dict) else None
    ok = (
        isinstance(limits, dict)
        and bool(limits)
        and set(limits) <= set(THRESHOLD_KEYS)
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in limits.values())
    )
    if not ok:
        raise ArtifactError(
            f"{where}: {KEY} thresholds has no {ram!r} entry of finite {', '.join(THRESHOLD_KEYS)} limits"
        )
    return limits


AT_EXPORT = {"fp32": "at_export", "int8": "at_export_ram_int8"}  # the export's own figures, per RAM mode


def replay(runtime) -> tuple[dict, int]:
    """``({output: figures}, inputs)``: the stored inputs run through ``runtime`` (at full depth: the reference is
    PyTorch's) against the reference; :class:`ArtifactError` for an artifact without one or with a broken one."""
    where = runtime.path / MANIFEST
    entry = runtime.manifest.get(KEY)
    if entry is None:
        raise ArtifactError(f"{runtime.path} {NO_REFERENCE}")
    ids, mask = inputs(entry, where)
    vocab = runtime.tokenizer.get_vocab_size(with_added_tokens=True)
    if ids.shape[1] > runtime.max_length or ids.max() >= vocab:
        raise ArtifactError(
            f"{where}: {KEY} input_ids must be at most {runtime.max_length} tokens of ids below {vocab}"
        )
    outs = runtime.at_depth(None)._run(ids, mask)
    raw, recipe = (runtime.manifest.get("web") or {}).get("unnormalized_output"), runtime.manifest.get("embedding")
    if raw in outs and recipe and recipe.get("output") in outs:  # a web graph normalises it; PyTorch's is the raw one
        outs[recipe["output"]] = outs.pop(raw)
    return figures(entry, outs, mask, where), int(len(ids))


def verify_runtime(runtime) -> dict:
    """:meth:`Runtime.verify`'s result: ``passed``, per output its figures, ``below`` (the figures outside the
    thresholds) and ``at_export`` (the export's figures on the same inputs in the same RAM mode, where recorded),
    the thresholds, this CPU and the export's."""
    measured, n = replay(runtime)
    manifest = runtime.manifest
    entry = manifest[KEY]
    limits = _thresholds(entry, runtime.ram, runtime.path / MANIFEST)
    at_export = entry.get(AT_EXPORT.get(runtime.ram, ""))
    at_export = at_export if isinstance(at_export, dict) else {}
    result = {name: {**f, "below": below(f, limits), "at_export": at_export.get(name)} for name, f in measured.items()}
    return {
        "artifact": str(runtime.path),
        "task": runtime.task,
        "quantization": manifest.get("quantization"),
        "ram": runtime.ram,
        "inputs": n,
        "passed": not any(f["below"] for f in result.values()),
        "outputs": result,
        "thresholds": limits,
        "cpu": {**cpu_info(), "providers": list(runtime.providers)},
        "export_cpu": manifest.get("cpu"),
    }


def _limits_text(limits: dict) -> str:
    parts = {"top1": "top1_agreement >= {:g}", "cosine": "cosine_mean >= {:g}", "max_abs_diff": "max_abs_diff <= {:g}"}
    return ", ".join(parts[k].format(limits[k]) for k in THRESHOLD_KEYS if k in limits)


def _figures_text(f: dict | None) -> str:
    if not isinstance(f, dict):
        return "not recorded"
    text = f"max_abs_diff {f.get('max_abs_diff', math.nan):.4g}, cosine min {f.get('cosine_min', math.nan):.6f} "
    text += f"mean {f.get('cosine_mean', math.nan):.6f}"
    if "top1_agreement" in f:
        text += f", top1_agreement {f['top1_agreement']:.4g}"
    return text


def report(result: dict) -> str:
    """The printed result: the artifact and mode, both CPUs, one line per output (and the export's figures), the
    verdict."""
    lines = [
        f"artifact    {result['artifact']}: {result['task']}, quantization {result['quantization']}, "
        f"ram {result['ram']}, {result['inputs']} stored inputs",
        f"this CPU    {describe(result['cpu'])}",
        f"export CPU  {describe(result['export_cpu'])}",
        f"thresholds  {_limits_text(result['thresholds'])} (the artifact's own, ram {result['ram']})",
    ]
    for name, f in result["outputs"].items():
        verdict = "ok" if not f["below"] else "BELOW: " + "; ".join(f["below"])
        lines.append(f"{name} ({f['rows']} rows): {_figures_text(f)}  {verdict}")
        lines.append(f"  at export ({result['ram']}, on the export CPU): {_figures_text(f['at_export'])}")
    failed = [f"{name}: {'; '.join(f['below'])}" for name, f in result["outputs"].items() if f["below"]]
    if failed:
        lines.append(f"FAIL: below the artifact's parity thresholds on this CPU: {' | '.join(failed)}")
    else:
        lines.append("PASS: every output within the artifact's parity thresholds on this CPU")
    return "\n".join(lines)


def finite(obj):
    """``obj`` with NaN and infinities as None (strict JSON); a NaN figure is already among ``below``."""
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [finite(v) for v in obj]
    if isinstance(obj, (float, np.floating)) and not math.isfinite(obj):
        return None
    return obj
