"""A torch module -> an ONNX file with named, dynamic inputs and outputs (torch's TorchScript exporter).

Architecture-neutral: the module's ``forward`` takes the named inputs as keywords (a transformers encoder:
``input_ids``, ``attention_mask``, ``token_type_ids`` when it has them) and returns a ``ModelOutput``, a dict
or a tuple, from which the named outputs are taken in order. ``sharebert export`` calls it for sharebert and
BERT folders (``exporter.py``), and it exports any transformers text encoder the same way (DistilBERT, RoBERTa,
MPNet, DeBERTa... as teachers or baselines), with no optimum.

The exporter is the TorchScript one (``dynamo=False``): it writes the traced operations as they run, without
constant folding, so a sharebert graph stores only learned tensors and computes its generated weights with
nodes (the graph passes of ``graph.py`` and ``depth.py`` rely on that form).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

# The axes of transformers' text tensors, named as optimum's exporters name them (ONNX Runtime and the
# artifacts' readers see the same dimension names whichever exporter wrote the graph)
TEXT_AXES = {0: "batch_size", 1: "sequence_length"}


@contextlib.contextmanager
def _traced_forward(model: torch.nn.Module, inputs: list[str], call):
    """``model.forward`` replaced, while the exporter traces it, by one taking the ``inputs`` positionally and
    returning ``call(forward, {name: tensor})``, a tuple of tensors (the model itself is traced, not a wrapper
    module, so the graph's initializers keep the model's own parameter names)."""
    original = model.forward
    model.forward = lambda *args: call(original, dict(zip(inputs, args)))
    try:
        yield model
    finally:
        del model.forward  # the class's own again


def named_outputs(outputs: list[str], fixed: dict):
    """The ``call`` of :func:`export_onnx` that runs ``forward(**inputs, **fixed)`` and takes ``outputs`` from its
    result by name (a ``ModelOutput`` or dict) or, from a plain tuple, by position."""

    def call(forward, inputs):
        result = forward(**inputs, **fixed)
        if isinstance(result, tuple) and not hasattr(result, "keys"):
            return tuple(result[: len(outputs)])
        return tuple(result[name] for name in outputs)

    return call


def text_inputs(names, vocab_size: int, batch: int = 2, length: int = 16, seed: int = 0) -> dict[str, torch.Tensor]:
    """Example inputs to trace with, ``(batch, length)`` each: random token ids below ``vocab_size``, an attention
    mask of ones with the last row's end padded, token types 0 (valid for any ``type_vocab_size``)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    mask[-1, length // 2 :] = 0
    made = {
        "input_ids": ids,
        "attention_mask": mask,
        "token_type_ids": torch.zeros_like(ids),
        "position_ids": torch.arange(length).expand(batch, length).clone(),
    }
    unknown = [n for n in names if n not in made]
    if unknown:
        raise ValueError(f"no example input for {', '.join(unknown)}; pass the feeds yourself")
    return {n: made[n] for n in names}


def forward_inputs(model: torch.nn.Module, offered=("input_ids", "attention_mask", "token_type_ids")) -> list[str]:
    """Which of ``offered`` the model's ``forward`` takes, in ``offered``'s order (DistilBERT and RoBERTa-like models
    without token types take no ``token_type_ids``)."""
    import inspect

    params = inspect.signature(model.forward).parameters
    return [n for n in offered if n in params]


def export_onnx(  # 9: the five every caller passes, then keyword options with defaults as torch.onnx.export has
    model: torch.nn.Module,
    feeds: dict[str, torch.Tensor],
    path: str | Path,
    outputs: dict[str, dict],
    opset: int,
    axes: dict[str, dict] | None = None,
    fixed: dict | None = None,
    call=None,
    constant_folding: bool = False,
) -> tuple[list[str], list[str]]:
    """Export ``model`` traced on ``feeds`` (``{name: tensor}``, in the graph's input order) to ``path``.

    ``outputs``: ``{name: dynamic axes}`` of the graph's outputs, taken by name from the model's output (or by
    position from a tuple); ``axes``: each input's dynamic axes (default ``TEXT_AXES``); ``fixed``: keyword
    arguments the model is always called with (not graph inputs). ``call(forward, inputs)``: what the graph
    computes from the named inputs, a tuple in ``outputs``' order, when more than a forward (e.g. a decoder's
    cache built from its inputs); default :func:`named_outputs`. Returns the input and output names.
    """
    names, out_names = list(feeds), list(outputs)
    axes = {n: dict((axes or {}).get(n, TEXT_AXES)) for n in names}
    call = call or named_outputs(out_names, dict(fixed or {}))
    with torch.no_grad(), _traced_forward(model.eval(), names, call) as traced:
        torch.onnx.export(
            traced,
            tuple(feeds.values()),
            str(path),
            input_names=names,
            output_names=out_names,
            dynamic_axes={**axes, **{n: dict(a) for n, a in outputs.items()}},
            opset_version=opset,
            do_constant_folding=constant_folding,
            dynamo=False,
        )
    return names, out_names


def export_text_encoder(
    model: torch.nn.Module,
    path: str | Path,
    opset: int = 17,
    output: str = "last_hidden_state",
    output_axes: dict | None = None,
) -> tuple[list[str], list[str]]:
    """A transformers text model (any architecture) -> ``path``: the inputs its ``forward`` takes among
    ``input_ids``, ``attention_mask`` and ``token_type_ids``, dynamic batch and length, and ``output``
    (``last_hidden_state`` by default, ``logits`` for a head) with ``output_axes`` (default ``TEXT_AXES``)."""
    names = forward_inputs(model)
    feeds = text_inputs(names, int(model.config.vocab_size))
    return export_onnx(
        model.eval(), feeds, path, {output: output_axes or TEXT_AXES}, opset, fixed={"return_dict": True}
    )


# task -> (the transformers Auto class, the graph's output)
FOLDER_TASKS = {
    "feature-extraction": ("AutoModel", "last_hidden_state"),
    "fill-mask": ("AutoModelForMaskedLM", "logits"),
    "text-classification": ("AutoModelForSequenceClassification", "logits"),
}


def export_folder(model_dir: str | Path, out: str | Path, task: str = "feature-extraction", opset: int = 17) -> Path:
    """A transformers model folder as ``torch.onnx`` traces it, nothing of sharebert's added (no manifest, recipe,
    compaction or quantization): ``out/model.onnx`` beside the folder's tokenizer files, the layout optimum's
    ``main_export`` writes. The benchmarks' plain baseline, which needs no optimum. Returns the graph's path."""
    import transformers

    if task not in FOLDER_TASKS:
        raise ValueError(f"task {task!r}: a plain export gives {', '.join(FOLDER_TASKS)}")
    auto, output = FOLDER_TASKS[task]
    model = getattr(transformers, auto).from_pretrained(str(model_dir), attn_implementation="eager")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    axes = {0: "batch_size"} if task == "text-classification" else TEXT_AXES
    names = forward_inputs(model)
    export_onnx(
        model.eval(),
        text_inputs(names, int(model.config.vocab_size)),
        out / "model.onnx",
        {output: axes},
        opset,
        fixed={"return_dict": True},
        constant_folding=True,
    )  # folded as optimum's: weights stored
    # as the MatMuls read them, so ONNX Runtime's quantizer finds them
    transformers.AutoTokenizer.from_pretrained(str(model_dir)).save_pretrained(str(out))
    return out / "model.onnx"
