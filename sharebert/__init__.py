"""sharebert: tiny BERT-class models from shared embeddings (EPS/VEPS) and shared attention weights.

``import sharebert`` is the one import of the library. When torch and transformers are installed, it
registers ``model_type="sharebert"`` with transformers' Auto classes (``AutoConfig``, ``AutoModel*``,
``AutoTokenizer``, pipelines, sentence-transformers) and, when optimum's ONNX exporter is installed,
with optimum's ``TasksManager`` (``transformers_sharebert``; docs/HUGGINGFACE.md). That imports torch.
Without torch or transformers (a device install) nothing is registered and the import stays light.

One process is told otherwise: the ``sharebert`` command itself (its console script, ``python -m
sharebert_runtime``), whose dispatcher says so in ``sharebert_runtime.main.PROGRAM`` before it imports a
command's module. There the registration waits for the command to run (``_register``, called by the
dispatcher), and arithmetic commands (``report``, ``budget``) and every ``--help`` never pay torch's import.
transformers has no lazy registration (``AutoConfig.register`` takes the class, whose import is torch's), and
the package's ``__init__`` cannot tell ``import sharebert`` from ``import sharebert.accounting``, so the
process that is a command line is the one place the import can wait.

The torch-free device runtime is the separate package ``sharebert_runtime`` (``from sharebert_runtime
import Runtime``): importing it never runs this file. The model classes load on first use
(``from sharebert import ShareBertForMaskedLM``).
"""

import importlib
import importlib.util
import sys

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


def _register() -> None:
    """Registers with transformers (and optimum) where torch and transformers are installed; again is a no-op."""
    if not _installed("torch", "transformers"):
        return
    try:
        importlib.import_module("transformers_sharebert")  # registers this package's models; see its docstring
    except ImportError as e:  # a broken torch/transformers install: the model folder and accounting code still import
        import warnings

        warnings.warn(f"sharebert is not registered with transformers: {e}", stacklevel=3)


def _command_line_registers_later() -> bool:
    """Whether this process is the ``sharebert`` command, which registers when its command runs (module docstring)."""
    return getattr(sys.modules.get("sharebert_runtime.main"), "PROGRAM", False) is True


if not _command_line_registers_later():
    _register()
