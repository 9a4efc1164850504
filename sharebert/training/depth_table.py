"""Depth chosen at inference: ``--depth-sampling`` checks and the per-depth GLUE table (``evaluate glue --depths``).

A layer-shared model runs the same generated weights in every layer, so its first ``k`` layers are a
model too. Training with ``config.train_min_depth`` runs a depth drawn from ``train_min_depth..N`` per
training forward (``ShareBertModel._depth``); :func:`depth_table` scores each depth on a GLUE dev set
and times one sentence at it, on a fine-tuned model folder (PyTorch, ``model(..., depth=k)``) or on an
exported text-classification artifact (``Runtime(...).at_depth(k)``, torch-free: this module imports
torch only for a model folder).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from ..formats.paths import data_path
from .glue import get_task, read_split
from .metrics import task_metrics


def check_depth_sampling(min_depth: int | None, layers: int) -> int | None:
    """``min_depth`` (None: no depth sampling) if a model of ``layers`` layers can sample ``min_depth..layers``."""
    if min_depth is None:
        return None
    if layers < 2:
        raise ValueError(f"--depth-sampling needs a model with at least 2 layers; this one has {layers}")
    if isinstance(min_depth, bool) or not isinstance(min_depth, int) or not 1 <= min_depth <= layers:
        raise ValueError(
            f"--depth-sampling MIN must be an integer in 1..{layers} (the model's layers), got {min_depth!r}"
        )
    return min_depth


def _p50_ms(run, items) -> float:
    """Median milliseconds of ``run(item)`` over ``items`` (after up to 10 warm-up calls)."""
    for item in items[:10]:
        run(item)
    times = []
    for item in items:
        start = time.perf_counter()
        run(item)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _torch_scorer(model_dir, task, split, threads, batch_size):
    """``(layers, score(depth) -> (metric dict, p50 ms))`` for a fine-tuned model folder (PyTorch)."""
    import torch

    from .encoded import encode, evaluate_split
    from .evaluate import load_finetuned

    model, tokenizer = load_finetuned(model_dir)
    ds = encode(split, tokenizer, min(128, model.config.max_position_embeddings), progress=False)
    device = next(model.parameters()).device
    keys = [k for k in ("input_ids", "token_type_ids", "attention_mask") if k in ds.encodings]

    def score(depth, n):
        singles = [{k: torch.tensor([ds.encodings[k][i]], device=device) for k in keys} for i in range(n)]
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            with torch.no_grad():
                p50 = _p50_ms(lambda batch: model(**batch, depth=depth), singles)
        finally:
            torch.set_num_threads(before)
        return evaluate_split(model, ds, task, batch_size, depth=depth, progress=False), p50

    return model.config.num_hidden_layers, score


def _artifact_scorer(path, task, split, threads):
    """``(layers, score(depth) -> (metric dict, p50 ms))`` for a text-classification artifact (ONNX Runtime)."""
    import numpy as np

    from sharebert_runtime import Runtime

    if split.text_b is not None or task.is_regression:
        raise ValueError(
            f"{path} is an artifact: its runtime classifies single texts, and {task.name} scores "
            f"sentence pairs{' (regression)' if task.is_regression else ''}; give the model folder"
        )
    runtime = Runtime(path, threads=threads)
    if runtime.task != "text-classification":
        raise ValueError(f"{path} is a {runtime.task} artifact, not a text classifier")
    if set(runtime.labels or ()) != set(task.label_names):
        raise ValueError(f"{path}'s labels {runtime.labels} are not {task.name}'s {list(task.label_names)}")
    texts, gold = list(split.text_a), np.asarray(split.labels)

    def score(depth, n):
        at = runtime.at_depth(depth)
        p50 = _p50_ms(lambda text: at.classify([text]), texts[:n])
        preds = np.array([task.label_names.index(p["label"]) for p in at.classify(texts)])
        return task_metrics(task.metrics, preds, gold), p50

    return runtime.max_depth, score


def depth_table(  # 8: the public call: `sharebert evaluate glue --depths`'s options as keywords
    model,
    task: str,
    depths,
    data_dir=None,
    max_eval_samples: int | None = None,
    latency_samples: int = 100,
    threads: int = 1,
    batch_size: int = 64,
) -> dict:
    """The task's dev metric and the p50 latency of one sentence (batch 1, ``threads`` threads, median over the
    first ``latency_samples`` dev sentences) at each depth of ``depths`` and at the full depth N.

    ``model``: a fine-tuned model folder or a text-classification artifact folder. Returns ``{"task", "metric",
    "backend", "layers", "eval_samples", "latency_samples", "threads", "cpu", "rows": [{"depth", <metric>, "p50_ms",
    "metric_vs_full" (difference), "latency_vs_full" (ratio)}]}``, rows by depth. Depths outside 1..N, or any
    depth for an artifact exported without depth support, raise ``ValueError`` before the data is read.
    """
    from sharebert_runtime.artifact import MANIFEST, depth_limit, is_artifact
    from sharebert_runtime.cpu import cpu_info

    from ..formats.model_folder import read_config

    task_ = get_task(task)
    if not latency_samples >= 1 or not threads >= 1:
        raise ValueError(f"--latency-samples and --threads must be at least 1, got {latency_samples} and {threads}")
    artifact = is_artifact(model)
    if artifact:  # verified when the runtime opens it; here only which depths it has
        layers = depth_limit(json.loads((Path(model) / MANIFEST).read_text(encoding="utf-8")), model)
    else:
        layers = read_config(model).get("num_hidden_layers")
    bad = [d for d in depths if isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= layers]
    if bad:
        raise ValueError(f"--depths must be integers in 1..{layers} (the model's layers), got {bad[0]!r}")
    data_dir = Path(data_dir) if data_dir is not None else data_path("glue", task_.folder)
    split = read_split(task_, data_dir, task_.dev_splits[0]).head(max_eval_samples)
    _, score = (
        _artifact_scorer(model, task_, split, threads)
        if artifact
        else _torch_scorer(model, task_, split, threads, batch_size)
    )
    n = min(latency_samples, len(split))
    results = {d: score(d, n) for d in sorted({*depths, layers})}
    metric = task_.main_metric
    full_metric, full_ms = results[layers][0][metric], results[layers][1]
    rows = [
        {
            "depth": d,
            metric: m[metric],
            "p50_ms": ms,
            "metric_vs_full": None if m[metric] is None or full_metric is None else m[metric] - full_metric,
            "latency_vs_full": ms / full_ms,
        }
        for d, (m, ms) in results.items()
    ]
    return {
        "task": task_.name,
        "metric": metric,
        "backend": "onnxruntime" if artifact else "pytorch",
        "layers": layers,
        "eval_samples": len(split),
        "latency_samples": n,
        "threads": threads,
        "cpu": cpu_info(),  # the latencies are this CPU's
        "rows": rows,
    }


def plot_depths(result: dict, path: str | Path) -> Path:
    """The dev metric and the p50 latency against depth, from :func:`depth_table`, as two panels side by side
    (one axis each: a twin axis makes the reader match colours to scales), each titled with its unit and what it
    was measured on."""
    from ..accounting.picture import SECOND, STUDENT, figure, headline, save, wrap

    rows, metric = result["rows"], result["metric"]
    depths = [r["depth"] for r in rows]
    values, ms = [r[metric] for r in rows], [r["p50_ms"] for r in rows]
    threads = f"{result['threads']} thread{'s' * (result['threads'] > 1)}"
    with figure(4.8, ncols=2) as (fig, [[quality, latency]]):
        quality.plot(depths, values, "o-", color=STUDENT, lw=2, ms=7)
        low = 0 if min(values) >= 0 else min(values) - 0.05  # never truncated; a negative score clear of the frame
        quality.set_ylim(low, max(1, max(values)) if max(values) <= 1 else None)
        quality.set_ylabel(f"dev {metric}")
        quality.set_title(wrap(f"{result['task']} dev {metric} ({result['eval_samples']} dev examples)", 55))
        latency.plot(depths, ms, "s-", color=SECOND, lw=2, ms=7)
        latency.set_ylim(bottom=0, top=max(ms) * 1.15)
        latency.set_ylabel("p50 latency, ms")
        latency.set_title(wrap(f"p50 ms per sentence (batch 1, {threads}, median of {result['latency_samples']})", 55))
        for ax, ys, fmt in ((quality, values, "{:.3f}"), (latency, ms, "{:.1f}")):
            for x, y in zip(depths, ys):
                ax.annotate(fmt.format(y), (x, y), textcoords="offset points", xytext=(0, 8), ha="center")
            ax.set_xticks(depths)
            ax.margins(x=0.08)  # the end points' values clear of the frame
            ax.set_xlabel(f"depth (encoder layers run, of {result['layers']})")
        backend = {"pytorch": "the PyTorch model", "onnxruntime": "the ONNX Runtime artifact"}[result["backend"]]
        headline(fig, f"Quality and latency by depth: {backend} on {_machine(result)}")
        return save(fig, path)


def _machine(result: dict) -> str:
    """The CPU the latencies came from, in a few words (a table from before the field: not recorded)."""
    cpu = result.get("cpu") or {}
    return " ".join(str(cpu[k]) for k in ("model", "machine") if cpu.get(k)) or "CPU not recorded"
