"""Reading a model folder: ``config.json``, ``model.safetensors`` and the tokenizer, each error naming its file.

A transformers BERT folder (``model_type="bert"``, e.g. ``bert-base-uncased`` or a fine-tuned
``BertForSequenceClassification``) is read as what it is: a ShareBERT model with ``sharing='none'``
in BERT's layout (post-LN, dense tanh pooler), its weights renamed. So ``pretrain``, ``finetune``,
``evaluate`` and ``report`` use a stock BERT's weights instead of silently building a random model.

The config functions are torch-free (``sharebert report`` uses them); model loading imports torch.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from sharebert_runtime.errors import first_line
from sharebert_runtime.options import symlink_loop
from sharebert_runtime.untrusted import (
    JSON_BYTES,
    TOKENIZER_BYTES,
    bool_field,
    check_size,
    int_field,
    number_field,
    optional_file,
    read_bytes,
    read_json,
    regular_file,
    str_field,
)

from ..model.shape import CONFIG_FIELDS, DEFAULTS, PRESETS, preset_fields

MODEL_TYPES = ("sharebert", "bert")
# BERT config fields that carry over unchanged (everything else of the shape is the bert preset's).
_BERT_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "initializer_range",
    "layer_norm_eps",
    "pad_token_id",
    "classifier_dropout",
    "is_decoder",
)
_HEAD_FIELDS = ("architectures", "id2label", "label2id", "problem_type", "num_labels")
# In a training run's --out from the start of training until its final model is saved: a folder holding it
# (a run stopped by a signal, killed, or failed) keeps a model that is not the trained one, so it is refused.
UNFINISHED = ".sharebert_unfinished"


def _field_types() -> dict:
    """Each shape field's type, from its defaults and presets (``embedding_size``: int, ``share_layers``: bool...)."""
    types = {}
    for fields in (DEFAULTS, *PRESETS.values()):
        for key, value in fields.items():
            if value is not None:
                types.setdefault(key, float if isinstance(value, float) else type(value))
    return types


_FIELD_TYPES = {**_field_types(), "classifier_dropout": float, "num_labels": int}
_NULLABLE = {key for fields in (DEFAULTS, *PRESETS.values()) for key, value in fields.items() if value is None} | {
    "classifier_dropout",
    "pad_token_id",
}


def read_config(model_dir: str | Path, unfinished_ok: bool = False, model_types: tuple | None = MODEL_TYPES) -> dict:
    """``config.json`` of ``model_dir`` as a dict; ``FileNotFoundError`` / ``ValueError`` naming the file.
    A folder marked ``UNFINISHED`` is refused unless ``unfinished_ok`` (the run that resumes it); one of a model type
    outside ``model_types`` too (None: any, the teachers' check is ``training.teacher.read_teacher``)."""
    model_dir = Path(model_dir)
    path = model_dir / "config.json"
    try:
        is_dir = stat.S_ISDIR(model_dir.stat().st_mode)
    except FileNotFoundError:
        raise FileNotFoundError(f"model folder not found: {model_dir}") from None
    except OSError as e:  # a symlink loop, a path through a file, no permission
        raise ValueError(
            f"model folder {symlink_loop(model_dir) or f'{model_dir} cannot be opened ({e.strerror or e})'}"
        ) from None
    if not is_dir:
        raise ValueError(f"{model_dir} is a file, not a model folder")
    if (model_dir / "manifest.json").is_file() and (model_dir / "model.onnx").is_file():
        raise ValueError(
            f"{model_dir} is an exported ONNX artifact, not a model folder; give the model folder it "
            "was exported from (artifacts run with `sharebert predict` / `serve`)"
        )
    if (model_dir / UNFINISHED).exists() and not unfinished_ok:
        raise ValueError(
            f"{model_dir} holds an unfinished training run (stopped before it saved its trained model): "
            f"finish it with --resume --out {model_dir}, or give one of its checkpoint-N folders"
        )
    if optional_file(path, "the model's config") is None:
        raise FileNotFoundError(
            f"{path} not found: a model folder is written by `sharebert build` (or is a transformers BERT folder)"
        )
    raw = read_json(path)
    if not isinstance(raw, dict):
        raise ValueError(f"{path} is not a JSON object: not a model config")
    if model_types is not None and raw.get("model_type") not in model_types:
        kind = raw.get("model_type")
        raise ValueError(
            f"{path}: model_type {kind!r} is not supported (sharebert reads {', '.join(MODEL_TYPES)} model folders)"
        )
    check_field_types(raw, path)
    check_vocab_rows(model_dir, raw)
    return raw


