"""optimum ``OnnxConfig`` for model_type ``"sharebert"``, registered with optimum's ``TasksManager``.

Importing this module registers the config for the tasks below, so optimum's tooling (and
``TasksManager.get_exporter_config_constructor``) knows sharebert. Our tasks map to optimum's:
``causal-lm`` is optimum's ``text-generation`` (no past key/values: the runtime recomputes the window).
"""
from __future__ import annotations

import optimum.exporters.onnx.model_configs  # noqa: F401  (registers the stock configs, BERT included)
from optimum.exporters.onnx.config import TextEncoderOnnxConfig
from optimum.exporters.tasks import TasksManager
from optimum.utils import NormalizedTextConfig

OPTIMUM_TASKS = {
    "fill-mask": "fill-mask",
    "text-classification": "text-classification",
    "feature-extraction": "feature-extraction",
    "causal-lm": "text-generation",
}

_register = TasksManager.create_register("onnx", overwrite_existing=True)


@_register("sharebert", *OPTIMUM_TASKS.values())
class ShareBertOnnxConfig(TextEncoderOnnxConfig):
    """Inputs ``input_ids``, ``attention_mask`` (and ``token_type_ids`` for encoders), each
    ``(batch_size, sequence_length)``; outputs from optimum's task table (``logits`` or
    ``last_hidden_state``), dynamic on the same axes."""

    NORMALIZED_CONFIG_CLASS = NormalizedTextConfig
    DEFAULT_ONNX_OPSET = 17
    ATOL_FOR_VALIDATION = 1e-4

    @property
    def inputs(self) -> dict[str, dict[int, str]]:
        axes = {0: "batch_size", 1: "sequence_length"}
        names = ["input_ids", "attention_mask"]
        if self.task != "text-generation":
            names.append("token_type_ids")
        return {name: dict(axes) for name in names}


def onnx_config_for(model, task: str):
    """The ``OnnxConfig`` instance for ``model`` (sharebert or transformers BERT) and our ``task``."""
    optimum_task = OPTIMUM_TASKS[task]
    model_type = model.config.model_type
    constructor = TasksManager.get_exporter_config_constructor(
        exporter="onnx", model_type=model_type, task=optimum_task, library_name="transformers")
    return constructor(model.config)
