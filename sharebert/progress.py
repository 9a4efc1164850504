"""Progress on long work: bars on a terminal, plain lines elsewhere.

In a log that is not a terminal (CI, ``nohup``, ``make demo > log``) every bar refresh, and the cursor
codes of nested bars, would flood the file; there :func:`bar` shows nothing and long runs print
periodic plain lines instead (``training.progress.LogLines`` for the Trainer).
"""
from __future__ import annotations

import sys

from tqdm.auto import tqdm


def interactive() -> bool:
    """Whether standard error is a terminal (where bars redraw in place)."""
    return sys.stderr.isatty()


def bar(iterable=None, progress: bool = True, **kwargs):
    """``tqdm(iterable, **kwargs)``, shown only when ``progress`` and on a terminal."""
    return tqdm(iterable, disable=not (progress and interactive()), **kwargs)
