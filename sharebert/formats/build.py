"""Build a ready-to-train model folder: config, safetensors weights and tokenizer."""

from __future__ import annotations

from pathlib import Path

from ..model.configuration_sharebert import ShareBertConfig, pad_vocab_size
from .paths import default_vocab
from .tokenization import hf_tokenizer


def config_for_vocab(preset: str, overrides: dict, tokenizer_size: int) -> ShareBertConfig:
    """Preset config whose vocabulary covers the tokenizer (padded to a multiple of 8 by default)."""
    overrides = dict(overrides)
    overrides.setdefault("vocab_size", pad_vocab_size(tokenizer_size))
    config = ShareBertConfig.from_preset(preset, **overrides)
    if config.vocab_size < tokenizer_size:
        raise ValueError(
            f"vocab_size {config.vocab_size} is smaller than the tokenizer's {tokenizer_size} tokens; "
            f"set vocab_size >= {tokenizer_size} (e.g. {pad_vocab_size(tokenizer_size)})"
        )
    return config


def build_model(  # 7: the public call: `sharebert build`'s options as keywords, and a tokenizer made by the caller
    preset: str,
    out: str | Path,
    overrides: dict | None = None,
    vocab: str | Path | None = None,
    head: str | None = None,
    seed: int = 0,
    tokenizer=None,
):
    """Write a freshly initialised model (``head``: mlm or clm; default: clm for a decoder preset such as
    ``charlm-tiny``, else mlm) and its tokenizer to ``out``.

    The tokenizer is ``tokenizer`` (e.g. a character tokenizer) or WordPiece over ``vocab`` (default:
    bert-base-uncased's); the vocabulary size follows it. A causal LM stops generating at the tokenizer's
    end of text (``[SEP]`` for WordPiece: ``generation_config.eos_token_id``).
    """
    import torch

    from ..model.modeling_sharebert import ShareBertForCausalLM, ShareBertForMaskedLM

    if tokenizer is not None and vocab is not None:
        raise ValueError("give a tokenizer or a vocab file, not both")
    tokenizer = tokenizer if tokenizer is not None else hf_tokenizer(vocab or default_vocab())
    config = config_for_vocab(preset, overrides or {}, len(tokenizer))
    tokenizer.model_max_length = config.max_position_embeddings
    torch.manual_seed(seed)
    head = head or ("clm" if config.is_decoder else "mlm")
    model = (ShareBertForCausalLM if head == "clm" else ShareBertForMaskedLM)(config)
    if head == "clm":
        set_generation_tokens(model, tokenizer)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return model, tokenizer


def set_generation_tokens(model, tokenizer) -> None:
    """A causal LM's generation stops at the tokenizer's end of text (``eos_token``, else WordPiece's ``[SEP]``,
    which ends every encoded text) and pads with its ``[PAD]``: in the config and ``generation_config``."""
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    for target in (model.config, model.generation_config):
        target.eos_token_id, target.pad_token_id = eos, tokenizer.pad_token_id
