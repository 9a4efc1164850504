"""The sentences an embedding distillation reads: ``--train`` text split into sentences (default: WikiText-2's
training text), a prepared folder's packed blocks as sentences, their batches, and STS-B dev, the score of a
student's sentence vectors (Spearman of cosine with the gold)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

from ..formats.paths import data_path
from .sentence_vectors import encode

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")


def split_sentences(line: str) -> list[str]:
    """A paragraph's sentences (split after ``.!?`` before a capital, digit or quote); headings and blanks dropped."""
    line = line.strip()
    if not line or line.startswith("="):
        return []
    return [s for s in _SENTENCE_END.split(line) if len(s.split()) >= 3]


def default_corpus() -> list[Path]:
    """Unlabelled sentences of the data folder: WikiText-2 (validation split), the SST-2 and STS-B training
    sentences (text only, no labels or scores; STS-B dev, the quality check, is never read for training), those of
    them it holds; where it holds none (the wheel installed elsewhere), the corpus shipped in the package
    (``paths.packaged_corpus``: 2,482 WikiText-2 sentences)."""
    from ..formats.paths import packaged_corpus

    files = [
        data_path("wikitext-2-raw", "wiki.valid.raw"),
        data_path("glue", "STS-B", "train.tsv"),
        data_path("glue", "SST-2", "train.tsv"),
    ]
    return [f for f in files if f.is_file()] or [packaged_corpus()]


def sts_available() -> bool:
    """Whether the data folder holds STS-B dev (the sentence-embedding score; optional everywhere)."""
    return data_path("glue", "STS-B", "dev.tsv").is_file()


def read_sentences(sources, limit: int | None = None) -> list[str]:
    """Sentences of text files (one paragraph per line, split into sentences) or GLUE ``.tsv`` files (their
    text columns by header name, e.g. SST-2's ``sentence``, STS-B's ``sentence1``/``sentence2``, or CoLA's
    headerless layout: ``glue.text_fields``), in order, duplicates dropped, at most ``limit``. A ``.tsv``
    that fits no GLUE layout is a ``ValueError`` naming it."""
    from sharebert_runtime.textlines import resolve_sources

    from .corpus import iter_lines
    from .glue import text_fields

    seen, out = set(), []
    for src in resolve_sources(sources):
        columns = None
        for line in iter_lines(src):
            if isinstance(src, Path) and src.suffix == ".tsv":
                fields = line.rstrip("\r\n").split("\t")
                if columns is None:
                    found = text_fields(fields)
                    if found is None:
                        raise ValueError(
                            f"{src}: a .tsv needs a GLUE header naming its text column (e.g. "
                            f"'sentence', 'sentence1') or CoLA's 4 fields; its first line has "
                            f"{len(fields)} field(s) and none of those names (a plain text file: "
                            f"give it another suffix)"
                        )
                    columns, is_header = found
                    if is_header:
                        continue
                parts = [fields[i].strip() for i in columns if i < len(fields)]
            else:
                parts = split_sentences(line)
            for s in parts:
                if s and s not in seen:
                    seen.add(s)
                    out.append(s)
                    if limit and len(out) >= limit:
                        return out
    if not out:
        raise ValueError(f"no sentences in {', '.join(map(str, sources))}")
    return out


class BlockDataset(torch.utils.data.Dataset):
    """Packed sequences of a prepared folder (``distill.teacher_blocks``, read on demand) as sentences: item ``i``
    is ``{"input_ids", "attention_mask"}`` of block ``i`` (``seq_len`` tokens, no padding)."""

    def __init__(self, blocks):
        self.blocks = blocks

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> dict:
        ids = self.blocks[i].tolist()
        return {"input_ids": ids, "attention_mask": [1] * len(ids)}


class SentenceDataset(torch.utils.data.Dataset):
    """Tokenized sentences (teacher's tokenizer, truncated to ``seq_len``)."""

    def __init__(self, tokenizer, sentences: list[str], seq_len: int):
        enc = tokenizer(sentences, truncation=True, max_length=seq_len)
        self.items = [{k: enc[k][i] for k in enc.keys()} for i in range(len(sentences))]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]


def sts_dev(limit: int | None = None):
    """The STS-B dev pairs every sentence-embedding score here is on: the first ``limit`` (all 1,500 without)."""
    from .glue import read_split

    return read_split("stsb", data_path("glue", "STS-B"), "dev").head(limit)


def sts_spearman(  # 7: sentence_vectors.encode's encoder, recipe and length, then the pairs' limit and progress
    model, tokenizer, pooling: str, head=None, seq_len: int = 128, limit: int | None = None, desc: str | None = None
) -> float:
    """Spearman correlation of cosine similarities with the gold scores on :func:`sts_dev` (first ``limit``
    pairs); ``desc``: show progress under that name."""
    from .metrics import cosine_spearman

    split = sts_dev(limit)
    a, b = (
        encode(model, tokenizer, texts, pooling, head, seq_len, desc=desc and f"{desc} (STS-B dev, {side})")
        for side, texts in (("first", split.text_a), ("second", split.text_b))
    )
    return cosine_spearman(a, b, split.labels)


def sts_scorer(score_sts: bool, tokenizer, pooling: str, seq_len: int, eval_limit: int | None, progress: bool):
    """``score(model, head, who, tok=tokenizer)``: the STS-B dev Spearman (:func:`sts_spearman`), None when
    the run does not score."""

    def score(model, head, who, tok=tokenizer):
        if not score_sts:
            return None
        return sts_spearman(model, tok, pooling, head, seq_len, eval_limit, who if progress else None)

    return score


class SentenceCollator:
    """Pads token fields (the teacher's tokenizer) and stacks the teacher's vectors."""

    def __init__(self, tokenizer):
        from transformers import DataCollatorWithPadding

        self.pad = DataCollatorWithPadding(tokenizer)

    def __call__(self, features: list[dict]) -> dict:
        targets = [f.pop("teacher_logits") for f in features] if "teacher_logits" in features[0] else None
        batch = self.pad(features)
        if targets is not None:
            batch["teacher_logits"] = torch.tensor(np.asarray(targets), dtype=torch.float32)
        return batch
