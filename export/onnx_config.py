"""optimum ``OnnxConfig``s for model_type ``"sharebert"``, registered with optimum's ``TasksManager``.

Importing this module registers the configs for the tasks below, so optimum's tooling (and
``TasksManager.get_exporter_config_constructor``) knows sharebert. Our tasks map to optimum's:
``causal-lm`` is optimum's ``text-generation-with-past``: one graph with optimum's decoder inputs and
outputs (``past_key_values.{i}.key|value`` in, ``present.{i}.key|value`` out, ``position_ids``), which
also runs the first step, with past keys and values of length 0.
"""

from __future__ import annotations

import optimum.exporters.onnx.model_configs  # noqa: F401  (registers the stock configs, BERT included)
from optimum.exporters.onnx.config import TextDecoderWithPositionIdsOnnxConfig, TextEncoderOnnxConfig
from optimum.exporters.tasks import TasksManager
from optimum.utils import NormalizedTextConfig

OPTIMUM_TASKS = {
    "fill-mask": "fill-mask",
    "text-classification": "text-classification",
    "feature-extraction": "feature-extraction",
    "causal-lm": "text-generation-with-past",
}

_register = TasksManager.create_register("onnx", overwrite_existing=True)


@_register("sharebert", "fill-mask", "text-classification", "feature-extraction", "multiple-choice")
class ShareBertOnnxConfig(TextEncoderOnnxConfig):
    """Inputs ``input_ids``, ``attention_mask`` (and ``token_type_ids`` for encoders), each
    ``(batch_size, sequence_length)`` (``multiple-choice``: ``(batch_size, num_choices, sequence_length)``);
    outputs from optimum's task table (``logits`` or ``last_hidden_state``), dynamic on the same axes."""

    NORMALIZED_CONFIG_CLASS = NormalizedTextConfig
    DEFAULT_ONNX_OPSET = 17
    ATOL_FOR_VALIDATION = 1e-4

    @property
    def inputs(self) -> dict[str, dict[int, str]]:
        if self.task == "multiple-choice":
            axes = {0: "batch_size", 1: "num_choices", 2: "sequence_length"}
        else:
            axes = {0: "batch_size", 1: "sequence_length"}
        return {name: dict(axes) for name in ("input_ids", "attention_mask", "token_type_ids")}


@_register("sharebert", "text-generation", "text-generation-with-past")
class ShareBertDecoderOnnxConfig(TextDecoderWithPositionIdsOnnxConfig):
    """The causal LM with a key/value cache, as optimum exports decoders: ``input_ids`` and ``position_ids``
    ``(batch_size, sequence_length)``, ``attention_mask`` over past and new tokens, per layer
    ``past_key_values.{i}.key|value`` ``(batch_size, heads, past_sequence_length, head_dim)`` in and
    ``present.{i}.key|value`` out, and ``logits``."""

    NORMALIZED_CONFIG_CLASS = NormalizedTextConfig
    DEFAULT_ONNX_OPSET = 17
    ATOL_FOR_VALIDATION = 1e-4


def onnx_config_for(model, task: str):
    """The ``OnnxConfig`` instance for ``model`` (sharebert or transformers BERT) and our ``task``."""
    optimum_task = OPTIMUM_TASKS[task]
    model_type = model.config.model_type
    constructor = TasksManager.get_exporter_config_constructor(
        exporter="onnx", model_type=model_type, task=optimum_task, library_name="transformers"
    )
    if optimum_task.endswith("-with-past"):  # one graph for every step: past inputs always present
        return constructor(model.config, use_past_in_inputs=True)
    config = constructor(model.config)
    if getattr(model.config, "type_vocab_size", 2) == 1 and "token_type_ids" in config.inputs:
        return _one_token_type(type(config))(model.config, **constructor.keywords)
    return config


def _one_token_type(config_class):
    """``config_class`` tracing with ``token_type_ids`` all 0: optimum's dummy inputs draw them from {0, 1}, an index
    past the table of a model with one token type (``type_vocab_size=1``)."""

    class OneTokenTypeOnnxConfig(config_class):
        def generate_dummy_inputs(self, framework: str = "pt", **input_shapes):
            dummy = super().generate_dummy_inputs(framework, **input_shapes)
            dummy["token_type_ids"] = dummy["token_type_ids"] * 0
            return dummy

    return OneTokenTypeOnnxConfig