def _word_embedding_rows(weights: Path) -> tuple[str, int] | None:
    """``(tensor name, rows)`` of the word-embedding table in a safetensors file's header (its first 8 bytes give
    the header's length; the header is JSON, read bounded), or None when there is none or it cannot be read (the
    weights' own checks name a damaged file)."""
    import struct

    try:
        with open(weights, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > JSON_BYTES:
                return None
            header = json.loads(f.read(length))
    except (OSError, ValueError, struct.error):
        return None
    for name, entry in header.items() if isinstance(header, dict) else ():
        if name.endswith("word_embeddings.weight") and isinstance(entry, dict):
            shape = entry.get("shape")
            if isinstance(shape, list) and len(shape) == 2 and isinstance(shape[0], int):
                return name, shape[0]
    return None


def check_vocab_rows(model_dir: Path, raw: dict) -> None:
    """``config.json``'s ``vocab_size`` is the rows of the weights' word embeddings (``model.safetensors``): a
    mismatch is refused naming both numbers, torch-free and before any work (transformers refused it only when the
    model loaded, with advice about ignore_mismatched_sizes, after compress had begun its exports)."""
    vocab, weights = raw.get("vocab_size"), model_dir / "model.safetensors"
    if not isinstance(vocab, int) or isinstance(vocab, bool) or not weights.is_file():
        return
    found = _word_embedding_rows(weights)
    if found is not None and found[1] != vocab:
        raise ValueError(
            f"{model_dir / 'config.json'}: vocab_size {vocab:,}, but the word embeddings in {weights} "
            f"({found[0]}) have {found[1]:,} rows: the config and the weights do not belong together (set vocab_size "
            f"to {found[1]}, or use the config.json that came with these weights)"
        )


def check_field_types(raw: dict, path) -> None:
    """Each shape field ``config.json`` sets has its default's type (an integer, a number, a string, true or false;
    null where the default is null), so a wrong-typed field is refused naming file and field, never by a
    conversion deep inside (``invalid literal for int()``)."""
    where = f"{path} is not a valid model config"
    for key, value in raw.items():
        if key not in _FIELD_TYPES or value is None and key in _NULLABLE:
            continue
        check = {int: lambda v, p, k: int_field(v, p, k, minimum=None), float: number_field, bool: bool_field}
        check.get(_FIELD_TYPES[key], str_field)(value, where, key)


def sharebert_fields(raw: dict, path: str | Path = "config.json") -> dict:
    """The ShareBERT config fields of a ``config.json`` dict (a BERT config mapped onto the bert preset)."""
    if raw["model_type"] == "sharebert":
        return {k: v for k, v in raw.items() if k != "model_type"}
    position = raw.get("position_embedding_type", "absolute")
    if position != "absolute":
        raise ValueError(f"{path}: BERT with position_embedding_type={position!r} is not supported (absolute only)")
    fields = preset_fields("bert-base", **{k: raw[k] for k in _BERT_FIELDS if k in raw})
    fields.update({k: raw[k] for k in _HEAD_FIELDS if k in raw})
    fields["architectures"] = [a.replace("Bert", "ShareBert", 1) for a in raw.get("architectures") or []]
    return fields


def shape_fields(model_dir: str | Path, raw: dict | None = None) -> dict:
    """Only the shape fields of a model folder's config (for ``ModelShape``, torch-free); ``raw``: its config.json
    where the caller has read it already (``read_config``'s checks)."""
    raw = read_config(model_dir) if raw is None else raw
    fields = sharebert_fields(raw, Path(model_dir) / "config.json")
    return {k: v for k, v in fields.items() if k in CONFIG_FIELDS}


def load_config(model_dir: str | Path, unfinished_ok: bool = False):
    """``ShareBertConfig`` of a sharebert or BERT model folder; a bad config is a ``ValueError`` naming the file."""
    from ..model.configuration_sharebert import ShareBertConfig

    path = Path(model_dir) / "config.json"
    raw = read_config(model_dir, unfinished_ok)
    try:
        if raw["model_type"] == "sharebert":
            return ShareBertConfig.from_pretrained(model_dir)
        return ShareBertConfig(**sharebert_fields(raw, path))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None


def is_model_folder(path: Path) -> bool:
    """True for a folder this toolkit writes or reads as a model (``config.json`` of a known model type)."""
    try:
        read_config(path)
    except (OSError, ValueError):
        return False
    return True


def bert_state_dict(sd: dict, num_layers: int, prefix: str) -> dict:
    """A transformers BERT state dict renamed to ShareBERT's; ``prefix``: ``"sharebert."``, or ``""`` for a backbone."""
    out = {}
    for key, value in sd.items():
        k = key[len("bert.") :] if key.startswith("bert.") else key
        if k.startswith("embeddings.") and "position_ids" not in k:
            out[prefix + k] = value
        elif k.startswith("pooler.dense."):
            out[prefix + "pooler." + k[len("pooler.dense.") :]] = value
        elif key.startswith("cls.predictions."):
            rest = key[len("cls.predictions.") :]
            rest = {
                "bias": "decoder.bias",
                "transform.dense.weight": "transform.weight",
                "transform.dense.bias": "transform.bias",
                "transform.LayerNorm.weight": "norm.weight",
                "transform.LayerNorm.bias": "norm.bias",
            }.get(rest, rest)
            out["lm_head." + rest] = value
        elif key.startswith(("classifier.", "qa_outputs.")):
            out[key] = value
    for i in range(num_layers):
        b, s, w = f"encoder.layer.{i}.", f"{prefix}layers.{i}.", f"{prefix}layer_weights.{i}.matrices."
        for name in ("query", "key", "value"):
            _move(sd, out, b + f"attention.self.{name}.weight", w + name)
            _move(sd, out, b + f"attention.self.{name}.bias", s + f"attention.bias.{name}")
        for src, dst in (
            ("attention.output.dense", "output"),
            ("intermediate.dense", "ffn_in"),
            ("output.dense", "ffn_out"),
        ):
            _move(sd, out, b + src + ".weight", w + dst)
            _move(sd, out, b + src + ".bias", s + {"output": "attention.output_bias"}.get(dst, dst + "_bias"))
        for src, dst in (("attention.output.LayerNorm", "attention_norm"), ("output.LayerNorm", "ffn_norm")):
            for t in ("weight", "bias"):
                _move(sd, out, b + f"{src}.{t}", s + f"{dst}.{t}")
    return out


def _move(sd: dict, out: dict, bert_key: str, key: str) -> None:
    for k in (bert_key, "bert." + bert_key):
        if k in sd:
            out[key] = sd[k]


TASK_HEADS = ("classifier.", "qa_outputs.")  # heads whose size follows the task's labels, not the encoder


def load_model(cls, model_dir: str | Path, config=None, unfinished_ok: bool = False, **kwargs):
    """``cls.from_pretrained(model_dir)`` for sharebert folders, a renamed state dict for BERT folders.

    Damaged weights are a ``ValueError`` naming the file. Returns the model (train mode, like
    transformers) and the list of learned tensors that were not in the folder (freshly initialised).
    """
    model_dir = Path(model_dir)
    raw = read_config(model_dir, unfinished_ok)
    config = load_config(model_dir, unfinished_ok) if config is None else config
    weights = _weights_file(model_dir)
    from safetensors import SafetensorError

    new_head_ok = kwargs.pop("ignore_mismatched_sizes", False)
    try:
        if raw["model_type"] == "sharebert":
            model, mismatched, missing = _load_sharebert(cls, model_dir, config, **kwargs)
        else:
            new_head_ok = True  # a head of another size is left out below, as transformers does
            model, mismatched, missing = _load_bert(cls, weights, config, **kwargs)
    except (OSError, RuntimeError, ValueError, SafetensorError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise ValueError(
            f"{weights} cannot be loaded ({first_line(e)}); the file is damaged or does not match config.json"
        ) from None
    _check_shapes(mismatched, new_head_ok, weights, model_dir)
    missing = [k for k in missing if k != "lm_head.decoder.weight" or not config.tie_word_embeddings]
    return model, missing


def _weights_file(model_dir: Path) -> Path:
    """``model_dir/model.safetensors`` (a FIFO or device there is an error, never "not found")."""
    weights = model_dir / "model.safetensors"
    if optional_file(weights, "the model's weights") is None:
        other = [p.name for p in model_dir.glob("*.bin")]
        hint = f" ({', '.join(other)} is a pickle, never loaded: save the model with safetensors)" if other else ""
        raise FileNotFoundError(f"{weights} not found{hint}")
    return weights


def _load_sharebert(cls, model_dir: Path, config, **kwargs):
    """``(model, mismatched, missing)`` of a sharebert folder. transformers 5 raises one RuntimeError pointing at
    its log for any mismatch: load them all and name the first afterwards. Its mismatched_keys are (key, stored
    shape, configured shape) triples."""
    model, info = cls.from_pretrained(
        model_dir, config=config, output_loading_info=True, ignore_mismatched_sizes=True, **kwargs
    )
    mismatched = sorted((k, tuple(stored), tuple(made)) for k, stored, made in info.get("mismatched_keys", ()))
    return model, mismatched, info["missing_keys"]


def _load_bert(cls, weights: Path, config, **kwargs):
    """``(model, mismatched, missing)`` of a transformers BERT folder: its state dict renamed; tensors of another
    shape are left out (and listed in ``mismatched``)."""
    from safetensors.torch import load_file

    model = cls(config, **kwargs)
    prefix = "" if cls.__name__ == "ShareBertModel" else model.base_model_prefix + "."
    own = model.state_dict()
    sd = {k: v for k, v in bert_state_dict(load_file(weights), config.num_hidden_layers, prefix).items() if k in own}
    mismatched = [(k, tuple(v.shape), tuple(own[k].shape)) for k, v in sd.items() if own[k].shape != v.shape]
    missing, _ = model.load_state_dict({k: v for k, v in sd.items() if own[k].shape == v.shape}, strict=False)
    model.tie_weights()
    return model, mismatched, missing


def _check_shapes(mismatched: list, new_head_ok: bool, weights: Path, model_dir: Path) -> None:
    """Only a task head may be re-initialised for another label count; any other tensor of the wrong shape
    means the weights are not this config's (they would be replaced by random numbers)."""
    wrong = [m for m in mismatched if not (new_head_ok and m[0].startswith(TASK_HEADS))]
    if wrong:
        key, stored, configured = wrong[0]
        raise ValueError(
            f"{weights} does not fit {model_dir / 'config.json'}: {key} is stored as "
            f"{'x'.join(map(str, stored)) or 'another shape'} but the config makes it {'x'.join(map(str, configured))}"
            f"{f' ({len(wrong) - 1} more tensors differ)' if len(wrong) > 1 else ''}; "
            "the weights belong to another model"
        )


_BERT_CLASSES = {
    "ShareBertModel": "BertModel",
    "ShareBertForMaskedLM": "BertForMaskedLM",
    "ShareBertForCausalLM": "BertLMHeadModel",
    "ShareBertForSequenceClassification": "BertForSequenceClassification",
    "ShareBertForTokenClassification": "BertForTokenClassification",
    "ShareBertForQuestionAnswering": "BertForQuestionAnswering",
}


def is_bert_folder(model_dir: str | Path) -> bool:
    """Whether ``model_dir`` is a transformers BERT folder (``model_type="bert"``)."""
    return read_config(model_dir, unfinished_ok=True).get("model_type") == "bert"  # a type check: resume reads it too


def check_convert(model_dir, out, convert: bool, resume: bool) -> None:
    """``--convert-to-sharebert`` only where it applies (torch-free, before any work), never ignored: on a
    transformers BERT ``--model`` (a ShareBERT one has nothing to convert; ``pretrain`` from a preset neither), and
    not on a ``--resume`` of a finished run whose saved model is of the other kind (a resume keeps that result as it
    is: the option, given or left out, would not apply). ``ValueError`` in one line saying why."""
    if not (convert or resume):
        return
    bert_in = model_dir is not None and is_bert_folder(model_dir)
    if convert and not bert_in:
        what = f"{model_dir} is already a ShareBERT folder" if model_dir is not None else "no --model is given"
        raise ValueError(f"--convert-to-sharebert converts a transformers BERT --model; {what}: drop the option")
    out = Path(out)
    if not (resume and (out / "metrics.json").is_file() and optional_file(out / "config.json") is not None):
        return
    saved_bert = read_config(out, unfinished_ok=True)["model_type"] == "bert"
    if bert_in and saved_bert == convert:
        saved, asked = (
            ("BERT", "ShareBERT (--convert-to-sharebert)")
            if saved_bert
            else ("ShareBERT", "BERT (no --convert-to-sharebert)")
        )
        raise ValueError(
            f"--resume: the finished run in {out} saved a {saved} folder, and a resume keeps its result as it "
            f"is, so it cannot save {asked}: resume with the option as the run began, or start again "
            "with --overwrite"
        )


def save_as_bert(model, folder: str | Path) -> None:
    """Write ``model`` (a ShareBERT model read from a BERT folder: ``sharing='none'``, BERT's layout) into
    ``folder`` as what it came from: ``config.json`` with ``model_type="bert"`` and ``model.safetensors`` with
    BERT's weight names, so plain transformers loads it as ``BertFor...`` without sharebert. The inverse of
    :func:`bert_state_dict`; ``ValueError`` when the model has no BERT equivalent."""
    import transformers

    name = type(model).__name__
    config = model.config
    if (
        name not in _BERT_CLASSES
        or config.sharing != "none"
        or config.norm_position != "post"
        or config.embedding_size not in (None, config.hidden_size)
        or config.attention != "standard"
    ):
        raise ValueError(
            f"{name} with sharing={config.sharing!r} has no transformers BERT equivalent; keep the ShareBERT folder"
        )
    fields = config.to_dict()
    bert_config = transformers.BertConfig(**{k: fields[k] for k in _BERT_FIELDS + _HEAD_FIELDS if k in fields})
    bert_config.architectures = [_BERT_CLASSES[name]]
    bert = getattr(transformers, _BERT_CLASSES[name])(bert_config)
    prefix = "" if name == "ShareBertModel" else model.base_model_prefix + "."
    ours = model.state_dict()
    weights, unmatched = {}, []
    for key in bert.state_dict():
        renamed = bert_state_dict({key: key}, config.num_hidden_layers, prefix)
        if len(renamed) == 1 and next(iter(renamed)) in ours:
            weights[key] = ours[next(iter(renamed))]
        else:
            unmatched.append(key)
    if name == "ShareBertModel" and not getattr(model, "has_pooler", True):
        unmatched = [k for k in unmatched if not k.startswith("pooler.")]
    if unmatched:
        raise ValueError(
            f"{name}: no ShareBERT weight for BERT's {', '.join(unmatched[:3])}; keep the ShareBERT folder"
        )
    bert.load_state_dict(weights, strict=False)
    bert.save_pretrained(folder)


# The tokenizer files transformers may open in a model folder: each present one must be a regular file of bounded size.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
)


def _check_tokenizer_files(model_dir: Path) -> None:
    """Name the damaged or missing tokenizer file before transformers reports something else (a corrupt or
    missing ``tokenizer_config.json`` made AutoTokenizer fall back to the model's config: "'ShareBertConfig'").
    A FIFO, device or folder under a tokenizer file's name, or a huge one, is refused unread."""
    from tokenizers import Tokenizer

    present = {name for name in TOKENIZER_FILES if optional_file(model_dir / name, "a tokenizer file") is not None}
    for name in present - {"tokenizer_config.json", "tokenizer.json"}:
        check_size(model_dir / name, regular_file(model_dir / name, "a tokenizer file"), TOKENIZER_BYTES)
    settings = model_dir / "tokenizer_config.json"
    if "tokenizer_config.json" in present:
        read_json(settings, limit=JSON_BYTES)  # refused as "<path> is not valid JSON", as config.json is
    elif "tokenizer.json" in present and read_config(model_dir, True, None).get("model_type") == "sharebert":
        raise ValueError(
            f"{settings} not found: a sharebert folder's tokenizer is tokenizer.json with "
            "tokenizer_config.json (the special tokens); rebuild it with `sharebert build`"
        )
    if "tokenizer.json" in present:
        text = read_bytes(model_dir / "tokenizer.json", "the tokenizer", TOKENIZER_BYTES)
        try:
            Tokenizer.from_str(text.decode("utf-8"))
        except Exception as e:  # the tokenizers library's own Exception type; UnicodeDecodeError
            raise ValueError(
                f"{model_dir / 'tokenizer.json'} cannot be read (the tokenizer files are damaged): {first_line(e)}"
            ) from None


def check_has_tokenizer(model_dir: Path) -> None:
    """``FileNotFoundError`` naming the folder when it holds no tokenizer files at all."""
    if not any(os.path.lexists(model_dir / f) for f in ("tokenizer.json", "vocab.txt", "tokenizer_config.json")):
        raise FileNotFoundError(
            f"{model_dir} has no tokenizer files (tokenizer.json); build the folder with `sharebert build`"
        )


def load_tokenizer(model_dir: str | Path, vocab_size: int, needs: tuple[str, ...] = (), config=None):
    """The model folder's fast tokenizer; a clear error when it is missing, damaged, larger than a
    ``vocab_size`` model (ids past the embedding table) or lacks a special token the caller ``needs``
    (``"pad"``, ``"mask"``, ``"cls"``, ``"sep"``). ``config``: the model's transformers config where the caller has
    it (``AutoTokenizer`` then does not read ``config.json`` again)."""
    from transformers import AutoTokenizer

    model_dir = Path(model_dir)
    check_has_tokenizer(model_dir)
    _check_tokenizer_files(model_dir)
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir, **({} if config is None else {"config": config}))
    except Exception as e:  # tokenizers raises its own Exception type for a damaged tokenizer.json
        raise ValueError(
            f"{model_dir / 'tokenizer.json'} cannot be read (the tokenizer files are damaged): {first_line(e)}"
        ) from None
    if not tokenizer.is_fast:
        raise ValueError(f"{model_dir}: a fast tokenizer (tokenizer.json) is needed")
    if len(tokenizer) > vocab_size:
        raise ValueError(
            f"the tokenizer in {model_dir} has {len(tokenizer)} tokens but config.vocab_size is "
            f"{vocab_size}: they do not belong together (ids >= {vocab_size} would index past the "
            "embedding table); rebuild the model for this tokenizer"
        )
    missing = [f"[{name.upper()}]" for name in needs if getattr(tokenizer, f"{name}_token_id") is None]
    if missing:
        raise ValueError(f"the tokenizer in {model_dir} lacks {', '.join(missing)}, which this command needs")
    return tokenizer
