"""Sentence pooling in numpy: token states ``(B, T, H)`` and the attention mask ``(B, T)`` -> ``(B, H)``.

The modes are sentence-transformers': ``cls`` the first real token, ``mean`` the mean over real tokens, ``max`` the
largest value per feature over real tokens, ``mean_sqrt_len`` the sum over real tokens divided by the square root of
their count, ``weightedmean`` the mean weighted by position (1, 2, ...), ``lasttoken`` the last real token.
:data:`POOLING_MODES` is their one list, here in the lowest layer so that every other may read it: the recipe
(``sharebert.formats.recipe``), the export's pooling graph, the runtime, ``predict --pooling`` and ``serve``; the
torch ``pool`` of the model (``sharebert.model.modeling_sharebert``) computes a subset. The runtime uses these poolers
when a caller overrides an artifact's pooling; the export checks the pooling nodes it writes into the graph against
them.
"""

from __future__ import annotations

import numpy as np


def _real(mask: np.ndarray) -> np.ndarray:
    return mask[..., None].astype(np.float32)


def _at(hidden: np.ndarray, index: np.ndarray) -> np.ndarray:
    return hidden[np.arange(len(hidden)), index]


def _cls(hidden, mask):
    return _at(hidden, np.argmax(mask, axis=1))  # the first real token: 0 unless padded on the left


def _lasttoken(hidden, mask):
    T = mask.shape[1]
    return _at(hidden, T - 1 - np.argmax(mask[:, ::-1], axis=1)) * (mask.sum(1) > 0)[:, None]


def _mean(hidden, mask):
    m = _real(mask)
    return (hidden * m).sum(1) / np.maximum(m.sum(1), 1e-9)


def _mean_sqrt_len(hidden, mask):
    m = _real(mask)
    return (hidden * m).sum(1) / np.sqrt(np.maximum(m.sum(1), 1e-9))


def _max(hidden, mask):
    return np.where(_real(mask) > 0, hidden, -np.inf).max(1)


def _weightedmean(hidden, mask):
    w = _real(mask) * np.arange(1, mask.shape[1] + 1, dtype=np.float32)[None, :, None]
    return (hidden * w).sum(1) / np.maximum(w.sum(1), 1e-9)


POOLERS = {
    "cls": _cls,
    "mean": _mean,
    "max": _max,
    "mean_sqrt_len": _mean_sqrt_len,
    "weightedmean": _weightedmean,
    "lasttoken": _lasttoken,
}
POOLING_MODES = tuple(POOLERS)


def check_mode(mode) -> str:
    """``mode`` when it is one of :data:`POOLING_MODES`; else ``ValueError`` saying which are."""
    if not isinstance(mode, str) or mode not in POOLERS:
        raise ValueError(f"pooling must be one of {', '.join(POOLING_MODES)}, got {mode!r}")
    return mode


def pool(hidden: np.ndarray, mask: np.ndarray, mode: str) -> np.ndarray:
    """``(B, H)`` float32 sentence vectors of token states ``hidden (B, T, H)`` under ``mask (B, T)``."""
    return np.asarray(POOLERS[check_mode(mode)](hidden.astype(np.float32, copy=False), mask), dtype=np.float32)


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    """Each row divided by its L2 norm (at least 1e-12, as torch's ``F.normalize``)."""
    return vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
