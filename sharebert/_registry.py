"""Registration of the sharebert models with transformers' Auto classes, without importing torch early.

``import sharebert`` must stay light (``sharebert report`` answers in well under 2 s and a device has no
torch), yet ``AutoConfig``/``AutoModel*`` (and so pipelines and optimum's ``ORTModel*``) must know
``model_type="sharebert"`` once it is imported. So :func:`install` registers right away when
transformers' auto modules are already loaded, and otherwise hooks their import: the config is
registered when ``configuration_auto`` has run, the models when ``modeling_auto`` has.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys

_CONFIG_AUTO = "transformers.models.auto.configuration_auto"
_MODEL_AUTO = "transformers.models.auto.modeling_auto"


def register_config() -> None:
    from transformers.models.auto.configuration_auto import AutoConfig

    from .configuration_sharebert import ShareBertConfig

    AutoConfig.register("sharebert", ShareBertConfig, exist_ok=True)


def register_models(m=None) -> None:
    """Register the model classes of module ``m`` (default: ``sharebert.modeling_sharebert``).

    When ``modeling_sharebert``'s own import pulled in ``modeling_auto``, the hook finds the module
    half-executed and leaves the work to its last line, which calls this with the finished module.
    """
    if m is None:
        loading = sys.modules.get(f"{__package__}.modeling_sharebert")
        if loading is not None and getattr(loading.__spec__, "_initializing", False):
            return
        from . import modeling_sharebert as m
    from transformers.models.auto import modeling_auto as auto

    register_config()
    for name, cls in (("AutoModel", m.ShareBertModel), ("AutoModelForMaskedLM", m.ShareBertForMaskedLM),
                      ("AutoModelForCausalLM", m.ShareBertForCausalLM),
                      ("AutoModelForSequenceClassification", m.ShareBertForSequenceClassification),
                      ("AutoModelForTokenClassification", m.ShareBertForTokenClassification),
                      ("AutoModelForQuestionAnswering", m.ShareBertForQuestionAnswering)):
        getattr(auto, name).register(m.ShareBertConfig, cls, exist_ok=True)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``callback`` right after module ``name`` has executed, then steps aside.

    ``find_spec`` may also be called by mere probes (``importlib.util.find_spec``): every spec it
    returns carries the hook, and the finder leaves ``sys.meta_path`` only once the module has run.
    """

    def __init__(self, name: str, callback):
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            self.callback()

        spec.loader.exec_module = exec_then_register
        return spec


def install() -> None:
    """Register now if transformers' auto modules are loaded, else when they are (no-op without transformers)."""
    try:
        if importlib.util.find_spec("transformers") is None:
            return
    except ImportError:  # an import blocker (the torch-free device test) or a broken install
        return
    for name, callback in ((_CONFIG_AUTO, register_config), (_MODEL_AUTO, register_models)):
        if name in sys.modules:
            callback()
        elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
            sys.meta_path.insert(0, _AfterImport(name, callback))
