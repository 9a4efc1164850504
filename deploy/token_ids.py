"""Token ids of text lines (``tokenizers`` and numpy only), here or in worker processes.

``sharebert prepare --workers N`` tokenizes in N spawned processes. A spawned worker imports the module that holds
its functions, and any module under ``sharebert`` imports ``sharebert``, which registers with transformers (torch
and transformers: ~4-12 s of CPU and hundreds of MB per worker, for work that needs a tokenizer). Here the workers
import the runtime package instead, whose import is light.
"""

from __future__ import annotations

import itertools
import os
import signal

import numpy as np

_WORKER: dict = {}  # this process's tokenizer and dtype (:func:`init_worker`, :func:`use_here`)


def encode_lines(backend, lines: list[str], char_level: bool = False) -> np.ndarray:
    """Token ids (int32) of ``lines`` with a ``tokenizers.Tokenizer``, no special tokens. Word level skips
    blank lines and strips each line; character level keeps every character, newlines included."""
    texts = lines if char_level else [t for t in (line.strip() for line in lines) if t]
    if not texts:
        return np.zeros(0, np.int32)
    encodings = backend.encode_batch_fast(texts, add_special_tokens=False)
    return np.fromiter(itertools.chain.from_iterable(e.ids for e in encodings), dtype=np.int32)


def init_worker(tokenizer_json: str, dtype: str, parent: int) -> None:
    """A worker's start: the tokenizer from its JSON, death with the parent, the parent's signals left to it."""
    from tokenizers import Tokenizer

    _die_with_parent(parent)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)  # the parent decides when to stop
    _WORKER.update(tok=Tokenizer.from_str(tokenizer_json), dtype=np.dtype(dtype))


def use_here(backend, dtype) -> None:
    """Tokenize in this process (one worker): :func:`encode_chunk` with ``backend``."""
    _WORKER.update(tok=backend, dtype=np.dtype(dtype))


def encode_chunk(lines: list[str]) -> np.ndarray:
    """Token ids of ``lines`` in the worker's dtype."""
    return encode_lines(_WORKER["tok"], lines).astype(_WORKER["dtype"])


def _die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this worker when its parent dies, kill -9 included (Linux ``prctl``
    ``PR_SET_PDEATHSIG``; elsewhere nothing): workers ignore SIGINT and SIGTERM, so nothing else would end them."""
    import ctypes

    prctl = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)
    if prctl is None:
        return
    prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)
