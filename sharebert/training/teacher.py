"""Teachers of any encoder architecture: read, loaded and fed through transformers as published, never re-implemented.

A teacher folder may be of any bidirectional encoder architecture transformers ships a masked-LM class for (bert,
distilbert, roberta, xlm-roberta, mpnet, electra, deberta-v2, albert, modernbert, ...), as a sentence-transformers
folder or a ``...ForSequenceClassification`` one, with its own tokenizer (WordPiece, byte-level BPE or
SentencePiece / Unigram). A decoder-only or encoder-decoder model is refused in one line naming the accepted kinds.

What the student needs of it is read here in the architecture's own terms (transformers' attribute maps: DistilBERT's
``dim`` is its ``hidden_size``), so nothing downstream branches on ``model_type``.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from sharebert_runtime.errors import first_line


@lru_cache(maxsize=1)
def encoder_types() -> tuple[str, ...]:
    """The model types accepted as teachers: sharebert, and every transformers architecture with a masked-LM class
    that is not an encoder-decoder (transformers' own tables: a new encoder of a later release is accepted too)."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
    )

    return (
        "sharebert",
        *sorted(t for t in MODEL_FOR_MASKED_LM_MAPPING_NAMES if t not in MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES),
    )


def accepted() -> str:
    """The accepted kinds in words, for the one-line refusals."""
    common = ("bert", "distilbert", "roberta", "xlm-roberta", "mpnet", "electra", "deberta-v2", "albert", "modernbert")
    return (
        f"a bidirectional encoder teacher ({', '.join(common)} or one of the {len(encoder_types()) - len(common) - 1} "
        "other encoder architectures transformers has a masked-LM class for), as a sentence-transformers or "
        "...ForSequenceClassification folder"
    )


def read_teacher(teacher_dir) -> dict:
    """The teacher's ``config.json`` as a dict (``model_folder.read_config``'s checks of the folder); ``ValueError``
    in one line for a decoder-only, encoder-decoder or non-text model."""
    from ..formats.model_folder import read_config

    return check_teacher(read_config(teacher_dir, model_types=None), Path(teacher_dir) / "config.json")


def check_teacher(raw: dict, path: Path) -> dict:
    """:func:`read_teacher`'s checks of a teacher's ``config.json`` already read (``raw``, from ``path``)."""
    kind = raw.get("model_type")
    archs = raw.get("architectures") or []
    if raw.get("is_encoder_decoder"):
        raise ValueError(f"{path}: {kind!r} is an encoder-decoder model; sharebert needs {accepted()}")
    if raw.get("is_decoder") or any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs):
        raise ValueError(
            f"{path}: {kind!r} ({', '.join(archs) or 'is_decoder'}) is a causal (decoder) model; "
            f"sharebert needs {accepted()}"
        )
    if kind not in encoder_types():
        raise ValueError(
            f"{path}: model_type {kind!r} is not a text encoder sharebert can compress; it needs {accepted()}"
        )
    return raw


def teacher_config(teacher_dir, raw: dict | None = None):
    """The teacher's transformers config (``AutoConfig``; sharebert's registered), checked by :func:`read_teacher`;
    built from ``raw`` (its ``config.json`` already read and checked: :func:`check_teacher`) where given, so a run
    that read the folder once does not read it again."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    import sharebert.model.modeling_sharebert  # noqa: F401  (registers the sharebert Auto classes)

    if raw is None:
        read_teacher(teacher_dir)
    try:
        if raw is None:
            return AutoConfig.from_pretrained(teacher_dir)
        config = CONFIG_MAPPING[raw["model_type"]].from_dict(raw)  # what from_pretrained does with the file's dict
        config.name_or_path = str(teacher_dir)
        return config
    except Exception as e:  # ValueError / TypeError for a field out of range, OSError for a damaged file
        raise ValueError(f"{Path(teacher_dir) / 'config.json'} is not a valid model config: {first_line(e)}") from None


def teacher_shape(teacher_dir, config=None) -> dict:
    """The fields the student's budget reads of the teacher (``budget.student_for``): vocabulary, width, depth."""
    config = teacher_config(teacher_dir) if config is None else config
    return {k: int(getattr(config, k)) for k in ("vocab_size", "hidden_size", "num_hidden_layers")}


