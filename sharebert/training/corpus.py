"""Pre-training corpora: read text, tokenize it with the model folder's tokenizer, pack full sequences.

Sources (``--train`` / ``--valid`` items):

* a plain-text file, any newline style (``\\n``, ``\\r\\n``, ``\\r``), optionally ``.bz2`` / ``.gz``;
* a MediaWiki XML dump (``.xml``, ``.xml.bz2``, or any file whose content starts with ``<mediawiki``),
  streamed page by page with the wiki markup stripped (main-namespace articles, no redirects);
* a folder (its files, sorted by name);
* ``hf:NAME[:CONFIG][:SPLIT]``, a Hugging Face ``datasets`` dataset (its ``text`` column), only
  when ``datasets`` is installed and the dataset is reachable.

Every source must exist, be a regular file (or a folder of them), be readable and hold text; otherwise
``FileNotFoundError`` / ``ValueError`` names the file before any training starts. Lines are read in
bounded pieces (:mod:`sharebert_runtime.textlines`): a file without a newline costs no more memory than any other.
"""

from __future__ import annotations

import bz2
import gzip
import html
import io
import itertools
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import torch

from sharebert_runtime.textlines import text_pieces
from sharebert_runtime.token_ids import encode_lines

from ..formats.bars import bar as progress_bar

CHAR_SPECIALS = ("[PAD]", "[UNK]")


# -- reading ------------------------------------------------------------------------------------
def _open_binary(path: Path):
    with open(path, "rb") as f:
        magic = f.read(3)
    if magic == b"BZh":
        return bz2.open(path, "rb")
    if magic[:2] == b"\x1f\x8b":
        return gzip.open(path, "rb")
    return open(path, "rb")


def _is_mediawiki(path: Path) -> bool:
    with _open_binary(path) as f:
        head = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    return head.startswith(b"<mediawiki") or (head.startswith(b"<?xml") and b"<mediawiki" in head)


def sniff_text(path: Path) -> None:
    """``ValueError`` naming ``path`` when its (decompressed) start holds NUL bytes or is not UTF-8."""
    try:
        with _open_binary(path) as f:
            head = f.read(1 << 16)
    except (OSError, EOFError) as e:
        raise ValueError(f"cannot read corpus file {path}: {e}") from e
    try:
        head.decode("utf-8")
        utf8 = True
    except UnicodeDecodeError as e:
        utf8 = e.start >= len(head) - 3  # only a character cut at the end of the sample
    if b"\x00" in head or not utf8:
        raise ValueError(f"corpus file {path} is binary, not UTF-8 text")


def iter_lines(source: Path | str) -> Iterator[str]:
    """The text of one source as lines ending in ``\\n`` (newlines normalised, markup stripped); a line longer than
    :data:`~sharebert_runtime.textlines.PIECE_CHARS` comes in pieces (:func:`~sharebert_runtime.textlines.text_pieces`),
    only the last ending in ``\\n``, so memory stays bounded for a file without newlines."""
    if isinstance(source, str):
        yield from _iter_dataset(source)
        return
    sniff_text(source)
    try:
        if _is_mediawiki(source):
            yield from _iter_mediawiki(source)
        else:
            with _open_binary(source) as raw:
                text = io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline=None)
                yield from text_pieces(text)
    except (OSError, EOFError, ET.ParseError) as e:
        raise ValueError(f"cannot read corpus file {source}: {e}") from e


def _iter_dataset(spec: str) -> Iterator[str]:
    try:
        import datasets
    except ImportError as e:
        raise ValueError(f"{spec}: reading a datasets name needs `pip install datasets` (and network access)") from e
    parts = spec[3:].split(":")
    name, config = parts[0], (parts[1] or None) if len(parts) > 1 else None
    split = parts[2] if len(parts) > 2 else "train"
    try:
        ds = datasets.load_dataset(name, config, split=split)
    except Exception as e:  # network, unknown name, missing config: all mean "cannot use it"
        raise ValueError(f"cannot load dataset {spec}: {e}") from e
    if "text" not in ds.column_names:
        raise ValueError(f"dataset {spec} has no 'text' column (columns: {ds.column_names})")
    for text in ds["text"]:
        yield from (line + "\n" for line in text.splitlines())


