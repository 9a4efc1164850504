"""WordPiece tokenizers built offline from a ``vocab.txt`` (BERT uncased conventions) with ``tokenizers``."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece

from sharebert_runtime.textlines import check_text_file, numbered_lines

SPECIAL = {
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
}


def wordpiece_tokenizer(vocab_file: str | Path, lowercase: bool = True) -> Tokenizer:
    """A BERT WordPiece ``tokenizers.Tokenizer`` with [CLS] ... [SEP] post-processing. ``vocab_file`` is read as user
    text (:mod:`sharebert_runtime.textlines`): not a regular file (``/dev/zero``, a folder, a symlink loop) or a line
    over ``MAX_LINE_BYTES`` is refused naming it, in bounded memory."""
    vocab_file = check_text_file(vocab_file, "vocabulary file")
    vocab = {}
    with open(vocab_file, "rb") as f:
        for number, raw in numbered_lines(f, f"vocabulary file {vocab_file}"):
            try:
                token = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"{vocab_file} is not a UTF-8 text file ({e.reason} at line {number}): a vocab.txt "
                    "lists one token per line"
                ) from None
            if token and token not in vocab:
                vocab[token] = len(vocab)
    missing = [t for t in SPECIAL.values() if t not in vocab]
    if missing:
        raise ValueError(f"{vocab_file} lacks the special tokens {missing}; a BERT vocab.txt lists them")
    tok = Tokenizer(WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    cls, sep = vocab["[CLS]"], vocab["[SEP]"]
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return tok


def hf_tokenizer(vocab_file: str | Path, model_max_length: int = 512, lowercase: bool = True):
    """The same tokenizer wrapped as transformers' ``BertTokenizerFast`` (for Trainer/pipelines): saved with BERT's
    ``tokenizer_class`` (and ``tokenizer.json``), so ``AutoTokenizer`` loads it as BERT's."""
    from transformers import BertTokenizerFast

    return BertTokenizerFast(
        tokenizer_object=wordpiece_tokenizer(vocab_file, lowercase),
        do_lower_case=lowercase,
        strip_accents=None,
        tokenize_chinese_chars=True,
        model_max_length=model_max_length,
        **SPECIAL,
    )