def teacher_tokenizer(teacher_dir, config=None, needs: tuple[str, ...] = ("pad",)):
    """The teacher's fast tokenizer (``model_folder.load_tokenizer``'s checks), fitting its embedding table."""
    from ..formats.model_folder import load_tokenizer

    config = teacher_config(teacher_dir) if config is None else config
    return load_tokenizer(teacher_dir, int(config.vocab_size), needs=needs, config=config)


def uses_token_types(tokenizer) -> bool:
    """Whether the tokenizer gives the model token types (BERT's segment ids; RoBERTa's, MPNet's do not)."""
    return "token_type_ids" in tokenizer.model_input_names


def student_fields(tokenizer) -> dict:
    """The student config fields the teacher decides beyond its budget: one token type if its tokenizer gives none."""
    return {"type_vocab_size": 2 if uses_token_types(tokenizer) else 1}


def accept_known_inputs(model) -> None:
    """Let ``model`` be called with a batch of any tokenizer: ``token_type_ids``, where its ``forward`` does not name
    them (DistilBERT, ModernBERT), are dropped by a forward pre-hook, so every caller feeds it one way."""
    import inspect

    if "token_type_ids" in inspect.signature(model.forward).parameters:
        return

    def drop(module, args, kwargs):
        kwargs.pop("token_type_ids", None)
        return args, kwargs

    model.register_forward_pre_hook(drop, with_kwargs=True)


def embedding_tables(teacher) -> dict:
    """The teacher's input tables, found by role, not by name of architecture: ``word`` (E x e, ``e`` the embedding
    width: ALBERT's and ELECTRA's are narrower than their hidden size), ``position`` (P x e learned absolute
    positions from position 0, RoBERTa's ``padding_idx + 1`` offset removed; None for relative or rotary positions:
    MPNet's bias, DeBERTa-v3, ModernBERT), ``token_type`` (None without), and the embedding LayerNorm's ``ln_weight``,
    ``ln_bias`` (None without)."""
    from torch import nn

    word = teacher.get_input_embeddings()
    owner = next((m for m in teacher.modules() if any(c is word for c in m.children())), None)
    children = dict(owner.named_children()) if owner is not None else {}
    pos = children.get("position_embeddings")
    position = None
    if isinstance(pos, nn.Embedding) and pos.weight.shape[1] == word.weight.shape[1]:
        start = 0 if pos.padding_idx is None else pos.padding_idx + 1  # RoBERTa counts positions after padding_idx
        position = pos.weight[start:]
    types = children.get("token_type_embeddings")
    norm = next(
        (
            c
            for n, c in children.items()
            if isinstance(c, nn.LayerNorm) and n.lower() in ("layernorm", "norm", "layer_norm")
        ),
        None,
    )
    width = word.weight.shape[1]
    return {
        "word": word.weight,
        "position": position,
        "token_type": types.weight if isinstance(types, nn.Embedding) and types.weight.shape[1] == width else None,
        "ln_weight": norm.weight if norm is not None and norm.weight is not None else None,
        "ln_bias": norm.bias if norm is not None and norm.bias is not None else None,
    }


def usable_length(model, tokenizer) -> int:
    """The longest input the model reads: its learned positions past RoBERTa's ``padding_idx + 1`` offset (514
    rows, 512 positions), and no more than its tokenizer's ``model_max_length`` where that is set."""
    n = int(getattr(model.config, "max_position_embeddings", 0) or 512)
    positions = embedding_tables(model)["position"]
    if positions is not None:
        n = min(n, positions.shape[0])
    limit = getattr(tokenizer, "model_max_length", None)
    return min(n, limit) if isinstance(limit, int) and 0 < limit < 1_000_000 else n
