"""``export_model``: a sharebert (or transformers BERT) model folder -> a verified ONNX artifact folder.

Pipeline: torch's TorchScript exporter (``torch_onnx.export_onnx``: named dynamic inputs, no constant folding,
so the file stores learned tensors only; no optimum) -> graph clean-up (no initializer as graph input, one node
per distinct constant) -> optional materialization / quantization -> ONNX Runtime folding check ->
parity with PyTorch on real sentences -> tokenizer, config, RAM-int8 graphs -> footprint measured in
a subprocess -> ``manifest.json`` with the sha256 of every file. Everything is written to a
temporary folder beside ``out_dir`` and renamed at the end.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from sharebert.formats.model_folder import check_has_tokenizer, read_config
from sharebert_runtime import artifact
from sharebert_runtime.cpu import cpu_info, describe
from sharebert_runtime.errors import first_line
from sharebert_runtime.outdir import check_out_dir, disk_full, read_json, write_json
from sharebert_runtime.reference import KEY as REFERENCE

if TYPE_CHECKING:
    from .parity import Check

WEIGHTS = ("compact", "materialized")
MIN_OPSET, MAX_OPSET = 14, 20  # scaled_dot_product_attention needs 14; TorchScript exporter stops at 20
CALIBRATION_SENTENCES = 128
RAM_INT8_CHECK_SENTENCES = 256  # parity of the RAM-int8 mode, which ram="auto" reads (ram_int8.measure_ram_int8)
DEPTH_CHECK_SENTENCES = 32  # parity at depth 1 (the gated layers' else-branches) on this many sentences
_AUTO = {
    "fill-mask": "AutoModelForMaskedLM",
    "text-classification": "AutoModelForSequenceClassification",
    "feature-extraction": "AutoModel",
    "causal-lm": "AutoModelForCausalLM",
}
_ARCH_TASK = {
    "ForMaskedLM": "fill-mask",
    "ForSequenceClassification": "text-classification",
    "ForCausalLM": "causal-lm",
}
_VERSIONED = (
    "sharebert",
    "torch",
    "transformers",
    "optimum",
    "optimum-onnx",
    "onnx",
    "onnxruntime",
    "numpy",
    "tokenizers",
)


@dataclass(frozen=True)
class ExportOptions:
    """Everything ``export_model`` can be asked for; every field is a ``sharebert export`` option.

    ``task``: inferred from the saved architecture when None. ``weights``: ``compact`` (generated
    weights computed in-graph from the learned tensors) or ``materialized`` (stored); int8-dynamic
    and int8-static always materialize. ``calibration``: sentences for int8-static.
    ``check_file``/``check_limit``: parity sentences (default: SST-2 dev). ``shapes``/``threads``/``runs``:
    latency measurement (``"BxT"`` strings). ``format``: ``onnx``, ``ort`` (ORT-format graphs for
    ONNX Runtime mobile / minimal builds, ``export/ort_format.py``) or ``web`` (transformers.js' layout,
    ``export/web_format.py``). ``allow_low_parity``: publish a
    quantized export whose parity falls below ``parity.THRESHOLDS`` (recorded in the manifest).
    """

    task: str | None = None
    weights: str = "compact"
    quantize: str = "none"
    calibration: str | Path | None = None
    opset: int = 17
    overwrite: bool = False
    check_file: str | Path | None = None
    check_limit: int | None = None
    shapes: tuple[str, ...] = ("1x128",)
    threads: int = 1
    runs: int = 30
    progress: bool = True
    format: str = "onnx"
    optimize: bool = False  # ONNX Runtime's transformer fusions (export/optimize.py)
    allow_low_parity: bool = False


class ParityError(ValueError):
    """An export whose outputs are not finite, or differ from PyTorch by more than ``parity.FP32_TOLERANCE`` (fp32)
    or than ``parity.THRESHOLDS`` allow (quantized)."""


def default_check_file() -> Path:
    """The parity sentences without ``--check-file``: SST-2 dev where the data folder has it (the figures of
    docs/EXPORT.md), else the held-out sentences shipped in the package (an install without the data folder)."""
    from sharebert.formats.paths import data_path, packaged_heldout

    sst2 = data_path("glue", "SST-2", "dev.tsv")
    return sst2 if sst2.is_file() else packaged_heldout()


def infer_task(config: dict, model_dir=None) -> str:
    """Our task from the saved ``architectures`` (``...ForMaskedLM`` -> fill-mask, ...); a sentence-transformers
    folder (``modules.json`` in ``model_dir``) is a sentence encoder whatever its ``architectures`` say: many
    published ones say ``...ForMaskedLM`` (the class their base was pre-trained as) and hold no masked-LM head."""
    if model_dir is not None and (Path(model_dir) / "modules.json").is_file():
        return "feature-extraction"
    for arch in config.get("architectures") or []:
        for suffix, task in _ARCH_TASK.items():
            if arch.endswith(suffix):
                return task
    return "feature-extraction"


def load_model(model_dir: Path, task: str, config=None):
    """``(model, tokenizer)`` in eval mode, through the transformers Auto classes; ``config``: the folder's
    transformers config where the caller made it (a copy is loaded with), so ``config.json`` is not read again.

    Refuses weights that are unreadable, a head the checkpoint does not hold (it would be random) and a
    tokenizer larger than the model's vocabulary.
    """
    import copy

    import transformers

    import sharebert.model.modeling_sharebert  # noqa: F401  (registers the models with the Auto classes)
    from sharebert.formats.model_folder import load_tokenizer

    try:
        config = transformers.AutoConfig.from_pretrained(model_dir) if config is None else copy.deepcopy(config)
    except Exception as e:  # ValueError or TypeError for a field out of range
        raise ValueError(f"{model_dir / 'config.json'} is not a valid model config: {first_line(e)}") from None
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # missing weights are refused below, in one line
    try:
        model, info = getattr(transformers, _AUTO[task]).from_pretrained(
            model_dir, config=config, output_loading_info=True
        )
    except Exception as e:  # OSError, size mismatches, safetensors' own SafetensorError for a corrupt file
        raise ValueError(f"cannot load the weights in {model_dir} (model.safetensors): {first_line(e)}") from None
    finally:
        transformers.logging.set_verbosity(verbosity)
    missing = [k for k in info["missing_keys"] if not (task == "feature-extraction" and "pooler" in k)]
    if missing:
        raise ValueError(
            f"{model_dir} holds no trained weights for {len(missing)} tensors the {task} model needs "
            f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}): they would be random; "
            + _task_hint(model_dir, model.config.to_dict(), task)
        )
    try:  # the training commands' check: a tokenizer that fits the vocabulary, with [MASK] for fill-mask
        needs = ("mask",) if task == "fill-mask" else ()
        tokenizer = load_tokenizer(model_dir, int(model.config.vocab_size), needs, config=model.config)
    except ValueError:
        raise
    except Exception as e:  # OSError, or the tokenizers library's own error for a corrupt tokenizer.json
        raise ValueError(f"{model_dir / 'tokenizer.json'} cannot be read: {first_line(e)}") from None
    return model.eval(), tokenizer


def _task_hint(model_dir: Path, config: dict, failed: str) -> str:
    """What to export instead of ``failed``, whose head's weights the folder lacks: the task its files say, else
    (when they say ``failed`` itself: a head named in ``architectures`` but never saved) the encoder alone."""
    saved = infer_task(config, model_dir)
    if saved != failed:
        return f"export the task the folder was trained for (--task {saved})"
    if failed != "feature-extraction":
        return "its encoder's weights export as a sentence encoder (--task feature-extraction)"
    return "the weights file does not hold the model config.json describes"


def _versions() -> dict:
    out = {}
    for name in _VERSIONED:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def _session(path: Path, session_config: dict, level=None, optimized: Path | None = None, threads: int | None = None):
    import onnxruntime as ort

    options = artifact.session_options(session_config, threads, level, optimized, arena=False)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def session_options(artifact_dir):
    """``onnxruntime.SessionOptions`` with the artifact's ``session_config`` applied (e.g. for an
    ``ORTModel.from_pretrained(dir, session_options=...)``; int8 artifacts need it to fold at load).
    The artifact is verified first: session entries come only from the runtime's allow-list."""
    return artifact.session_options(artifact.verify_artifact(artifact_dir).get("session_config"))