def _iter_mediawiki(path: Path) -> Iterator[str]:
    with _open_binary(path) as f:
        context = ET.iterparse(f, events=("start", "end"))
        _, root = next(context)
        for event, elem in context:
            if event != "end" or not elem.tag.endswith("}page") and elem.tag != "page":
                continue
            fields = {child.tag.rsplit("}", 1)[-1]: child for child in elem.iter()}
            ns = fields.get("ns")
            text = fields.get("text")
            if (ns is None or (ns.text or "0").strip() == "0") and "redirect" not in fields and text is not None:
                title = fields["title"].text if "title" in fields else ""
                body = strip_wiki_markup(text.text or "")
                if body and not body.lower().startswith(("#redirect", "redirect")):
                    yield f"{title}\n"
                    yield from (line + "\n" for line in body.split("\n"))
            root.clear()


_TEMPLATE = re.compile(r"\{\{[^{}]*\}\}")
_TABLE = re.compile(r"\{\|[^{}]*?\|\}", re.S)
_LINK = re.compile(r"\[\[([^\[\]]*)\]\]")
_DROPPED_LINK = re.compile(r"^(?:file|image|category|media|[a-z\-]{2,12}):", re.I)  # files, categories, other languages


def _link_label(m: re.Match) -> str:
    """``[[target|label]]`` -> label, ``[[target]]`` -> target, ``[[File:...]]`` -> ''."""
    inner = m.group(1)
    return "" if _DROPPED_LINK.match(inner) else inner.rsplit("|", 1)[-1]


_FLAT = [
    (re.compile(r"<!--.*?-->", re.S), ""),
    (re.compile(r"<ref[^>/]*/>", re.I), ""),
    (re.compile(r"<ref[^>]*>.*?</ref>", re.I | re.S), ""),
    (re.compile(r"<(math|gallery|timeline|score|syntaxhighlight|source)[^>]*>.*?</\1>", re.I | re.S), ""),
    (re.compile(r"\[(?:https?|ftp)://[^\s\]]+\s*([^\]]*)\]"), r"\1"),  # [url label] -> label
    (re.compile(r"'{2,}"), ""),  # bold / italic
    (re.compile(r"^=+\s*(.*?)\s*=+\s*$", re.M), r"\1"),  # headings
    (re.compile(r"^[*#:;]+\s*", re.M), ""),  # list / indent markers
    (re.compile(r"</?[a-zA-Z][^>]*>"), ""),  # remaining HTML tags
    (re.compile(r"__[A-Z]+__"), ""),  # magic words (__TOC__)
    (re.compile(r"[ \t]+"), " "),
    (re.compile(r"\n\s*\n+"), "\n"),
]


def strip_wiki_markup(text: str) -> str:
    """Plain prose from MediaWiki markup: templates, tables, refs, files, categories removed; links -> labels."""
    text = html.unescape(text)
    n = 1
    while n:  # innermost templates, tables and links first, until nothing nested is left
        text, n1 = _TEMPLATE.subn("", text)
        text, n2 = _TABLE.subn("", text)
        text, n3 = _LINK.subn(_link_label, text)
        n = n1 + n2 + n3
    for pattern, repl in _FLAT:
        text = pattern.sub(repl, text)
    text = html.unescape(text)  # entities that were escaped twice (&amp;nbsp;)
    return "\n".join(line.strip() for line in text.split("\n") if line.strip()).strip()


# -- tokenizers ---------------------------------------------------------------------------------
def char_tokenizer(text: str, model_max_length: int = 256):
    """Character-level ``PreTrainedTokenizerFast``: ``[PAD]`` = 0, ``[UNK]`` = 1, then the sorted characters of
    ``text``."""
    from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set(text))
    if not chars:
        raise ValueError("cannot build a character vocabulary from empty text")
    vocab = {tok: i for i, tok in enumerate(CHAR_SPECIALS)}
    vocab.update({c: i + len(CHAR_SPECIALS) for i, c in enumerate(chars)})
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", model_max_length=model_max_length
    )


