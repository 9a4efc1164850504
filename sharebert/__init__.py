"""sharebert: tiny BERT-class models from shared embeddings (EPS/VEPS) and shared attention weights.

``import sharebert`` is the one import. On a workstation install (torch and transformers present) it
registers ``model_type="sharebert"`` with transformers' Auto classes (``AutoConfig``, ``AutoModel*``,
``AutoTokenizer``, pipelines) and with optimum's ``TasksManager`` (``main_export``,
``ORTModel*.from_pretrained(..., export=True)``, ``optimum-cli export onnx``), through
``transformers_sharebert`` (docs/EXPORT.md "optimum's own entry points"). That imports torch.

It stays light (no torch, no transformers, nothing registered) where nothing can or need be registered:

* a device install, where torch or transformers is not installed (``sharebert.deploy`` needs neither);
* sharebert's own processes: the ``sharebert`` command (console script or ``python -m sharebert``; each
  command imports the models itself when it needs them, so ``sharebert report`` and ``--help`` answer in
  ~0.1 s);
* ``SHAREBERT_REGISTER=0`` in the environment (a torch-free process on a workstation, e.g. a server
  running ``sharebert.deploy.Runtime``, or the export's footprint child, which measures ONNX Runtime alone).

The model classes load on first use either way (``from sharebert import ShareBertForMaskedLM``).
"""
import importlib
import importlib.util
import os
import sys

__version__ = "0.1.0"

_LAZY = {
    "PRESETS": "shape",
    "ModelShape": "shape",
    "ShareBertConfig": "configuration_sharebert",
    "ShareBertModel": "modeling_sharebert",
    "ShareBertForMaskedLM": "modeling_sharebert",
    "ShareBertForCausalLM": "modeling_sharebert",
    "ShareBertForSequenceClassification": "modeling_sharebert",
    "ShareBertForTokenClassification": "modeling_sharebert",
    "ShareBertForQuestionAnswering": "modeling_sharebert",
    "ShareBertForMultipleChoice": "modeling_sharebert",
    "lora_config": "adapters",
}
__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'sharebert' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)


def _own_process() -> bool:
    """Whether this process is the ``sharebert`` command: its console script or ``python -m sharebert``."""
    argv0 = (getattr(sys, "argv", None) or [""])[0]
    if argv0 == "-m":  # `python -m X`: sharebert is imported while X is located, so X is sharebert or below it
        orig = getattr(sys, "orig_argv", [])
        target = orig[orig.index("-m") + 1] if "-m" in orig[:-1] else ""
        return target.split(".")[0] == __name__
    return os.path.basename(argv0).split(".")[0].removesuffix("-script") == __name__


def _installed(*names: str) -> bool:
    try:
        return all(importlib.util.find_spec(n) is not None for n in names)
    except (ImportError, ValueError):  # an import blocker (a test's device simulation), a broken install
        return False


def _registers() -> bool:
    """Whether ``import sharebert`` registers with transformers and optimum here (see the module docstring)."""
    return (os.environ.get("SHAREBERT_REGISTER", "1") != "0" and _installed("torch", "transformers")
            and not _own_process())


if _registers():
    try:
        importlib.import_module("transformers_sharebert")  # imports this package's models; see its docstring
    except ImportError as e:  # a broken torch/transformers install: sharebert.deploy (torch-free) still imports
        import warnings

        warnings.warn(f"sharebert is not registered with transformers: {e} (SHAREBERT_REGISTER=0 skips "
                      "the registration)", stacklevel=2)
