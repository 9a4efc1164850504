"""Counting a file's opens over a run (tests/pipelines/test_run.py and the compress runs' fixtures): every open of one
path, by whichever call made it (``open``, ``io.open``, ``os.open``), from the moment it is set up."""

from __future__ import annotations

import builtins
import io
import os
from pathlib import Path


def count_opens(monkeypatch, path: Path) -> list[str]:
    """The names of the calls that open ``path`` from here on (a list that grows), for as long as ``monkeypatch``
    (a ``pytest.MonkeyPatch``) holds."""
    target, seen = os.path.realpath(path), []

    def counting(name, original):
        def wrapper(file, *args, **kwargs):
            if isinstance(file, (str, bytes, os.PathLike)) and os.path.realpath(file) == target:
                seen.append(name)
            return original(file, *args, **kwargs)

        return wrapper

    monkeypatch.setattr(builtins, "open", counting("open", builtins.open))
    monkeypatch.setattr(io, "open", counting("io.open", io.open))
    monkeypatch.setattr(os, "open", counting("os.open", os.open))
    return seen