# -- tokenize and pack --------------------------------------------------------------------------
def read_text(sources: Iterable[Path | str]) -> str:
    """All sources concatenated (newlines normalised to ``\\n``); used to build a character vocabulary."""
    return "".join(line for src in sources for line in iter_lines(src))


def encode_sources(
    sources: Iterable[Path | str],
    tokenizer,
    char_level: bool = False,
    chunk: int = 2048,
    progress: bool = True,
    stop=lambda: None,
) -> np.ndarray:
    """Token ids of all sources as one stream (int32), as :func:`encode_lines` gives them. ``ValueError``
    names a source that yields no tokens; ``stop()`` is polled per chunk (see :class:`StopRequested`)."""
    backend = tokenizer.backend_tokenizer
    parts: list[np.ndarray] = []
    for src in sources:
        before = len(parts)
        lines = iter_lines(src)
        bar = progress_bar(desc=f"tokenize {Path(str(src)).name}", unit=" lines", progress=progress, leave=False)
        while True:
            batch = [line for _, line in zip(range(chunk), lines)]
            if not batch:
                break
            bar.update(len(batch))
            stop()
            parts.append(encode_lines(backend, batch, char_level))
        bar.close()
        if sum(p.size for p in parts[before:]) == 0:
            raise ValueError(f"corpus file {src} holds no text")
    return np.concatenate(parts)


def pack(
    ids: np.ndarray, seq_len: int, cls_id: int | None = None, sep_id: int | None = None, what: str = "the corpus"
) -> torch.Tensor:
    """Full sequences ``(N, seq_len)`` from a token stream; with ``cls_id``/``sep_id`` each is
    ``[CLS] + (seq_len - 2) tokens + [SEP]``. The remainder that does not fill a sequence is dropped. ``what``: the
    stream's name in the error for one too short (the validation part is cut from the corpus's end)."""
    wrap = cls_id is not None and sep_id is not None
    body = seq_len - 2 if wrap else seq_len
    if body < 1:
        raise ValueError(f"seq_len {seq_len} is too short")
    n = ids.size // body
    if n == 0:
        raise ValueError(
            f"{what} has {ids.size} tokens, fewer than one sequence of {body}; give more text or a shorter --seq-len"
        )
    blocks = torch.from_numpy(ids[: n * body].astype(np.int64)).view(n, body)
    if wrap:
        blocks = torch.cat([torch.full((n, 1), cls_id), blocks, torch.full((n, 1), sep_id)], dim=1)
    return blocks