def check_folding(path: Path, session_config: dict, scratch: Path) -> dict:
    """Whether ONNX Runtime folds every computed MatMul weight at session creation (ORT_ENABLE_BASIC).

    Returns ``computed_weights`` (in the file), ``unfolded`` (still computed per run after
    optimization: names) and ``folded`` (True when nothing is left per run).
    """
    import onnx
    import onnxruntime as ort

    from .graph import computed_product_weights

    before = sorted(set(computed_product_weights(onnx.load(str(path)).graph)))
    optimized = scratch / "optimized.onnx"
    _session(path, session_config, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, optimized)
    after = sorted(set(computed_product_weights(onnx.load(str(optimized)).graph)))
    optimized.unlink()
    return {"computed_weights": len(before), "unfolded": after, "folded": not after}


def _checked(parity: dict, o: ExportOptions, full_depth: bool = True) -> dict:
    """``parity`` with the check file and, for a quantized export, its thresholds; :class:`ParityError` when a
    figure is not finite, (fp32) off by more than ``FP32_TOLERANCE``, or (quantized, at full depth: the depth-1
    check runs on a few sentences only) below ``THRESHOLDS`` without ``allow_low_parity``."""
    import numpy as np

    from .parity import FP32_TOLERANCE, THRESHOLDS, below_thresholds

    quantize, check_file = o.quantize, o.check_file
    figures = {k: v for k, v in parity.items() if isinstance(v, float)}
    if not np.isfinite(list(figures.values())).all():
        raise ParityError(
            f"the export's outputs or PyTorch's are not finite (NaN or inf) on {check_file}: "
            f"{', '.join(f'{k} {v}' for k, v in figures.items())}"
        )
    if quantize == "none" and not parity["max_abs_diff"] <= FP32_TOLERANCE:
        raise ParityError(
            f"fp32 export differs from PyTorch by {parity['max_abs_diff']:.3g} (> {FP32_TOLERANCE}) "
            f"on {parity['sentences']} sentences of {check_file}"
        )
    below = below_thresholds(parity, quantize)
    if below and full_depth and not o.allow_low_parity:
        raise ParityError(
            f"--quantize {quantize} export falls below its parity thresholds on {parity['sentences']} "
            f"sentences of {check_file}: {'; '.join(below)} (docs/EXPORT.md); nothing was written "
            f"(--allow-low-parity publishes it anyway)"
        )
    extra = {"thresholds": THRESHOLDS[quantize], "below_thresholds": below} if quantize in THRESHOLDS else {}
    return {**parity, "check_file": str(check_file), **extra}


def _gflops(config, task: str, batch: int, seq: int) -> float | None:
    """Inference GFLOPs of one ``batch x seq`` forward, from the config (``sharebert.accounting.counts``)."""
    from sharebert.accounting.counts import count_flops

    fields = config.to_dict()
    if config.model_type not in ("sharebert", "bert"):  # another architecture: no ShareBERT accounting of its FLOPs
        return None
    if config.model_type != "sharebert":  # a transformers BERT: dense, post-LN, tanh pooler
        fields.update(sharing="none", embedding_size=None, pooler="dense", norm_position="post", attention="standard")
    head = {"fill-mask": "mlm", "causal-lm": "mlm", "text-classification": "classifier"}.get(task, "none")
    return count_flops(fields, head, seq, batch)["inference"] / 1e9


