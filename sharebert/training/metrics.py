"""GLUE metrics with numpy/scipy: accuracy, F1, Matthews correlation, Pearson and Spearman.

Inputs are 1-D arrays of the same length: class ids for the classification metrics, floats for the
correlations. An undefined correlation (a constant input) is ``nan``.
"""

from __future__ import annotations

import math

import numpy as np


def _pair(predictions, labels) -> tuple[np.ndarray, np.ndarray]:
    p, y = np.asarray(predictions).reshape(-1), np.asarray(labels).reshape(-1)
    if p.shape != y.shape:
        raise ValueError(f"predictions ({p.size}) and labels ({y.size}) differ in length")
    if p.size == 0:
        raise ValueError("no examples to score")
    return p, y


def accuracy(predictions, labels) -> float:
    p, y = _pair(predictions, labels)
    return float(np.mean(p == y))


def f1(predictions, labels, positive: int = 1) -> float:
    """Binary F1 of the ``positive`` class: 2 TP / (2 TP + FP + FN); 0 when there is no positive at all."""
    p, y = _pair(predictions, labels)
    tp = np.sum((p == positive) & (y == positive))
    fp = np.sum((p == positive) & (y != positive))
    fn = np.sum((p != positive) & (y == positive))
    denom = 2 * tp + fp + fn
    return float(2 * tp / denom) if denom else 0.0


def matthews_correlation(predictions, labels) -> float:
    """Matthews correlation (Gorodkin's multi-class form; the binary phi coefficient for 2 classes).

    ``(c s - sum_k p_k t_k) / sqrt((s^2 - sum_k p_k^2)(s^2 - sum_k t_k^2))`` with ``c`` correct,
    ``s`` samples, ``p_k``/``t_k`` predicted/true counts of class k; 0 when a factor is 0.
    """
    p, y = _pair(predictions, labels)
    classes = np.union1d(p, y)
    pk = np.array([np.sum(p == k) for k in classes], dtype=np.float64)
    tk = np.array([np.sum(y == k) for k in classes], dtype=np.float64)
    s, c = float(p.size), float(np.sum(p == y))
    denom = math.sqrt((s * s - pk @ pk) * (s * s - tk @ tk))
    return float((c * s - pk @ tk) / denom) if denom else 0.0


def _correlation(fn, predictions, labels) -> float:
    p, y = _pair(predictions, labels)
    if p.size < 2 or np.all(p == p[0]) or np.all(y == y[0]):
        return float("nan")
    return float(fn(p.astype(np.float64), y.astype(np.float64))[0])


def pearson(predictions, labels) -> float:
    from scipy import stats  # here, not at import: accuracy and F1 (a device's depth table) need no scipy

    return _correlation(stats.pearsonr, predictions, labels)


def spearman(predictions, labels) -> float:
    from scipy import stats

    return _correlation(stats.spearmanr, predictions, labels)


def cosine_spearman(a: np.ndarray, b: np.ndarray, gold) -> float:
    """Spearman correlation of the cosine similarity of row pairs ``a[i], b[i]`` (``(N, H)`` each) with ``gold``
    scores ``(N,)``: how STS benchmarks score sentence embeddings."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return spearman(cos, np.asarray(gold, dtype=np.float64))


METRICS = {
    "accuracy": accuracy,
    "f1": f1,
    "matthews_correlation": matthews_correlation,
    "pearson": pearson,
    "spearman": spearman,
}


def task_metrics(names, predictions, labels) -> dict[str, float]:
    """``{name: value}`` for the metric names a task reports (``GlueTask.metrics``)."""
    return {name: METRICS[name](predictions, labels) for name in names}


def predictions_from_logits(logits: np.ndarray, regression: bool) -> np.ndarray:
    """Class ids (argmax over the last axis) or, for regression, the single output per example."""
    logits = np.asarray(logits)
    return logits.reshape(-1) if regression else logits.argmax(-1)