def mask_tokens(
    ids: torch.Tensor,
    special: torch.Tensor,
    mask_id: int,
    vocab_size: int,
    generator: torch.Generator,
    probability: float = 0.15,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT masking of ``ids`` (T,): each non-special token is picked with ``probability``; picked tokens
    become [MASK] (80%), a random token (10%) or stay (10%). Returns ``(input_ids, labels)``, labels -100
    where not picked."""
    picked = (torch.rand(ids.shape, generator=generator) < probability) & ~special
    choice = torch.rand(ids.shape, generator=generator)
    random_ids = torch.randint(vocab_size, ids.shape, generator=generator)
    inputs = torch.where(picked & (choice < 0.8), mask_id, ids)
    inputs = torch.where(picked & (choice >= 0.8) & (choice < 0.9), random_ids, inputs)
    return inputs, torch.where(picked, ids, -100)


class PackedDataset(torch.utils.data.Dataset):
    """Packed sequences with language-model labels; item ``i`` is ``{"input_ids", "labels"}``.

    ``blocks`` is an ``(N, T)`` tensor (:func:`pack`) or anything with ``len`` whose item ``i`` is a ``(T,)``
    tensor (:class:`~sharebert.training.shards.StreamBlocks`, read from memory-mapped shards).
    Causal LM: labels are the inputs (the model shifts them). Masked LM: dynamic masking drawn from a
    generator seeded by ``(seed, epoch, i)``, so a sequence gets a new mask every epoch while the masks
    depend on nothing else: resuming, prefetching or sharding across processes give the same masks.
    ``epoch=None`` makes it a fixed-mask (validation) set.
    """

    def __init__(self, blocks, mlm: dict | None = None, seed: int = 0, fixed: bool = False):
        self.blocks, self.mlm, self.seed, self.fixed = blocks, mlm, seed, fixed
        self.epoch = 0
        if mlm is not None:
            self.special = torch.tensor(mlm["special_ids"], dtype=torch.long)

    @classmethod
    def for_objective(
        cls, blocks, tokenizer, objective: str, probability: float = 0.15, seed: int = 0, fixed: bool = False
    ) -> PackedDataset:
        mlm = None
        if objective == "mlm":
            mlm = {
                "mask_id": tokenizer.mask_token_id,
                "vocab_size": len(tokenizer),
                "probability": probability,
                "special_ids": sorted(set(tokenizer.all_special_ids)),
            }
        return cls(blocks, mlm, seed, fixed)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> dict:
        ids = self.blocks[i]
        if self.mlm is None:
            return {"input_ids": ids, "labels": ids.clone()}
        epoch = -1 if self.fixed else self.epoch
        g = torch.Generator().manual_seed(((self.seed * 1_000_003 + epoch) * 1_000_000_007 + i) % (2**63))
        inputs, labels = mask_tokens(
            ids, torch.isin(ids, self.special), self.mlm["mask_id"], self.mlm["vocab_size"], g, self.mlm["probability"]
        )
        return {"input_ids": inputs, "labels": labels}


def vocabulary_words(tokenizer, min_chars: int = 3) -> list[str]:
    """The whole words of a tokenizer's vocabulary, in id order: each token as its own text, kept where it is
    letters only, at least ``min_chars`` long, and the one token the tokenizer gives that text after another word
    (so a word's start, never the inside of one: WordPiece's ``##ing``, byte-level BPE's ``ing`` without ``Ġ``, a
    SentencePiece piece without ``▁``); special tokens left out."""
    special = set(tokenizer.all_special_ids)
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    candidates = {}
    for i, token in enumerate(tokens):
        word = tokenizer.convert_tokens_to_string([token]).strip() if i not in special and token else ""
        if len(word) >= min_chars and word.isalpha():
            candidates.setdefault(word, i)
    if not candidates:  # a vocabulary cut to text without words (emoji: its special tokens only); transformers'
        return []  # tokenizer raised IndexError on an empty batch
    lead = tokenizer("a", add_special_tokens=False)["input_ids"]
    after = tokenizer([f"a {w}" for w in candidates], add_special_tokens=False)["input_ids"]
    return [w for (w, i), ids in zip(candidates.items(), after) if ids == [*lead, i]]


def with_word_strings(sentences: list[str], words: list[str], per_sentence: float, seed: int) -> list[str]:
    """``sentences`` with ``per_sentence`` strings of 1-4 of ``words`` (drawn without replacement, in a seeded
    order) after each sentence: the teacher's vector of each string teaches the student words the sentences lack,
    as model2vec distils a vocabulary. A prefix keeps the mix (a time budget cuts the list from the end)."""
    if per_sentence <= 0 or not words or not sentences:
        return sentences
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(words))
    strings, i = [], 0
    while i < len(order) and len(strings) < round(per_sentence * len(sentences)):
        k = int(rng.integers(1, 5))
        strings.append(" ".join(words[j] for j in order[i : i + k]))
        i += k
    out, due = [], 0.0
    it = iter(strings)
    for sentence in sentences:
        out.append(sentence)
        due += per_sentence
        while due >= 1:
            due -= 1
            out.extend(itertools.islice(it, 1))
    return out + list(it)
