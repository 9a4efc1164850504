"""Corpora: newline styles, MediaWiki XML streaming and markup stripping, packing, character tokenizer, bad input."""

import bz2
import os

import numpy as np
import pytest
import torch

from sharebert.formats.model_folder import load_tokenizer
from sharebert.formats.paths import data_path, default_vocab
from sharebert.formats.tokenization import hf_tokenizer
from sharebert.training.corpus import (
    char_tokenizer,
    encode_sources,
    iter_lines,
    pack,
    read_text,
    strip_wiki_markup,
)
from sharebert_runtime.textlines import PIECE_CHARS, resolve_sources

ENWIKI = data_path("enwiki-sample")
SHAKESPEARE = data_path("tinyshakespeare", "input.txt")


@pytest.fixture(scope="module")
def tok():
    return hf_tokenizer(default_vocab())


def _wikitext_lines(n=200):
    with open(data_path("wikitext-2-raw", "wiki.valid.raw"), encoding="utf-8", newline=None) as f:
        return [next(f) for _ in range(n)]


def test_newline_styles_give_the_same_tokens(tmp_path, tok):
    text = "".join(_wikitext_lines())
    assert "\r" not in text
    ids = {}
    for name, nl in (("lf", "\n"), ("crlf", "\r\n"), ("cr", "\r")):
        path = tmp_path / f"{name}.txt"
        path.write_bytes(text.replace("\n", nl).encode("utf-8"))
        ids[name] = encode_sources([path], tok, progress=False)
    assert ids["lf"].size > 1000
    assert np.array_equal(ids["lf"], ids["crlf"]) and np.array_equal(ids["lf"], ids["cr"])
    # the staged WikiText file itself has CRLF endings: no stray \r survives the reader
    assert all(
        not line.rstrip("\n").endswith("\r") for line in iter_lines(data_path("wikitext-2-raw", "wiki.valid.raw"))
    )
    # a bz2-compressed copy (detected by content, not name) reads the same
    packed = tmp_path / "corpus.dat"
    packed.write_bytes(bz2.compress(text.encode("utf-8")))
    assert np.array_equal(encode_sources([packed], tok, progress=False), ids["lf"])


def test_mediawiki_dump_is_streamed_without_markup():
    (src,) = resolve_sources([ENWIKI])  # a folder expands to its file; .bz2 without .xml is sniffed
    lines = list(iter_lines(src))
    text = "".join(lines)
    assert lines[0] == "Anarchism\n"  # the first article after the redirect pages
    assert "Anarchism is a political philosophy" in text
    assert len(text) > 2_000_000
    for markup in ("{{cite", "<ref", "'''", "[[Category:", "&nbsp;", "== ", "#REDIRECT"):
        assert markup not in text, markup
    # fewer than one leftover link bracket per 100k characters (only inside image captions)
    assert text.count("[[") < len(text) / 100_000


def test_strip_wiki_markup_rules():
    src = (
        "'''Foo''' is a [[bar baz|Bar]] of [[Qux]].{{cite web|url=x|title={{nested}}}}<ref name=a>r</ref>"
        "[[File:a.jpg|thumb|A [[link]] in a caption]] [http://example.org the label]<!-- hidden -->\n"
        "== History ==\n* first &amp; second\n{| class=wikitable\n| cell\n|}\n[[de:Foo]][[Category:Things]]"
    )
    assert strip_wiki_markup(src) == "Foo is a Bar of Qux. the label\nHistory\nfirst & second"


