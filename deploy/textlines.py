"""Reading user text in bounded memory (stdlib only: the torch-free runtime uses it too).

Every reader of user text goes through here, so one line of input costs at most
:data:`MAX_LINE_BYTES` of memory whatever the file holds:

* :func:`check_text_file` names what a path is when it is not a regular file (a folder, a character
  device such as ``/dev/zero``, a FIFO, a socket, a symlink loop) before anything is read;
* :func:`resolve_sources` expands corpus sources (``--train`` / ``--valid`` items) into their files, each checked
  so (``prepare`` calls it before importing the training modules: a bad source is refused without loading torch);
* :func:`text_pieces` (corpora: ``prepare``, ``pretrain --train``, ``distill``) cuts a longer line into
  pieces of at most ``MAX_LINE_BYTES // 4`` characters (at a space or tab in the piece's second half
  when there is one), so a file with no newline is tokenized piece by piece;
* :func:`numbered_lines` (one text per line: ``predict --input``, ``--calibration`` and parity
  sentences) refuses a longer line with :class:`LineTooLong`, naming the input and the line number.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from .options import symlink_loop
from .untrusted import file_kind

MAX_LINE_BYTES = 1 << 20  # 1 MiB: the most one line of text may hold (a text is cut to max_length tokens anyway)
PIECE_CHARS = MAX_LINE_BYTES // 4  # a corpus line is tokenized in pieces of at most this many characters (<= 1 MiB)


class LineTooLong(ValueError):
    """A line over :data:`MAX_LINE_BYTES`; the message names the input and the line number."""


def check_text_file(path: str | Path, what: str = "file") -> Path:
    """``path`` as a ``Path`` when it is a regular file (symlinks followed); else ``FileNotFoundError`` or
    ``ValueError`` whose message says what it is (``--input /dev/zero: a character device, not a regular file``)."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {path}: not found") from None
    except OSError as e:  # a symlink loop, a path through a file, no permission
        raise ValueError(f"{what} {symlink_loop(path) or f'{path}: cannot be read ({e.strerror or e})'}") from None
    if stat.S_ISREG(mode):
        return path
    raise ValueError(f"{what} {path}: {file_kind(mode)}, not a regular file of text")


def text_pieces(text, limit: int = PIECE_CHARS) -> Iterator[str]:
    """The lines of a text stream (``TextIOWrapper``, newlines already translated to ``\\n``) in pieces of at
    most ``limit`` characters; only the last piece of a line ends in ``\\n`` (added when the file lacks it).
    Joined, the pieces are the text exactly; a piece ends after a space or tab when its second half has one."""
    carry = ""
    while True:
        want = limit - len(carry)  # carry < limit / 2, so want > 0
        part = text.readline(want)
        if not part:
            if carry:
                yield carry + "\n"
            return
        piece = carry + part
        carry = ""
        if piece.endswith("\n"):
            yield piece
        elif len(part) < want:  # the end of the file, without a newline
            yield piece + "\n"
        else:
            cut = max(piece.rfind(" ", limit // 2), piece.rfind("\t", limit // 2)) + 1
            cut = cut or len(piece)
            yield piece[:cut]
            carry = piece[cut:]


def numbered_lines(stream, name: str, limit: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes]]:
    """``(line number from 1, line bytes with its newline)`` of a binary stream, each read with at most
    ``limit + 1`` bytes of memory; :class:`LineTooLong` for a longer line (an input without newlines)."""
    number = 0
    while True:
        raw = stream.readline(limit + 1)
        if not raw:
            return
        number += 1
        if len(raw) > limit and not (len(raw) == limit + 1 and raw.endswith(b"\n")):
            raise LineTooLong(
                f"{name} line {number}: longer than {limit} bytes, the most one line of text may "
                f"hold (sharebert_runtime.textlines.MAX_LINE_BYTES); give one text per line"
            )
        yield number, raw


def resolve_sources(items: Iterable[str | Path]) -> list[Path | str]:
    """Expand folders into their files (subfolders and hidden files left out; any other entry that is not a readable
    regular file, such as a symbolic link loop, is refused by name); keep ``hf:`` names; raise for missing paths."""
    out: list[Path | str] = []
    for item in items:
        if isinstance(item, str) and item.startswith("hf:"):
            out.append(item)
            continue
        path = Path(item)
        if path.is_dir():
            files = [
                check_text_file(p, "corpus file")
                for p in sorted(path.iterdir())
                if not p.name.startswith(".") and not p.is_dir()
            ]
            if not files:
                raise ValueError(f"corpus folder {path} holds no files")
            out.extend(files)
        else:
            out.append(check_text_file(path, "corpus file"))
    if not out:
        raise ValueError("no corpus files given")
    return out
