"""Command-line option types (stdlib only; the torch-free ``predict`` uses them too): argparse ``type=`` functions
that refuse a value no run can use, so every command says which option is wrong before any work ("argument
--seq-len: must be an integer >= 1, got '0'"). NaN and infinities are never accepted; :func:`path`, the type of
every file or folder option, refuses a symbolic link loop by name (``os.path.exists`` calls it missing).
"""

from __future__ import annotations

import argparse
import errno
import math
import os


def symlink_loop(path) -> str | None:
    """The one message for a ``path`` that is, or passes through, a symbolic link loop (``os.stat`` fails with
    ELOOP), else None."""
    try:
        os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return f"{path} cannot be opened: it is a symbolic link loop"
    except ValueError:  # a NUL byte: not a path the system can name, and no loop
        pass
    return None


def path(text: str) -> str:
    """A file or folder option (read or written; a preset name or ``-`` pass too): ``text`` unchanged, refused
    when it is a symbolic link loop."""
    loop = symlink_loop(text)
    if loop:
        raise argparse.ArgumentTypeError(loop)
    return text


def _number(text: str, kind):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected {'an integer' if kind is int else 'a number'}, got {text}"
        ) from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def int_at_least(least: int):
    """An ``int`` option of at least ``least``."""

    def parse(text: str) -> int:
        value = _number(text, int)
        if value < least:
            raise argparse.ArgumentTypeError(f"must be an integer >= {least}, got {text}")
        return value

    parse.__name__ = f"int_at_least_{least}"
    return parse


MIN_SEQ_LEN = 3  # [CLS], one token, [SEP]
positive_int = int_at_least(1)
seq_len = int_at_least(MIN_SEQ_LEN)
non_negative_int = int_at_least(0)


def finite_float(text: str) -> float:
    """Any finite ``float``."""
    return _number(text, float)


def positive_float(text: str) -> float:
    """A finite ``float`` above 0."""
    value = _number(text, float)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text}")
    return value


MAX_SECONDS = 366 * 86400.0  # a --max-time of more than a year budgets nothing, and its plan prints 300-digit figures


def seconds(text: str) -> float:
    """A ``--max-time``: a finite number of seconds above 0 and at most :data:`MAX_SECONDS`."""
    value = positive_float(text)
    if value > MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_SECONDS:.0f} seconds (a year), got {text}")
    return value


def non_negative_float(text: str) -> float:
    """A finite ``float`` of at least 0."""
    value = _number(text, float)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text}")
    return value


def fraction(text: str) -> float:
    """A finite ``float`` in [0, 1)."""
    value = _number(text, float)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1), got {text}")
    return value
