"""A teacher's vocabulary cut to the tokens the user's text uses, so a student of any vocabulary fits a budget.

A student's learned parameters are mostly its word-embedding table: a 50,265-token (RoBERTa) or 250,002-token
(XLM-R) vocabulary leaves no room under a few million parameters. :func:`cut_vocabulary` keeps the special tokens,
a fallback (byte-level BPE: its 256-byte alphabet, so no text is lost; WordPiece and Unigram: their unknown token),
and the tokens the training text uses, most frequent first, up to the size asked for; the tokenizer's own
``tokenizer.json`` is rewritten to the kept tokens (renumbered in the teacher's order), so transformers and the
torch-free runtime both load it natively and the student's table has one row per kept token.

On text whose tokens are all kept, the cut tokenizer gives exactly the teacher's tokens: WordPiece's longest match
finds the same pieces; a byte-level BPE keeps every merge that builds a kept token (the closure below), so the same
merges apply in the same order; Unigram's best segmentation uses only kept pieces, all still there with their
scores. Other text falls back to the unknown token (WordPiece: the whole word) or, byte-level, to smaller pieces.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, replace

MODELS = ("WordPiece", "BPE", "Unigram")
# Fewer distinct tokens than this (or a tenth of a small teacher's vocabulary) in the training text is a handful,
# said as a warning (CutVocabulary.thin): the packaged corpus (2,000+ WikiText lines) uses 8,247 of
# all-MiniLM-L6-v2's 30,522 tokens, its first 100 lines 917
FEW_TOKENS = 500


@dataclass(frozen=True)
class CutVocabulary:
    """The cut: ``tokenizer`` (transformers fast tokenizer over the kept tokens), ``kept`` (the teacher's id of each
    student id, in order), the teacher's vocabulary size, and the share of the text's tokens kept."""

    tokenizer: object
    kept: tuple[int, ...]
    teacher_size: int
    coverage: float
    used: int  # distinct tokens the text uses
    rows: int = 0  # the student's word-table rows (0: one per kept token); more are its generated weights' source
    unknown: float = 0.0  # the share of the text's tokens that are the teacher's unknown token

    @property
    def table_rows(self) -> int:
        return max(self.rows, len(self.kept))

    def describe(self) -> str:
        bank = (
            f"; the student's table has {self.table_rows:,} rows, the rest the source its layers' weights are "
            "generated from"
            if self.table_rows > len(self.kept)
            else ""
        )
        return (
            f"vocabulary cut from {self.teacher_size:,} to {len(self.kept):,} tokens ({self.used:,} used by the "
            f"training text, {self.coverage:.2%} of its tokens kept){bank}{self.thin()}"
        )

    def thin(self) -> str:
        """A warning, when the training text is covered by a handful of tokens (:data:`FEW_TOKENS`) or is mostly the
        unknown token: a student distilled on it learns little of its teacher (it was said nowhere: 6 tokens of a
        100 MB one-line file, 3 of 2,000 lines of emoji, and a run of exit 0 at STS-B 0.02); else ''."""
        if self.used >= min(FEW_TOKENS, self.teacher_size // 10) and self.unknown <= 0.5:
            return ""
        unknown = f", {self.unknown:.0%} of its tokens the unknown token" if self.unknown > 0.05 else ""
        return (
            f". WARNING: the training text uses only {self.used:,} distinct tokens of the teacher's "
            f"{self.teacher_size:,}{unknown}: a student distilled on it learns little of its teacher; give more, "
            "varied text in the teacher's language (--train FILE of thousands of sentences)"
        )

    def as_dict(self) -> dict:
        return {
            "teacher_size": self.teacher_size,
            "size": len(self.kept),
            "used": self.used,
            "coverage": self.coverage,
            "table_rows": self.table_rows,
        }


def token_counts(tokenizer, sentences) -> Counter:
    """How often each teacher token id occurs in ``sentences`` (special tokens included, as the model sees them)."""
    counts = Counter()
    for start in range(0, len(sentences), 1000):
        for ids in tokenizer(list(sentences[start : start + 1000]), truncation=False, verbose=False)["input_ids"]:
            counts.update(ids)
    return counts


def _model(tokenizer) -> dict:
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    if spec["model"]["type"] not in MODELS:
        raise ValueError(
            f"the teacher's tokenizer is a {spec['model']['type']} model; a vocabulary cut handles {', '.join(MODELS)}"
        )
    return spec


def _pairs(merge) -> tuple[str, str]:
    return tuple(merge.split(" ", 1)) if isinstance(merge, str) else tuple(merge)


def _builders(model: dict) -> dict[str, list[tuple[str, str]]]:
    """BPE: the merges that build each token (``result -> [(left, right), ...]``)."""
    prefix = model.get("continuing_subword_prefix") or ""
    out: dict[str, list] = {}
    for merge in model.get("merges") or []:
        a, b = _pairs(merge)
        out.setdefault(a + (b[len(prefix) :] if prefix and b.startswith(prefix) else b), []).append((a, b))
    return out


def _closure(tokens: set, builders: dict) -> set:
    """``tokens`` and every token a merge building one of them starts from, recursively."""
    todo, seen = list(tokens), set(tokens)
    while todo:
        for pair in builders.get(todo.pop(), ()):
            for part in pair:
                if part not in seen:
                    seen.add(part)
                    todo.append(part)
    return seen


def _fixed(tokenizer, spec: dict) -> set[int]:
    """Ids always kept: the special and added tokens, the unknown token, a byte-level BPE's 256-byte alphabet."""
    from tokenizers import pre_tokenizers

    ids = {t["id"] for t in spec.get("added_tokens") or []} | set(tokenizer.all_special_ids)
    vocab = tokenizer.backend_tokenizer.get_vocab(with_added_tokens=False)
    if spec["model"]["type"] == "BPE" and "ByteLevel" in json.dumps(spec.get("pre_tokenizer")):
        ids |= {vocab[c] for c in pre_tokenizers.ByteLevel.alphabet() if c in vocab}
    return ids


