"""One-line error messages (stdlib only; the torch-free runtime uses it too)."""

from __future__ import annotations


def first_line(error: BaseException, limit: int = 200) -> str:
    """The first line of ``error``'s message (at most ``limit`` characters), or its type's name when empty."""
    text = str(error).strip()
    return text.splitlines()[0][:limit] if text else type(error).__name__
