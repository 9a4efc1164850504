"""WordPiece tokenizers built offline from a ``vocab.txt`` (BERT uncased conventions) with ``tokenizers``."""
from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece

SPECIAL = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]", "mask_token": "[MASK]"}


def wordpiece_tokenizer(vocab_file: str | Path, lowercase: bool = True) -> Tokenizer:
    """A BERT WordPiece ``tokenizers.Tokenizer`` with [CLS] ... [SEP] post-processing."""
    vocab_file = Path(vocab_file)
    if not vocab_file.is_file():
        raise FileNotFoundError(f"vocabulary file not found: {vocab_file}")
    vocab = {}
    try:
        with open(vocab_file, encoding="utf-8") as f:
            for line in f:
                token = line.rstrip("\n")
                if token and token not in vocab:
                    vocab[token] = len(vocab)
    except UnicodeDecodeError as e:
        raise ValueError(f"{vocab_file} is not a UTF-8 text file ({e.reason} at byte {e.start}): a vocab.txt lists "
                         "one token per line") from None
    missing = [t for t in SPECIAL.values() if t not in vocab]
    if missing:
        raise ValueError(f"{vocab_file} lacks the special tokens {missing}; a BERT vocab.txt lists them")
    tok = Tokenizer(WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    cls, sep = vocab["[CLS]"], vocab["[SEP]"]
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return tok


def hf_tokenizer(vocab_file: str | Path, model_max_length: int = 512, lowercase: bool = True):
    """The same tokenizer wrapped as transformers' ``BertTokenizerFast`` (for Trainer/pipelines): saved with
    ``tokenizer_class`` ``BertTokenizerFast`` (and ``vocab.txt``), so ``AutoTokenizer`` loads it as BERT's."""
    from transformers import BertTokenizerFast

    return BertTokenizerFast(tokenizer_object=wordpiece_tokenizer(vocab_file, lowercase), do_lower_case=lowercase,
                             strip_accents=None, tokenize_chinese_chars=True, model_max_length=model_max_length,
                             **SPECIAL)