# Each encoder task's graph output and its dynamic axes (a classifier's logits are per sequence)
_OUTPUTS = {
    "fill-mask": ("logits", {0: "batch_size", 1: "sequence_length"}),
    "text-classification": ("logits", {0: "batch_size"}),
    "feature-extraction": ("last_hidden_state", {0: "batch_size", 1: "sequence_length"}),
}
ENCODER_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def export_graph(model, task: str, path: Path, opset: int) -> tuple[list[str], list[str]]:
    """The model's ONNX graph at ``path`` (torch's TorchScript exporter, no constant folding: only learned tensors
    are stored): an encoder takes ``ENCODER_INPUTS`` and gives its task's output, each dynamic in batch and
    length; a causal LM is :func:`export_decoder`'s graph. Returns the input and output names."""
    from .torch_onnx import export_onnx, text_inputs

    if task == "causal-lm":
        return export_decoder(model, path, opset)
    output, axes = _OUTPUTS[task]
    feeds = text_inputs(ENCODER_INPUTS, int(model.config.vocab_size))
    return export_onnx(model, feeds, path, {output: axes}, opset, fixed={"return_dict": True})


class _PastCache:
    """The key/value cache of a decoder graph: layer ``i``'s past keys and values ``(B, heads, P, d)`` (graph
    inputs), to which each layer appends its new ones (``update``, as transformers' ``DynamicCache`` does); the
    results are the graph's ``present`` outputs. ``P`` may be 0 (the first step)."""

    def __init__(self, past: list[tuple]):
        self.layers = [tuple(kv) for kv in past]

    def get_seq_length(self, layer_idx: int = 0):
        return self.layers[layer_idx][0].shape[2]

    def update(self, key, value, layer_idx: int, *args, **kwargs):
        import torch

        past_key, past_value = self.layers[layer_idx]
        self.layers[layer_idx] = (torch.cat([past_key, key], dim=2), torch.cat([past_value, value], dim=2))
        return self.layers[layer_idx]