def test_packing_keeps_the_stream_and_wraps_sequences(tmp_path, tok):
    path = tmp_path / "a.txt"
    path.write_text("".join(_wikitext_lines(60)), encoding="utf-8")
    ids = encode_sources([path], tok, progress=False)
    blocks = pack(ids, 16, tok.cls_token_id, tok.sep_token_id)
    assert blocks.shape == (ids.size // 14, 16)
    assert (blocks[:, 0] == tok.cls_token_id).all() and (blocks[:, -1] == tok.sep_token_id).all()
    assert torch.equal(blocks[:, 1:-1].reshape(-1), torch.from_numpy(ids[: blocks.shape[0] * 14].astype(np.int64)))
    plain = pack(ids, 16)
    assert plain.shape == (ids.size // 16, 16)
    with pytest.raises(ValueError, match="fewer than one sequence"):
        pack(ids[:10], 16)


def test_char_tokenizer_round_trips_shakespeare():
    text = read_text([SHAKESPEARE])
    tok = char_tokenizer(text)
    assert len(tok) == len(set(text)) + 2 == 67  # 65 characters + [PAD] + [UNK]
    assert tok.convert_tokens_to_ids(["[PAD]", "[UNK]"]) == [0, 1]
    ids = encode_sources([SHAKESPEARE], tok, char_level=True, progress=False)
    assert ids.size == len(text) == 1_115_394  # one token per character, newlines included
    assert tok.decode(ids[:500].tolist()) == text[:500]
    assert tok("Zz\u00e9")["input_ids"][-1] == 1  # unseen character -> [UNK]


def test_a_file_without_newlines_is_read_in_bounded_pieces(tmp_path, tok):
    words = data_path("wikitext-2-raw", "wiki.valid.raw").read_text(encoding="utf-8").split()
    text = " ".join(words)[: PIECE_CHARS * 2 + 12345]  # one line of ~0.5 MB, no newline
    (tmp_path / "one.txt").write_text(text, encoding="utf-8")
    pieces = list(iter_lines(tmp_path / "one.txt"))
    assert len(pieces) == 3 and all(len(p) <= PIECE_CHARS for p in pieces[:-1]) and "".join(pieces) == text + "\n"
    assert all(p.endswith(" ") for p in pieces[:-1]) and pieces[-1].endswith("\n")  # cut after a space
    ids = encode_sources([tmp_path / "one.txt"], tok, progress=False)  # the same tokens as the line whole
    assert np.array_equal(ids, tok.backend_tokenizer.encode(text.strip(), add_special_tokens=False).ids)
    (tmp_path / "word.txt").write_text("x" * (PIECE_CHARS + 7))  # no space at all: cut where the piece is full
    assert [len(p) for p in iter_lines(tmp_path / "word.txt")] == [PIECE_CHARS, 8]


def test_bad_inputs_are_reported(tmp_path, tok):
    with pytest.raises(FileNotFoundError, match="not found"):
        resolve_sources([tmp_path / "missing.txt"])
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\r\n   \n")
    with pytest.raises(ValueError, match="holds no text"):
        encode_sources([empty], tok, progress=False)
    broken = tmp_path / "broken.bz2"
    whole = bz2.compress(" ".join(str(i * i) for i in range(20000)).encode())
    broken.write_bytes(whole[: len(whole) // 2])  # a download cut halfway
    with pytest.raises(ValueError, match="cannot read corpus file"):
        encode_sources([broken], tok, progress=False)
    bad_xml = tmp_path / "dump.xml"
    bad_xml.write_text("<mediawiki><page><title>x</title><revision><text>a")
    with pytest.raises(ValueError, match="cannot read corpus file"):
        list(iter_lines(bad_xml))
    (tmp_path / "folder").mkdir()
    with pytest.raises(ValueError, match="holds no files"):
        resolve_sources([tmp_path / "folder"])
    if os.geteuid() != 0:  # root reads anything
        locked = tmp_path / "locked.txt"
        locked.write_text("text\n")
        locked.chmod(0)
        with pytest.raises(ValueError, match="cannot read corpus file"):
            encode_sources([locked], tok, progress=False)


def test_tokenizer_larger_than_config_vocab_is_refused(tmp_path, tok):
    tok.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="30522 tokens but config.vocab_size is 1000"):
        load_tokenizer(tmp_path, 1000)
    assert len(load_tokenizer(tmp_path, 30528)) == 30522
    with pytest.raises(FileNotFoundError, match="no tokenizer"):
        load_tokenizer(tmp_path / "nothing", 30528)
    char = char_tokenizer("abc")
    char.save_pretrained(tmp_path / "char")
    with pytest.raises(ValueError, match=r"lacks \[MASK\], \[CLS\], \[SEP\], which this command needs"):
        load_tokenizer(tmp_path / "char", 1000, needs=("mask", "cls", "sep"))


def test_dynamic_masking_is_15_percent_80_10_10_and_seeded_per_epoch(tok):
    from sharebert.training.corpus import PackedDataset

    ids = encode_sources([data_path("wikitext-2-raw", "wiki.valid.raw")], tok, progress=False)[: 64 * 400]
    ds = PackedDataset.for_objective(pack(ids, 64, tok.cls_token_id, tok.sep_token_id), tok, "mlm", seed=3)
    items = [ds[i] for i in range(len(ds))]
    inputs = torch.stack([x["input_ids"] for x in items])
    labels = torch.stack([x["labels"] for x in items])
    picked = labels != -100
    assert not picked[:, [0, -1]].any()  # [CLS]/[SEP] are never picked
    rate = picked.float().mean().item() * 64 / 62
    assert abs(rate - 0.15) < 0.005  # 24,800 maskable tokens: std of the rate is 0.0023
    n = picked.sum().item()
    masked = (inputs[picked] == tok.mask_token_id).sum().item() / n
    kept = (inputs[picked] == labels[picked]).sum().item() / n
    assert abs(masked - 0.8) < 0.02 and abs(kept - 0.1) < 0.015 and abs(1 - masked - kept - 0.1) < 0.015
    assert torch.equal(ds[5]["labels"], labels[5])  # same epoch, same mask
    ds.epoch = 1
    assert not torch.equal(ds[5]["labels"], labels[5])  # a new epoch draws a new mask


@pytest.mark.parametrize("kind,style", [("wordpiece", "bert"), ("bpe", "roberta"), ("unigram", "roberta")])
def test_vocabulary_words_are_whole_words_of_every_tokenizer_kind_and_no_special_token(kind, style):
    from tiny_teachers import make_tokenizer

    from sharebert.training.corpus import vocabulary_words

    t = make_tokenizer(kind, style, token_types=False)
    words = vocabulary_words(t)
    assert len(words) > 100 and len(set(words)) == len(words)
    assert all(w.isalpha() and len(w) >= 3 for w in words)
    assert not set(words) & {s.strip("[]<>") for s in t.all_special_tokens}
    # each is a word's start: after another word it is one token of the vocabulary, never the inside of a word
    lead = t("a", add_special_tokens=False)["input_ids"]
    assert all(len(t(f"a {w}", add_special_tokens=False)["input_ids"]) == len(lead) + 1 for w in words)
    inside = [tok for tok in t.convert_ids_to_tokens(list(range(len(t)))) if tok.startswith("##")]
    assert not set(words) & set(inside) and not {w for w in words if w.startswith("##")}


def test_word_strings_follow_each_sentence_at_the_ratio_and_never_repeat_a_word():
    from sharebert.training.corpus import with_word_strings

    sentences = [f"Sentence number {i}." for i in range(100)]
    words = [f"w{i:04d}x" for i in range(1000)]
    for ratio in (0.5, 1.0, 2.0):
        mixed = with_word_strings(sentences, words, ratio, seed=3)
        strings = [x for x in mixed if x not in sentences]
        assert [x for x in mixed if x in sentences] == sentences  # order kept
        assert len(strings) == round(ratio * len(sentences))
        used = [w for s in strings for w in s.split()]
        assert len(used) == len(set(used)) and all(1 <= len(s.split()) <= 4 for s in strings)
        head = mixed[: len(mixed) // 2]  # a time budget keeps a prefix: the mix holds in it
        assert abs(sum(x not in sentences for x in head) / len(head) - ratio / (1 + ratio)) < 0.05
    assert with_word_strings(sentences, words, 1.0, seed=3) == with_word_strings(sentences, words, 1.0, seed=3)
    assert with_word_strings(sentences, words, 1.0, seed=3) != with_word_strings(sentences, words, 1.0, seed=4)
    assert with_word_strings(sentences, words, 0.0, seed=3) == sentences
    assert len(with_word_strings(sentences, words[:10], 1.0, seed=0)) < 110  # the words run out: no repeats


def test_a_stream_too_short_for_one_sequence_is_named_in_the_error():
    """pretrain packs the held-out end of --train apart from the rest: its error names it, not "the corpus" (four
    short lines said "the corpus has 2 tokens" of a corpus of 19)."""
    from sharebert.training.corpus import pack

    assert pack(np.arange(12), 8, cls_id=101, sep_id=102).shape == (2, 8)
    with pytest.raises(ValueError, match=r"^the held-out end has 2 tokens, fewer than one sequence of 6"):
        pack(np.arange(2), 8, cls_id=101, sep_id=102, what="the held-out end")
