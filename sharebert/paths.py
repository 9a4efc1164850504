"""Where the shared data lives: ``$SHAREBERT_DATA`` or ``../shared/data`` beside the repository."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def data_dir() -> Path:
    """The data folder (GLUE, WikiText-2, vocab, ...); override with ``SHAREBERT_DATA``."""
    env = os.environ.get("SHAREBERT_DATA")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data"


def data_path(*parts: str) -> Path:
    """A path inside :func:`data_dir`, e.g. ``data_path("glue", "SST-2", "dev.tsv")``."""
    return data_dir().joinpath(*parts)


def default_vocab() -> Path:
    return data_path("bert-base-uncased", "vocab.txt")
