"""Reading the files a model folder or an artifact names, as untrusted input (stdlib only: deploy uses it too).

Every file a folder names (``config.json``, the tokenizer files, the sentence-transformers recipe files,
Dense weights, manifests, ``metrics.json``) is read through here, so whatever sits under that name:

* only a regular file is read (symlinks followed): a folder, FIFO, device, socket, a link to one or a
  dangling link is an error naming the file and what it is, never "absent" (:func:`optional_file` says
  absent only when nothing at all is there). The type is checked with ``os.stat`` before opening, and the
  file is opened non-blocking and checked again, so a FIFO never blocks, even one swapped in between;
* at most a named cap of bytes per kind is read (:data:`JSON_BYTES`, :data:`TOKENIZER_BYTES`, ...): a huge
  file is refused by its size, never read whole;
* JSON is strict (no ``NaN``/``Infinity``, no duplicate keys, bounded nesting) and its errors name the file;
* :func:`int_field`, :func:`bool_field` and :func:`number_field` refuse a wrong-typed field naming file and field.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path

from .options import symlink_loop

JSON_BYTES = 16 << 20  # a config, recipe, tokenizer settings or metrics file; a manifest with its checksums
# tokenizer.json, vocab.txt, merges: a 250k-token multilingual vocabulary is ~20 MB, Gemma's 256k tokens 34 MB. The
# tokenizers library holds about 5x a tokenizer.json's bytes while it parses one: a 400 MB file reached 2.1 GB
TOKENIZER_BYTES = 64 << 20
RESULT_JSON_BYTES = 256 << 20  # the JSON files our runs write (trainer state, logs, reports)

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)


def file_kind(mode: int) -> str:
    """What an ``st_mode`` that is not a regular file is, in words ("a FIFO (named pipe)", ...)."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _label(path: Path, what: str) -> str:
    return f"{path} ({what})" if what else str(path)


def regular_file(path: str | Path, what: str = "") -> int:
    """The size of ``path`` when it is a regular file (symlinks followed); else ``FileNotFoundError`` (nothing
    there) or ``ValueError`` saying what it is. ``what`` says which file it is ("the Pooling module's config")."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        dangling = os.path.islink(path)
        if dangling:
            raise ValueError(f"{_label(path, what)} is a link to a missing file ({os.readlink(path)})") from None
        raise FileNotFoundError(f"{_label(path, what)} not found") from None
    except OSError as e:  # a symlink loop, a path through a file, no permission
        raise ValueError(symlink_loop(path) or f"{_label(path, what)} cannot be read ({e.strerror or e})") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{_label(path, what)} is {file_kind(st.st_mode)}, not a regular file")
    return st.st_size


def optional_file(path: str | Path, what: str = "") -> Path | None:
    """``path`` when it is a regular file, None when nothing at all is there; anything else under that name
    (a folder, FIFO, device, dangling link) is an error as in :func:`regular_file`, never "absent"."""
    if not os.path.lexists(path):
        return None
    regular_file(path, what)
    return Path(path)


def size_text(size: int) -> str:
    """A file size in words: bytes below 1 MB, else MB (as a user reads ``ls -lh``)."""
    return f"{size} bytes" if size < 1 << 20 else f"{size / (1 << 20):,.1f} MB"


def check_size(path: str | Path, size: int, limit: int, what: str = "") -> None:
    """``ValueError`` "<file> has N MB, more than the M MB such a file may hold" when ``size`` exceeds ``limit``: the
    one wording of every cap, said before anything is read."""
    if size > limit:
        raise ValueError(
            f"{_label(Path(path), what)} has {size_text(size)}, more than the {size_text(limit)} such a file may hold"
        )


def read_bytes(path: str | Path, what: str = "", limit: int = JSON_BYTES) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them (a larger file is refused by its size,
    unread). Opened non-blocking and checked again after opening: a FIFO never blocks."""
    path = Path(path)
    check_size(path, regular_file(path, what), limit, what)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise ValueError(f"{_label(path, what)} cannot be read ({e.strerror or e})") from None
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced since the check above
            raise ValueError(f"{_label(path, what)} is {file_kind(os.fstat(fd).st_mode)}, not a regular file")
        data = f.read(limit + 1)
    if len(data) > limit:  # it grew since the check
        raise ValueError(f"{_label(path, what)} holds more than the {limit} bytes such a file may hold")
    return data


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _unique_keys(pairs: list) -> dict:
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"key {key!r} appears twice")
        seen[key] = value
    return seen


def parse_json(text: str | bytes, where: str, allow_nan: bool = False):
    """Strict ``json.loads(text)``: ``ValueError`` ``"<where> is not valid JSON (...)"`` for bad syntax, text
    that is not UTF-8, ``NaN``/``Infinity`` (unless ``allow_nan``: transformers' own trainer state may hold
    them), a duplicate key, numbers of more than 4300 digits or nesting deeper than Python's recursion limit."""
    try:
        return json.loads(text, parse_constant=None if allow_nan else _no_constant, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise ValueError(f"{where} is not valid JSON (nested too deeply)") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, too many digits, the hooks above
        raise ValueError(f"{where} is not valid JSON ({e})") from None


def read_json(path: str | Path, what: str = "", limit: int = JSON_BYTES, allow_nan: bool = False):
    """The JSON value in ``path``, read as :func:`read_bytes` does and parsed as :func:`parse_json` does."""
    return parse_json(read_bytes(path, what, limit), _label(Path(path), what), allow_nan)


def read_json_object(path: str | Path, what: str = "", limit: int = JSON_BYTES) -> dict:
    """:func:`read_json` of a file that must hold a JSON object."""
    value = read_json(path, what, limit)
    if not isinstance(value, dict):
        raise ValueError(f"{_label(Path(path), what)} is not a JSON object (it holds a {type(value).__name__})")
    return value


def int_field(value, path, key: str, minimum: int | None = 1) -> int:
    """``value`` if it is an integer (not a bool) of at least ``minimum``, else ``ValueError`` naming file and field."""
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
        bound = f" >= {minimum}" if minimum is not None else ""
        raise ValueError(f"{path}: {key} must be an integer{bound}, got {value!r}")
    return value


def bool_field(value, path, key: str) -> bool:
    """``value`` when it is true or false; else ``ValueError`` naming file and field."""
    if not isinstance(value, bool):
        raise ValueError(f"{path}: {key} must be true or false, got {value!r}")
    return value


def number_field(value, path, key: str) -> float:
    """``value`` when it is a finite number (not a bool); else ``ValueError`` naming file and field."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{path}: {key} must be a finite number, got {value!r}")
    return value


def str_field(value, path, key: str) -> str:
    """``value`` when it is a string; else ``ValueError`` naming file and field."""
    if not isinstance(value, str):
        raise ValueError(f"{path}: {key} must be a string, got {value!r}")
    return value
