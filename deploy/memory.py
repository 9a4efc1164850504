"""glibc's malloc controls, used to give freed memory back to the system (a no-op elsewhere: musl, macOS).

Freed blocks of a few MB stay in the process after glibc raises its mmap threshold to their size, so a
load that makes and frees many such blocks (the RAM-int8 weights, chunk by chunk) or a large request
would otherwise leave the resident size at its high-water mark.
"""
from __future__ import annotations

import ctypes

M_ARENA_MAX = -8  # mallopt parameter: at most this many malloc arenas (default 8 per core, one per thread)


def _libc():
    try:
        libc = ctypes.CDLL(None)
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


LIBC = _libc()


def give_back() -> None:
    """Return freed heap memory to the system (``malloc_trim``)."""
    if LIBC:
        LIBC.malloc_trim(0)


def limit_arenas(count: int = 2) -> None:
    """At most ``count`` malloc arenas; call before starting threads (each thread would get its own arena and
    keep that arena's freed memory)."""
    if LIBC:
        LIBC.mallopt(M_ARENA_MAX, count)
