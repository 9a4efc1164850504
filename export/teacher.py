"""The graph of a transformers encoder of any architecture (a teacher: roberta, mpnet, deberta-v2, modernbert, ...),
traced by ``torch.onnx`` from the model as published: nothing of it is re-implemented.

Inputs are the ones the model's tokenizer gives and its ``forward`` takes (``input_ids``, ``attention_mask``, and
``token_type_ids`` where both use them), each ``(batch_size, sequence_length)``; the one output is
``last_hidden_state`` (feature-extraction) or ``logits`` (text-classification). Positions are computed in the graph
(RoBERTa's from the padding, rotary ones from the length), so the runtime feeds what it feeds every artifact.
Kept apart from the sharebert exporter so the two can become one ``torch.onnx`` path.
"""

from __future__ import annotations

from pathlib import Path

OUTPUTS = {"feature-extraction": "last_hidden_state", "text-classification": "logits"}
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def exports_here(config) -> bool:
    """Whether this module exports ``config``'s model: every architecture but sharebert's and BERT's own path."""
    return config.model_type not in ("sharebert", "bert")


def graph_inputs(model, tokenizer) -> list[str]:
    """The inputs both the tokenizer gives and the model's ``forward`` takes, in :data:`INPUTS` order."""
    from .torch_onnx import forward_inputs

    return [n for n in forward_inputs(model, INPUTS) if n == "input_ids" or n in tokenizer.model_input_names]


def export_encoder(model, tokenizer, task: str, path: Path, opset: int) -> tuple[list[str], list[str]]:
    """Trace ``model`` (eval) for ``task`` into ``path`` (``torch_onnx.export_onnx``); returns ``(input names,
    output names)``."""
    from .torch_onnx import TEXT_AXES, export_onnx, text_inputs

    if task not in OUTPUTS:
        raise ValueError(f"--task {task} of a {model.config.model_type} model: its export gives {', '.join(OUTPUTS)}")
    output = OUTPUTS[task]
    feeds = text_inputs(graph_inputs(model, tokenizer), int(model.config.vocab_size))
    axes = {0: "batch_size"} if task == "text-classification" else TEXT_AXES
    return export_onnx(model, feeds, path, {output: axes}, opset, fixed={"return_dict": True})
