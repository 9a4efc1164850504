"""Where the data lives: ``$SHAREBERT_DATA`` or ``../shared/data`` beside the repository (GLUE, WikiText-2, ...;
present in this workspace, absent where the wheel is installed elsewhere), and the text shipped inside the
package (``sharebert/data/text``: a small default corpus and held-out sentences, CC BY-SA 3.0, its README)."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def data_dir() -> Path:
    """The data folder (GLUE, WikiText-2, vocab, ...); override with ``SHAREBERT_DATA``."""
    env = os.environ.get("SHAREBERT_DATA")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data"


def data_path(*parts: str) -> Path:
    """A path inside :func:`data_dir`, e.g. ``data_path("glue", "SST-2", "dev.tsv")``."""
    return data_dir().joinpath(*parts)


def cache_dir() -> Path:
    """Where sharebert keeps what it can make again but would rather not (the teacher artifacts of ``compress``):
    ``$SHAREBERT_CACHE``, else ``$XDG_CACHE_HOME/sharebert``, else ``~/.cache/sharebert``."""
    env = os.environ.get("SHAREBERT_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sharebert"


def default_vocab() -> Path:
    return data_path("bert-base-uncased", "vocab.txt")


PACKAGED_TEXT = Path(__file__).resolve().parents[1] / "data" / "text"


def packaged_corpus() -> Path:
    """The default training text shipped in the package: 2,482 WikiText-2 sentences (about 300 kB)."""
    return PACKAGED_TEXT / "corpus.txt"


def packaged_search() -> tuple[list[str], list[str], list[int]]:
    """The search set shipped in the package (``search_corpus.txt``, ``search_queries.tsv``; written for sharebert):
    ``(corpus, queries, answers)``: 105 sentences on 20-odd topics, 35 queries each with the 0-based index of
    the sentence that answers it (all-MiniLM-L6-v2's top-1 for every one). Where ``compress`` measures the
    student's top-1 search answer against its teacher's, and what ``sharebert demo`` asks."""
    corpus = [
        line.strip()
        for line in (PACKAGED_TEXT / "search_corpus.txt").read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    rows = [
        line.split("\t")
        for line in (PACKAGED_TEXT / "search_queries.tsv").read_text(encoding="utf-8").splitlines()[1:]
        if line.strip()
    ]
    return corpus, [q for q, _ in rows], [int(a) - 1 for _, a in rows]


def packaged_heldout() -> Path:
    """600 WikiText-2 test sentences shipped in the package, never in :func:`packaged_corpus`: where a student's
    agreement with its teacher is measured, and export's parity sentences when the data folder has none."""
    return PACKAGED_TEXT / "heldout.txt"