def export_decoder(model, path: Path, opset: int) -> tuple[list[str], list[str]]:
    """A causal LM with its key/value cache as one graph for every step (the first with past length 0), with
    the input and output names ONNX Runtime generation loops use: ``input_ids`` and ``position_ids`` ``(B, T)``,
    ``attention_mask`` ``(B, P + T)``, per layer ``past_key_values.{i}.key|value`` ``(B, heads, P, d)`` in and
    ``present.{i}.key|value`` ``(B, heads, P + T, d)`` out, and ``logits`` ``(B, T, vocab)``."""
    import torch

    from sharebert.model.modeling_sharebert import CACHE

    from .torch_onnx import TEXT_AXES, export_onnx, text_inputs

    c = model.config
    layers, heads, past = int(c.num_hidden_layers), int(c.num_attention_heads), 16
    feeds = text_inputs(("input_ids",), int(c.vocab_size))
    B, T = feeds["input_ids"].shape
    feeds["attention_mask"] = torch.ones(B, past + T, dtype=torch.long)
    feeds["position_ids"] = torch.arange(past, past + T).expand(B, T).clone()
    kv = [(f"{i}.{part}") for i in range(layers) for part in ("key", "value")]
    g = torch.Generator().manual_seed(0)
    feeds.update({f"past_key_values.{n}": torch.randn(B, heads, past, c.hidden_size // heads, generator=g) for n in kv})
    axes = {
        "input_ids": TEXT_AXES,
        "position_ids": TEXT_AXES,
        "attention_mask": {0: "batch_size", 1: "past_sequence_length + sequence_length"},
        **{f"past_key_values.{n}": {0: "batch_size", 2: "past_sequence_length"} for n in kv},
    }
    outputs = {
        "logits": TEXT_AXES,
        **{f"present.{n}": {0: "batch_size", 2: "past_sequence_length + sequence_length"} for n in kv},
    }

    def call(forward, inputs):
        pairs = [(inputs[f"past_key_values.{i}.key"], inputs[f"past_key_values.{i}.value"]) for i in range(layers)]
        out = forward(
            input_ids=inputs["input_ids"],
            attention_mask=inputs["attention_mask"],
            position_ids=inputs["position_ids"],
            use_cache=True,
            return_dict=True,
            **{CACHE: _PastCache(pairs)},
        )
        return (out.logits, *(t for kv_pair in getattr(out, CACHE).layers for t in kv_pair))

    return export_onnx(model, feeds, path, outputs, opset, axes=axes, call=call)


def _calibration_feeds(tokenizer, path, max_length: int, graph: Path) -> list[dict]:
    """One feed per calibration sentence, with every input ``graph`` takes (a causal LM's empty cache too)."""
    import onnxruntime as ort

    from .parity import encode, read_sentences

    sentences, _ = read_sentences(path, CALIBRATION_SENTENCES)
    inputs = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"]).get_inputs()
    feeds = [encode(tokenizer, [s], max_length) for s in sentences]
    return [
        {
            **artifact.model_feeds(inputs, f["input_ids"], f["attention_mask"]),
            **{k: v for k, v in f.items() if k in {i.name for i in inputs}},
        }
        for f in feeds
    ]


def _validate(model_dir, out_dir, o: ExportOptions, run_teacher=None) -> tuple[Path, Path, ExportOptions]:
    """Every check that needs no model loaded; returns the paths and the options with task and check file resolved.
    ``run_teacher``: the folder as compress read it (:func:`export_model`)."""
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    # read_config also refuses an artifact given as --model
    config = read_config(model_dir, model_types=None) if run_teacher is None else run_teacher.raw
    if config.get("model_type") not in ("sharebert", "bert"):  # any encoder (export/teacher.py), named in one line
        from sharebert.training.teacher import check_teacher

        check_teacher(config, model_dir / "config.json")
    task = o.task or infer_task(config, model_dir)
    _check_task(model_dir, config, task)
    _check_modes(o, task)
    _check_shapes(o.shapes, config.get("max_position_embeddings"))
    check_has_tokenizer(model_dir)  # before the weights load
    if task == "feature-extraction":
        embedding_recipe(model_dir)  # a malformed sentence-transformers file: refused now, naming it
    out_dir = check_out_dir(out_dir, "sharebert artifact", artifact.is_artifact, o.overwrite, inputs=[model_dir])
    check_file = Path(o.check_file) if o.check_file else default_check_file()
    weights = "materialized" if o.quantize in ("int8-dynamic", "int8-static") else o.weights
    return model_dir, out_dir, replace(o, task=task, check_file=check_file, weights=weights)


def _check_task(model_dir: Path, config: dict, task: str) -> None:
    """``ValueError`` for a task the artifact format has not, or the other objective of the model's own head."""
    if task not in artifact.TASKS:
        raise ValueError(f"unsupported task {task!r}; choose one of {', '.join(artifact.TASKS)}")
    saved = infer_task(config, model_dir)
    if {task, saved} == {"fill-mask", "causal-lm"}:  # the same head's weights, trained for the other objective
        raise ValueError(
            f"{model_dir} holds a {saved} model ({', '.join(config.get('architectures') or [])}), "
            f"not a {task} one: its predictions would be meaningless; export --task {saved}"
        )


def _check_modes(o: ExportOptions, task: str) -> None:
    """``ValueError`` for weights, quantization, format and optimization that do not exist or do not go together,
    then :func:`_check_inputs`."""
    from .quantize import MODES

    weights, quantize, calibration, opset, check_limit = o.weights, o.quantize, o.calibration, o.opset, o.check_limit
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
    if quantize not in MODES:
        raise ValueError(f"quantize must be one of {', '.join(MODES)}, got {quantize!r}")
    if o.format not in artifact.MODEL_FORMATS:
        raise ValueError(f"--format must be one of {', '.join(artifact.MODEL_FORMATS)}, got {o.format!r}")
    if o.format == "ort" and (weights != "compact" or quantize not in ("none", "int8", "fp16")):
        raise ValueError(
            f"--format ort keeps weight generation in the graph: it needs --weights compact and --quantize "
            f"none, int8 or fp16 (got --weights {weights}, --quantize {quantize}); for stored weights, "
            f"convert model.onnx with python -m onnxruntime.tools.convert_onnx_models_to_ort"
        )
    if o.format == "web" and (quantize not in ("none", "int8") or task == "causal-lm"):
        raise ValueError(
            f"--format web is checked with onnxruntime-web for encoders at --quantize none or int8 (weight-only, "
            f"onnx/model_quantized.onnx); got --quantize {quantize}, --task {task}"
        )
    if o.optimize and (quantize != "none" or o.format != "onnx" or task == "causal-lm"):
        raise ValueError(
            f"--optimize applies ONNX Runtime's fp32 encoder fusions: it needs --quantize none, --format onnx "
            f"and an encoder task (got --quantize {quantize}, --format {o.format}, --task {task})"
        )
    _check_inputs(opset, quantize, calibration, check_limit)


def _check_inputs(opset, quantize: str, calibration, check_limit) -> None:
    """``ValueError`` for an opset out of range, a calibration file missing or not asked for, a bad check limit."""
    if not isinstance(opset, int) or not MIN_OPSET <= opset <= MAX_OPSET:
        raise ValueError(f"unsupported opset {opset!r}; use {MIN_OPSET}..{MAX_OPSET} (default 17)")
    if quantize == "int8-static" and calibration is None:
        raise ValueError(
            "--quantize int8-static needs --calibration FILE (sentences, one per line or a .tsv with a "
            "'sentence' column)"
        )
    if calibration is not None and quantize != "int8-static":
        raise ValueError("--calibration only applies to --quantize int8-static")
    if calibration is not None:
        from .parity import read_sentences

        read_sentences(calibration, 1)  # missing, empty or not text: clear error now
    if check_limit is not None and not (isinstance(check_limit, int) and check_limit > 0):
        raise ValueError(f"--check-limit must be a positive number of sentences, got {check_limit!r}")


def _check_shapes(shapes, positions) -> None:
    """``ValueError`` for a ``--shapes`` entry that is not ``BxT`` or is longer than the model's ``positions``."""
    for shape in shapes:
        parts = str(shape).lower().split("x")
        if len(parts) != 2 or not all(x.isdigit() and int(x) > 0 for x in parts):
            raise ValueError(f"--shapes expects BxT such as 1x128, got {shape!r}")
        if isinstance(positions, int) and int(parts[1]) > positions:
            raise ValueError(
                f"--shapes {shape}: the model has {positions} positions; measure sequences of at most "
                f"{positions} tokens (e.g. 1x{positions})"
            )


def embedding_recipe(model_dir: Path):
    """``(recipe, dense weights)`` of a feature-extraction export: the folder's sentence-transformers recipe
    (``sharebert.formats.recipe``), or the default ([CLS] pooling) when it has none."""
    from sharebert.formats.recipe import read_dense_weights, read_recipe

    recipe = read_recipe(model_dir)
    return recipe, [read_dense_weights(model_dir, layer) for layer in recipe.dense]


def trained_on_pairs(model_dir: Path, task: str, raw: dict | None = None) -> bool | None:
    """A text-classification model's ``pairs`` for the manifest: whether the GLUE task its folder records
    (``metrics.json`` of finetune / distill, else ``config.json``'s ``finetuning_task``) reads sentence pairs;
    None when the folder does not say (deploy then decides by the input alone and says so). ``raw``: its
    ``config.json`` where the caller has read it."""
    from sharebert.training.glue import TASKS, recorded_task

    if task != "text-classification":
        return None
    glue, _ = recorded_task(model_dir)
    if glue is None:
        raw = read_config(model_dir, unfinished_ok=True, model_types=None) if raw is None else raw
        name = str(raw.get("finetuning_task") or "").lower().replace("-", "")
        glue = TASKS.get(name)
    return None if glue is None else glue.pairs


def export_model(model_dir, out_dir, options: ExportOptions | None = None, run_teacher=None, **fields) -> dict:
    """Export ``model_dir`` to the artifact folder ``out_dir``; return its manifest.

    ``options`` (:class:`ExportOptions`), or its fields as keywords (``task="fill-mask"``, ...).
    Raises ``ValueError``/``FileNotFoundError`` for bad input (nothing written) and
    :class:`ParityError` when an export's outputs are not finite or (fp32) differ from PyTorch by more than 1e-3.
    ``run_teacher``: ``model_dir`` as compress read it (``pipelines.run.Teacher``: its ``config.json`` read and checked
    once, its transformers config), so the folder's ``config.json`` is not read again.
    """
    from .parity import Check, read_sentences

    options = replace(options or ExportOptions(), **fields)
    model_dir, out_dir, o = _validate(model_dir, out_dir, options, run_teacher)
    sentences, labels = read_sentences(o.check_file, o.check_limit)
    raw, config = (None, None) if run_teacher is None else (run_teacher.raw, run_teacher.config)
    model, tokenizer = load_model(model_dir, o.task, config)
    recipe = embedding_recipe(model_dir) if o.task == "feature-extraction" else None
    check = Check(model, tokenizer, o.task, sentences, labels, _max_length(model, tokenizer, recipe))
    created = [p for p in (out_dir.parent, *out_dir.parent.parents) if not p.exists()]
    tmp = None
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        _sweep_stale(out_dir)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-{os.getpid()}-", dir=out_dir.parent))
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp's 0700 would hide the published artifact from other users
        manifest = _build(_Export(check, o, tmp, recipe, trained_on_pairs(model_dir, o.task, raw)))
        _publish(tmp, out_dir)
        _sweep_stale(out_dir)  # now that the new artifact is in place: an .old- one a killed export left
    except BaseException as e:
        full = disk_full(e, tmp)  # before the clean-up frees the space
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        for folder in created:  # the parents this call made, innermost first, if still empty
            try:
                folder.rmdir()
            except OSError:
                break
        if full:
            raise ValueError(
                f"no space left on the device (or file size limit reached) while writing {out_dir}: nothing was written"
            ) from None
        raise
    return manifest


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _sweep_stale(out_dir: Path) -> None:
    """Remove what an export into ``out_dir`` killed midway (kill -9) left beside it: its half-built
    ``.NAME.tmp-PID-XXXXXXXX`` folder (``mkdtemp``'s 8-character suffix), and its ``.NAME.old-PID`` (the
    artifact it replaced) once ``out_dir`` is in place again. Only those exact names, only real folders (not
    links), only of processes that no longer run: a user's own ``.NAME.old-notes`` is never touched."""
    own = re.compile(rf"\.{re.escape(out_dir.name)}\.(?:tmp-(\d+)-[a-z0-9_]{{8}}|old-(\d+))")
    for stale in out_dir.parent.iterdir():
        m = own.fullmatch(stale.name)
        if m is None or stale.is_symlink() or not stale.is_dir() or _alive(int(m[1] or m[2])):
            continue
        if m[1] or out_dir.is_dir():
            shutil.rmtree(stale, ignore_errors=True)


def _publish(tmp: Path, out_dir: Path) -> None:
    """Move the finished folder into place (replacing an old one only once the new one is complete)."""
    old = None
    if out_dir.exists():
        old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
        out_dir.rename(old)
    tmp.rename(out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _learned_params(model, task: str) -> int:
    """The learned parameters the exported graph holds: a feature-extraction graph outputs the token states,
    so the backbone's pooler (BERT's dense + tanh over [CLS]) is not in it."""
    if task != "feature-extraction":
        return int(model.num_parameters())
    return sum(p.numel() for name, p in model.named_parameters() if not name.startswith("pooler."))


def _save_tokenizer(tokenizer, folder: Path, max_length: int) -> None:
    """The tokenizer files, agreeing with the manifest's ``max_length``: ``tokenizer_config.json``'s
    ``model_max_length`` and ``tokenizer.json``'s truncation (no padding: the runtime pads each call)."""
    from tokenizers import Tokenizer

    tokenizer.model_max_length = max_length
    tokenizer.save_pretrained(folder)
    path = folder / "tokenizer.json"
    if path.is_file():
        backend = Tokenizer.from_file(str(path))
        backend.no_padding()
        backend.enable_truncation(max_length)
        backend.save(str(path))


@dataclass(frozen=True)
class _Export:
    """What one export knows, handed to each of its steps: the PyTorch side of its parity checks (``parity.Check``:
    the model, tokenizer, task, check sentences and the artifact's maximum length), the options, the folder being
    written, the embedding recipe (``(EmbeddingRecipe, dense weights)`` of a feature-extraction export: its pooling
    and Dense layers become the graph's ``sentence_embedding`` output, its ``max_seq_length`` bounds the maximum
    length, the manifest's ``embedding`` entry records it) and a classifier's ``pairs``."""

    check: Check
    o: ExportOptions
    tmp: Path
    recipe: tuple | None = None
    pairs: bool | None = None

    @property
    def model(self):
        return self.check.model

    @property
    def tokenizer(self):
        return self.check.tokenizer

    @property
    def max_length(self) -> int:
        return self.check.max_length

    @property
    def path(self) -> Path:
        return self.tmp / artifact.MODEL


@dataclass
class _Graph:
    """``model.onnx`` as the export's first steps leave it and what they found on the way (the web format drops its
    ``depth`` input afterwards)."""

    inputs: list[str]
    outputs: list[str]
    proto: object
    learned: int  # the learned parameters it holds, the recipe's Dense layers included
    session_config: dict
    folding: dict  # check_folding's figures
    folded: dict | None  # what materialization folded (None: compact weights)
    dtypes: dict
    max_depth: int | None
    depth_note: str | None
    fusions: dict | None  # --optimize's


def _build(job: _Export) -> dict:
    """Write the artifact into ``job.tmp`` (graph, checks, tokenizer, config, RAM-int8 graphs, footprint, manifest)."""
    from sharebert.formats.bars import bar

    steps = bar(total=6, desc="export", progress=job.o.progress)
    g = _graph(job, steps)

    steps.set_postfix_str("parity")
    parity, reference = _parity(job, g)
    steps.update()

    steps.set_postfix_str("tokenizer, config, ram-int8")
    ram_int8 = _write_model_files(job)
    steps.update()

    steps.set_postfix_str("footprint")
    footprint = _footprint(job, g)
    steps.update()
    steps.close()
    ort_entry, web_entry = _convert(job, g, footprint)
    manifest = _manifest(job, g, parity, footprint)
    _add_extras(manifest, job, ram_int8, ort_entry)
    if web_entry is not None:
        manifest.update(model_format="web", web=web_entry)
    if reference is not None:  # the artifact's own check on the device (`sharebert verify`)
        from .parity import reference_thresholds

        int8_ready = bool((manifest.get("ram_int8") or {}).get("weights"))
        manifest[REFERENCE] = {**reference, "thresholds": reference_thresholds(job.o.quantize, int8_ready)}
    _write_manifest(job.tmp, manifest)
    if (manifest.get("ram_int8") or {}).get("weights"):  # RAM int8 on the finished folder, as the device loads it
        from .ram_int8 import measure_ram_int8

        labels = job.check.labels
        check = replace(
            job.check,
            sentences=job.check.sentences[:RAM_INT8_CHECK_SENTENCES],
            labels=labels[:RAM_INT8_CHECK_SENTENCES] if labels else None,
        )
        parity, at_export = measure_ram_int8(job.tmp, check, job.recipe)
        manifest["ram_int8"]["parity"] = parity
        if at_export is not None:
            manifest[REFERENCE]["at_export_ram_int8"] = at_export
        (job.tmp / artifact.MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def _graph(job: _Export, steps) -> _Graph:
    """The first three steps: the model to ONNX, its weights as asked, the folding check, the depth gating, the
    sentence embedding's nodes and ``--optimize``'s fusions; ``model.onnx`` written as the checks read it."""
    o, path = job.o, job.path
    config = job.model.config
    learned = _learned_params(job.model, o.task)
    scratch = Path(tempfile.mkdtemp(dir=job.tmp))

    steps.set_postfix_str("torch -> onnx")
    inputs, outputs, proto = _to_onnx(job, learned)
    steps.update()

    steps.set_postfix_str(f"{o.weights}, quantize={o.quantize}")
    proto, folded = _store_weights(job, proto, scratch)
    session_config = dict(artifact.INT8_SESSION_CONFIG) if o.quantize == "int8" else {}
    steps.update()

    steps.set_postfix_str("folding check")
    folding = check_folding(path, session_config, scratch)
    shutil.rmtree(scratch)
    from . import quantize as q

    dtypes = q.tensor_dtypes(proto)  # of the flat graph: the gated layers' ops sit in If branches below
    max_depth, depth_note = _gate_depth(proto, config)
    if job.recipe is not None:  # after the depth gating: the pooling reads the final token states at any depth
        from .sentence_embedding import add_sentence_embedding

        add_sentence_embedding(proto, *job.recipe, o.opset)
        learned += sum(w.size + (0 if b is None else b.size) for w, b in job.recipe[1])
    if max_depth or job.recipe is not None:
        import onnx

        onnx.save(proto, str(path))
    fusions = None
    if o.optimize:  # ONNX Runtime's transformer fusions; weight generation and the depth gating stay
        from .optimize import fuse

        fusions = fuse(path, config)
    steps.update()
    return _Graph(
        inputs=inputs,
        outputs=outputs,
        proto=proto,
        learned=learned,
        session_config=session_config,
        folding=folding,
        folded=folded,
        dtypes=dtypes,
        max_depth=max_depth,
        depth_note=depth_note,
        fusions=fusions,
    )


def _convert(job: _Export, g: _Graph, footprint: dict) -> tuple[dict | None, dict | None]:
    """The ONNX graph checked and measured above turned into ``--format``'s (ORT format or transformers.js' onnx/
    folder), ``footprint`` updated to the files now there: ``(ort entry, web entry)``, None for the one not asked."""
    o, tmp = job.o, job.tmp
    ort_entry = web_entry = None
    if o.format == "web":
        from .sentence_embedding import OUTPUT
        from .web_format import to_web_format

        embedding = None if job.recipe is None else {**job.recipe[0].as_dict(), "output": OUTPUT}
        about = {"task": o.task, "max_length": job.max_length, "embedding": embedding}
        web_entry = to_web_format(tmp, g.session_config, o.quantize, job.check, about)
        g.inputs = [i for i in g.inputs if i != artifact.DEPTH]
        g.max_depth, g.depth_note = None, "transformers.js feeds no depth input"
    if o.format == "ort":
        from .ort_format import to_ort_format

        ort_entry = to_ort_format(tmp, g.session_config, job.tokenizer, job.check.sentences, job.max_length)
    entry = web_entry or ort_entry
    if entry is not None:
        footprint.update(
            file_bytes=entry["model_bytes"],
            bytes_per_learned_param=entry["model_bytes"] / g.learned,
            artifact_bytes=_folder_bytes(tmp),
        )
    return ort_entry, web_entry


def _manifest(job: _Export, g: _Graph, parity: dict, footprint: dict) -> dict:
    """The manifest's entries every artifact has (``files`` filled in by :func:`_write_manifest`)."""
    o, config = job.o, job.model.config
    return {
        "format": artifact.FORMAT,
        "format_version": artifact.FORMAT_VERSION,
        "task": o.task,
        "model_type": config.model_type,
        "inputs": list(g.inputs),
        "outputs": list(g.outputs),
        **_labels(config, o.task),
        "max_length": job.max_length,
        "opset": o.opset,
        "weights": o.weights,
        "quantization": o.quantize,
        "session_config": g.session_config,
        "learned_params": g.learned,
        "max_depth": g.max_depth,
        "depth_note": g.depth_note,
        "special_tokens": _special_tokens(job.tokenizer),
        "files": {},
        "versions": _versions(),
        "parity": parity,
        "cpu": cpu_info(),  # the machine of the parity and footprint figures
        "footprint": footprint,
        "tensor_dtypes": g.dtypes,
        "optimized": g.fusions,
    }


def _max_length(model, tokenizer, recipe) -> int:
    """The longest input the artifact takes: the model's positions (another architecture: what its tokenizer
    and positions allow), at most the embedding recipe's ``max_seq_length``."""
    from sharebert.training.teacher import usable_length

    from .teacher import exports_here

    config = model.config
    max_length = usable_length(model, tokenizer) if exports_here(config) else int(config.max_position_embeddings)
    if recipe is not None and recipe[0].max_seq_length:
        max_length = min(max_length, recipe[0].max_seq_length)
    return max_length


def _to_onnx(job: _Export, learned: int):
    """The model exported to ``model.onnx`` and cleaned up (no initializer as input, one node per distinct constant):
    its inputs, outputs and proto. ``RuntimeError`` when the graph stores more numbers than the model learned."""
    import onnx

    from . import graph
    from .teacher import export_encoder, exports_here

    model, o, path = job.model, job.o, job.path
    if exports_here(model.config):  # another encoder architecture: the inputs its tokenizer gives (export/teacher.py)
        inputs, outputs = export_encoder(model, job.tokenizer, o.task, path, o.opset)
    else:
        inputs, outputs = export_graph(model, o.task, path, o.opset)
    proto = onnx.load(str(path))
    graph.remove_initializer_inputs(proto)
    graph.dedup_constants(proto)
    stored_numel = sum(v["numel"] for k, v in graph.stored_tensors(proto, 2).items() if k.startswith("float"))
    if not stored_numel <= learned:
        raise RuntimeError(
            f"the exported graph stores {stored_numel:,} numbers but the model has {learned:,} learned "
            f"parameters: a generated or transposed copy was written"
        )
    return inputs, outputs, proto


def _store_weights(job: _Export, proto, scratch: Path):
    """``model.onnx`` with its weights as ``--weights`` and ``--quantize`` ask; returns the proto (re-read after a
    quantizer that works on files) and what materialization folded (None: compact weights)."""
    import onnx

    from . import graph
    from . import quantize as q

    o, path = job.o, job.path
    folded = graph.materialize(proto, views=o.quantize.startswith("int8-")) if o.weights == "materialized" else None
    if o.quantize in ("int8", "fp16"):
        q.weight_only(proto, o.quantize)
    onnx.save(proto, str(path))
    if o.quantize in ("int8-dynamic", "int8-static"):
        fp32 = scratch / "fp32.onnx"
        path.rename(fp32)
        if o.quantize == "int8-dynamic":
            q.dynamic_int8(fp32, path)
        else:
            q.static_int8(fp32, path, _calibration_feeds(job.tokenizer, o.calibration, job.max_length, fp32))
        fp32.unlink()
        proto = onnx.load(str(path))
    return proto, folded


def _gate_depth(proto, config) -> tuple[int | None, str | None]:
    """A sharebert graph's layers gated by a ``depth`` input (``export/depth.py``): the maximum depth, or None
    and the reason the artifact runs at full depth only."""
    from . import depth

    if config.model_type != "sharebert":
        return None, "depth at inference is for sharebert models, whose forward(depth=) the export checks against"
    try:
        max_depth = depth.wrap_layers(proto) or None  # checked flat above; gated by a depth input from here on
    except depth.DepthError as e:  # an unusual graph: the artifact still works, at full depth only
        return None, str(e)
    return max_depth, None if max_depth else "the model has fewer than two encoder layers"


def _parity(job: _Export, g: _Graph) -> tuple[dict, dict | None]:
    """The export's parity with PyTorch (:func:`_checked`): at full depth, at depth 1 on the first sentences
    (the gating works as PyTorch's depth does), and of the sentence embedding; and the manifest's ``reference``
    (a few of the sentences and PyTorch's outputs on them, :func:`parity.reference_entry`), or None."""
    from .parity import check_parity, reference_entry

    o, check, recipe = job.o, job.check, job.recipe
    session = _session(job.path, g.session_config, threads=o.threads)
    parity = _checked(check_parity(check, session, progress=o.progress), o)
    if g.max_depth:
        first = replace(check, sentences=check.sentences[:DEPTH_CHECK_SENTENCES], labels=None)
        parity["depth_1"] = _checked(check_parity(first, session, progress=False, depth=1), o, full_depth=False)
    embedding = None
    if recipe is not None:
        from .sentence_embedding import OUTPUT, embedding_parity, reference

        parity["sentence_embedding"] = _checked(embedding_parity(check, session, *recipe), o)
        embedding = (OUTPUT, lambda hidden, mask: reference(hidden, mask, *recipe))
    return parity, reference_entry(check, session, embedding)


def _write_model_files(job: _Export):
    """The config (without ``auto_map``), the tokenizer and the RAM-int8 graphs; returns the RAM-int8 entry
    (None: not built)."""
    from .ram_int8 import build_int8_ram_graphs
    from .teacher import exports_here

    tmp, config, o = job.tmp, job.model.config, job.o
    config.save_pretrained(tmp)
    saved = read_json(tmp / "config.json")
    if saved.pop("auto_map", None) is not None:  # a portable model's PyTorch code, which the artifact does not carry
        write_json(tmp / "config.json", saved)
    _save_tokenizer(job.tokenizer, tmp, job.max_length)
    if not (tmp / "tokenizer.json").is_file():
        raise RuntimeError("the tokenizer did not write tokenizer.json")
    if o.weights == "compact" and o.format == "onnx" and not o.optimize and not exports_here(config):
        return build_int8_ram_graphs(tmp)  # RAM-int8 holds generated weights: sharebert's only
    return None


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _footprint(job: _Export, g: _Graph) -> dict:
    """The graph's sizes, load and run figures (measured in a subprocess) and GFLOPs."""
    from . import graph
    from .footprint import measure

    o, path, config = job.o, job.path, job.model.config
    run = measure(path, g.session_config, o.shapes, o.threads, o.runs, vocab=int(config.vocab_size))
    file_bytes = path.stat().st_size
    batch, seq = (int(x) for x in o.shapes[0].lower().split("x"))
    footprint = {
        "file_bytes": file_bytes,
        "artifact_bytes": _folder_bytes(job.tmp),
        "learned_params": g.learned,
        "bytes_per_learned_param": file_bytes / g.learned,
        "initializer_bytes": {k: v["bytes"] for k, v in graph.stored_tensors(g.proto).items()},
        "folded": g.folding["folded"],
        "folding": g.folding,
        **run,
        "gflops": _gflops(config, o.task, batch, seq),
        "gflops_shape": o.shapes[0],
    }
    if g.folded is not None:
        footprint["materialized"] = g.folded
    return footprint


def _labels(config, task: str) -> dict:
    """A classifier's ``labels`` (in id order) and ``problem_type``; None for other tasks."""
    if task != "text-classification":
        return {"labels": None, "problem_type": None}
    problem_type = config.problem_type or ("regression" if config.num_labels == 1 else "single_label_classification")
    return {"labels": [config.id2label[i] for i in range(config.num_labels)], "problem_type": problem_type}


def _special_tokens(tokenizer) -> dict:
    special = {name: getattr(tokenizer, f"{name}_token_id") for name in ("pad", "mask", "cls", "sep", "unk")}
    return {k: int(v) for k, v in special.items() if v is not None}


def _add_extras(manifest: dict, job: _Export, ram_int8, ort_entry) -> None:
    """The manifest entries only some artifacts have: pairs, embedding, RAM-int8 graphs, ORT format."""
    if job.o.task == "text-classification":
        manifest[artifact.PAIRS] = job.pairs
    if job.recipe is not None:
        from .sentence_embedding import OUTPUT

        manifest["embedding"] = {**job.recipe[0].as_dict(), "output": OUTPUT}
        manifest["outputs"].append(OUTPUT)
    if ram_int8:  # {}: no computed weight large enough to hold as int8 (a very small model)
        manifest["ram_int8"] = ram_int8
    if ort_entry is not None:
        manifest.update(format_version=artifact.ORT_FORMAT_VERSION, model_format="ort", ort=ort_entry)


def _write_manifest(tmp: Path, manifest: dict) -> None:
    """``manifest.json`` with the sha256 and size of every file of the folder."""
    for file in sorted(p for p in tmp.rglob("*") if p.is_file()):
        rel = file.relative_to(tmp).as_posix()
        manifest["files"][rel] = {"sha256": artifact.sha256(file), "bytes": file.stat().st_size}
    (tmp / artifact.MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def format_report(manifest: dict) -> str:
    """The printed export report: artifact, parity and footprint in a few lines."""
    f, p = manifest["footprint"], manifest["parity"]
    lines = [
        f"task {manifest['task']}, weights {manifest['weights']}, quantization {manifest['quantization']}, "
        f"opset {manifest['opset']}",
        f"file            {f['file_bytes']:,} B  ({f['bytes_per_learned_param']:.3f} B per learned parameter; "
        f"{f['learned_params']:,} learned)",
        "initializers    " + ", ".join(f"{k} {v:,} B" for k, v in f["initializer_bytes"].items()),
        f"folded at load  {'yes' if f['folded'] else 'NO'} ({f['folding']['computed_weights']} computed weights, "
        f"{len(f['folding']['unfolded'])} left per run)",
        f"session create  {f['session_create_s'] * 1e3:.0f} ms; peak RSS {f['rss_baseline_mb']:.0f} MB before, "
        f"{f['peak_rss_load_mb']:.0f} MB after load ({f['rss_after_load_mb']:.0f} MB resident), "
        f"{f['peak_rss_run_mb']:.0f} MB after a run",
    ]
    for shape, lat in f["latency"].items():
        lines.append(
            f"latency {shape:7s} p50 {lat['p50_ms']:.2f} ms, p95 {lat['p95_ms']:.2f} ms ({f['threads']} thread)"
        )
    if f.get("gflops") is not None:
        lines.append(f"GFLOPs ({f['gflops_shape']})  {f['gflops']:.3f}")
    lines.append(f"measured on     {describe(manifest.get('cpu'))}")

    def figures(parity):
        return ", ".join(
            f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
            for k, v in parity.items()
            if k != "check_file" and not isinstance(v, (dict, list))
        )

    lines.append(f"parity          {figures(p)}")
    if manifest.get("embedding"):
        e = manifest["embedding"]
        dense = "".join(
            f" -> Dense {d['in_features']}x{d['out_features']} {d['activation'].rsplit('.', 1)[-1]}" for d in e["dense"]
        )
        lines.append(
            f"embedding       {e['pooling']} pooling{dense}{', normalised' if e['normalize'] else ''}, "
            f"{manifest['max_length']} tokens ({e['source']}); {figures(p['sentence_embedding'])}"
        )
    if p.get("below_thresholds"):
        lines.append(f"LOW PARITY      published with --allow-low-parity: {'; '.join(p['below_thresholds'])}")
    if manifest.get("max_depth"):
        lines.append(
            f"depth           1..{manifest['max_depth']} at inference (`--depth`); at depth 1: {figures(p['depth_1'])}"
        )
    else:
        lines.append(f"depth           full depth only ({manifest.get('depth_note')})")
    reference = manifest.get(REFERENCE)
    if reference:
        shape = reference["input_ids"]["shape"]
        lines.append(
            f"reference       {shape[0]} inputs and PyTorch's outputs stored for `sharebert verify`; here: "
            + "; ".join(f"{name} {figures(v)}" for name, v in reference["at_export"].items())
        )
    dtypes = manifest["tensor_dtypes"]
    lines.append(
        "stored tensors  " + ", ".join(f"{k}: {len(v)}" for k, v in dtypes["stored"].items()) + f"; ops {dtypes['ops']}"
    )
    if dtypes["computed_fp32_weights"]:
        lines.append(f"weights computed in-graph, fp32 at load: {len(dtypes['computed_fp32_weights'])}")
    return "\n".join(lines)