def choose_tokens(tokenizer, counts: Counter, size: int | None = None) -> list[int]:
    """The teacher ids to keep, sorted: :func:`_fixed`, then the used tokens most frequent first (with the tokens
    their BPE merges start from) while they fit in ``size`` (None: every used token)."""
    spec = _model(tokenizer)
    kept = _fixed(tokenizer, spec)
    if size is not None and size < len(kept):
        raise ValueError(
            f"--vocab-size {size} is below the {len(kept)} special and fallback tokens the teacher's tokenizer needs"
        )
    builders = _builders(spec["model"]) if spec["model"]["type"] == "BPE" else {}
    to_id = tokenizer.backend_tokenizer.get_vocab(with_added_tokens=True)
    to_token = {i: t for t, i in to_id.items()}
    for tid, _ in counts.most_common():
        if tid in kept:
            continue
        new = {to_id[t] for t in _closure({to_token[tid]}, builders) if t in to_id} - kept
        if size is not None and len(kept) + len(new) > size:
            continue  # a rarer token with fewer parts may still fit
        kept |= new
    return sorted(kept)


def cut_tokenizer(tokenizer, kept: list[int]):
    """The teacher's tokenizer over the ``kept`` teacher ids only (student id ``i`` is teacher id ``kept[i]``): its
    ``tokenizer.json`` rewritten (vocabulary, BPE merges, added tokens, post-processor ids), every other setting the
    teacher's, as a transformers fast tokenizer with the teacher's special tokens and inputs."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    spec = _model(tokenizer)
    remap = {t: i for i, t in enumerate(kept)}
    _cut_model(spec["model"], tokenizer, kept, remap)
    for added in spec.get("added_tokens") or []:
        added["id"] = remap[added["id"]]
    _remap_ids(spec.get("post_processor"), remap)
    if spec.get("padding"):
        spec["padding"]["pad_id"] = remap.get(spec["padding"]["pad_id"], 0)
    special = {k: v for k, v in tokenizer.special_tokens_map.items() if k != "additional_special_tokens"}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
        model_max_length=tokenizer.model_max_length,
        model_input_names=list(tokenizer.model_input_names),
        padding_side=tokenizer.padding_side,
        truncation_side=tokenizer.truncation_side,
        **special,
    )


def _cut_model(model: dict, tokenizer, kept: list[int], remap: dict[int, int]) -> None:
    """The tokenizer model's vocabulary (and a BPE model's merges, a Unigram model's unk_id) over ``kept``, in place."""
    to_token = {i: t for t, i in tokenizer.backend_tokenizer.get_vocab(with_added_tokens=True).items()}
    new_id = {to_token[t]: i for i, t in enumerate(kept)}
    if model["type"] == "Unigram":
        model["vocab"] = [model["vocab"][t] for t in kept if t < len(model["vocab"])]
        if model.get("unk_id") is not None:
            model["unk_id"] = remap[model["unk_id"]]
    else:
        model["vocab"] = {tok: new_id[tok] for tok in model["vocab"] if tok in new_id}
    if model["type"] == "BPE":
        model["merges"] = [
            m for m in model.get("merges") or [] if all(p in new_id for p in _pairs(m)) and _merged(model, m) in new_id
        ]


