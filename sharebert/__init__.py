"""sharebert: tiny BERT-class models from shared embeddings (EPS/VEPS) and shared attention weights.

``import sharebert`` is the one import of the library. When torch and transformers are installed, it
registers ``model_type="sharebert"`` with transformers' Auto classes (``AutoConfig``, ``AutoModel*``,
``AutoTokenizer``, pipelines, sentence-transformers) and, when optimum's ONNX exporter is installed,
with optimum's ``TasksManager`` (``transformers_sharebert``; docs/HUGGINGFACE.md). That imports torch;
it is decided by what is installed only, never by ``argv`` or the environment. Without torch or
transformers (a device install) nothing is registered and the import stays light.

The torch-free device runtime is the separate package ``sharebert_runtime`` (``from sharebert_runtime
import Runtime``): importing it never runs this file. The model classes load on first use
(``from sharebert import ShareBertForMaskedLM``).
"""

import importlib
import importlib.util

from sharebert_runtime import __version__

_LAZY = {
    "PRESETS": "model.shape",
    "ModelShape": "model.shape",
    "ShareBertConfig": "model.configuration_sharebert",
    "ShareBertModel": "model.modeling_sharebert",
    "ShareBertForMaskedLM": "model.modeling_sharebert",
    "ShareBertForCausalLM": "model.modeling_sharebert",
    "ShareBertForSequenceClassification": "model.modeling_sharebert",
    "ShareBertForTokenClassification": "model.modeling_sharebert",
    "ShareBertForQuestionAnswering": "model.modeling_sharebert",
    "ShareBertForMultipleChoice": "model.modeling_sharebert",
    "lora_config": "model.adapters",
}
__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'sharebert' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)


def _installed(*names: str) -> bool:
    try:
        return all(importlib.util.find_spec(n) is not None for n in names)
    except (ImportError, ValueError):  # an import blocker (a test's device simulation), a broken install
        return False


if _installed("torch", "transformers"):
    try:
        importlib.import_module("transformers_sharebert")  # registers this package's models; see its docstring
    except ImportError as e:  # a broken torch/transformers install: the model folder and accounting code still import
        import warnings

        warnings.warn(f"sharebert is not registered with transformers: {e}", stacklevel=2)
