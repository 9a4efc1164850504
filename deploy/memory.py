"""Giving memory back to the system: glibc's malloc controls (a no-op elsewhere: musl, macOS) and, on Linux, the
library code pages a load runs once.

Freed blocks of a few MB stay in the process after glibc raises its mmap threshold to their size, so a
load that makes and frees many such blocks (the RAM-int8 weights, chunk by chunk) or a large request
would otherwise leave the resident size at its high-water mark.

Most of what a small artifact's load adds to the resident size is not data but code: ONNX Runtime's first
session in a process runs its kernel registry and graph passes (8.3 MB of its library's pages, whatever the
graph), the tokenizer's JSON parse 1.9 MB of the tokenizers library. :func:`release_code` unmaps those pages
from the process; they stay in the system's page cache (shared, read-only), and the next request maps back
the few it runs (docs/DEVICE.md "Memory").
"""

from __future__ import annotations

import ctypes
import re
import sys
from pathlib import Path

M_ARENA_MAX = -8  # mallopt parameter: at most this many malloc arenas (default 8 per core, one per thread)
MADV_DONTNEED = 4  # Linux madvise: unmap the pages; a file's page is read back from the page cache on its next use
# The packages whose shared libraries a load runs once (ORT's kernel registry and graph passes, the tokenizer parse)
CODE_PACKAGES = ("onnxruntime", "tokenizers")
_FIELD = {name: re.compile(rf"^{name}: +(\d+) kB", re.M) for name in ("Rss", "Anonymous")}


def _libc():
    try:
        libc = ctypes.CDLL(None)
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


LIBC = _libc()


def _madvise():
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes, madvise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return madvise


MADVISE = _madvise()


def status(key: str) -> int:
    """Bytes of one ``/proc/self/status`` field (``VmRSS``, ``VmHWM``); off Linux, the peak (``ru_maxrss``), the one
    figure every system keeps."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))
    except (OSError, StopIteration):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def give_back() -> None:
    """Return freed heap memory to the system (``malloc_trim``)."""
    if LIBC:
        LIBC.malloc_trim(0)


def limit_arenas(count: int = 2) -> None:
    """At most ``count`` malloc arenas; call before starting threads (each thread would get its own arena and
    keep that arena's freed memory)."""
    if LIBC:
        LIBC.mallopt(M_ARENA_MAX, count)


def _library_mappings(folders: list[str]) -> list[tuple[int, int, int]]:
    """``(start, end, resident kB)`` of each read-only mapping of a file under ``folders`` that holds no page of
    its own (``Anonymous: 0`` in ``/proc/self/smaps``: no copy-on-write page, e.g. relocated data), so its
    pages are exactly the file's."""
    try:
        with open("/proc/self/maps") as f:
            maps = f.read().splitlines()
        with open("/proc/self/smaps") as f:
            smaps = f.read()
    except OSError:  # not Linux
        return []
    found = []
    for line in maps:  # "start-end perms offset device inode path"
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or "w" in fields[1] or not fields[5].startswith(tuple(folders)):
            continue
        at = smaps.find(line.split()[0] + " ")  # its entry: the header, then one "Name: value kB" line per field
        entry = smaps[at : smaps.find("VmFlags", at)] if at >= 0 else ""
        rss, anon = _FIELD["Rss"].search(entry), _FIELD["Anonymous"].search(entry)
        if rss and anon and int(anon[1]) == 0 and int(rss[1]):
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            found.append((lo, hi, int(rss[1])))
    return found


def release_code(packages: tuple[str, ...] = CODE_PACKAGES) -> int:
    """Unmap from this process the resident pages of the shared libraries of ``packages`` (those imported) that are
    the files' own pages (read-only mappings without a copy-on-write page); return the kB released (0 off
    Linux). Safe at any time: a page is mapped back from the page cache when it runs again (a minor fault)."""
    if MADVISE is None:
        return 0
    folders = [
        str(Path(sys.modules[p].__file__).resolve().parent) + "/"
        for p in packages
        if getattr(sys.modules.get(p), "__file__", None)
    ]
    released = 0
    for lo, hi, kb in _library_mappings(folders) if folders else []:
        if MADVISE(lo, hi - lo, MADV_DONTNEED) == 0:
            released += kb
    return released


def settle() -> None:
    """After a load phase: freed heap and load-only library code back to the system."""
    give_back()
    release_code()