def _merged(model: dict, merge) -> str:
    a, b = _pairs(merge)
    prefix = model.get("continuing_subword_prefix") or ""
    return a + (b[len(prefix) :] if prefix and b.startswith(prefix) else b)


def _remap_ids(proc, remap: dict) -> None:
    """The special token ids of a post-processor (Template, Roberta, Bert, or a Sequence of them), in place."""
    if not isinstance(proc, dict):
        return
    for sub in proc.get("processors") or []:
        _remap_ids(sub, remap)
    for name in ("cls", "sep"):
        if isinstance(proc.get(name), list) and len(proc[name]) == 2:
            proc[name][1] = remap[proc[name][1]]
    for entry in (proc.get("special_tokens") or {}).values():
        entry["ids"] = [remap[i] for i in entry["ids"]]


def cut_vocabulary(tokenizer, sentences, size: int | None = None) -> CutVocabulary:
    """The cut of the module docstring over ``sentences`` (the training text), at most ``size`` tokens."""
    counts = token_counts(tokenizer, sentences)
    kept = choose_tokens(tokenizer, counts, size)
    keep = set(kept)
    total = sum(counts.values())
    coverage = sum(n for t, n in counts.items() if t in keep) / total if total else 1.0
    specials = set(tokenizer.all_special_ids) - {tokenizer.unk_token_id}  # [CLS], [SEP]: on every line, not the text's
    text = sum(n for t, n in counts.items() if t not in specials)
    unknown = counts[tokenizer.unk_token_id] / text if text and tokenizer.unk_token_id is not None else 0.0
    return CutVocabulary(
        cut_tokenizer(tokenizer, kept),
        tuple(kept),
        len(tokenizer),
        coverage,
        len(set(counts) - specials),
        unknown=unknown,
    )


def plan_vocabulary(  # 7: compress's plan passes what it knows; training/ may not import pipelines.run's objects
    tokenizer, shape: dict, limits: dict, fits, sentences, size: int | None = None, say=print
) -> CutVocabulary | None:
    """The cut a compress run needs, or None: ``size`` forces one (``--vocab-size``); else the teacher's vocabulary
    is cut only when no student with it fits ``limits`` (``fits(shape, limits)`` raises ``ValueError``), to every
    token the text uses, or the most frequent of them that fit. ``sentences()``: the training text (read on need).

    A ShareBERT generates its layers' weights from its word table, so a table needs enough rows for them: a cut
    smaller than that keeps a larger table (:func:`table_rows`), its extra rows a source of weights, never looked up."""
    if size is not None and size > len(tokenizer):
        raise ValueError(
            f"--vocab-size {size:,} is more than the teacher's {len(tokenizer):,} tokens: give at most "
            f"{len(tokenizer):,} (the cut keeps the tokens the training text uses, up to that many)"
        )
    if size is None:
        try:
            fits(shape, limits)
            return None
        except ValueError as e:
            full = e
    text = sentences()
    cut = cut_vocabulary(tokenizer, text, size)
    rows = table_rows(fits, shape, limits, len(cut.kept))
    if rows is None and size is None:  # even every used token is too many: the most frequent that fit
        ladder = _ladder(len(_fixed(tokenizer, _model(tokenizer))), len(cut.kept))
        rows = next((n for n in reversed(ladder) if _fits(fits, shape, limits, n)), None)
        if rows is None:
            raise full
        cut = cut_vocabulary(tokenizer, text, rows)
    cut = replace(cut, rows=rows or len(cut.kept))
    say(cut.describe())
    return cut


def table_rows(fits, shape: dict, limits: dict, tokens: int) -> int | None:
    """The fewest word-table rows, at least ``tokens`` and at most the teacher's vocabulary, of a student that fits
    (None when none does)."""
    return next(
        (n for n in _ladder(tokens, max(tokens, int(shape["vocab_size"]))) if _fits(fits, shape, limits, n)), None
    )


def _ladder(low: int, high: int, step: float = 1.05) -> list[int]:
    """Sizes from ``low`` to ``high``, 5% apart (the budget's fit is not monotone in the size: too few rows cannot
    source a layer's weights, too many exceed the limits)."""
    out, n = [], low
    while n < high:
        out.append(n)
        n = max(n + 1, int(n * step))
    return out + [high]


def _fits(fits, shape: dict, limits: dict, size: int) -> bool:
    try:
        fits({**shape, "vocab_size": size}, limits)
        return True
    except ValueError:
        return False
