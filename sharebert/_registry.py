"""Registration of the sharebert models with transformers' Auto classes, without importing torch early.

``import sharebert`` must stay light (``sharebert report`` answers in well under 2 s and a device has no
torch), yet ``AutoConfig``/``AutoModel*`` (and so pipelines and optimum's ``ORTModel*``) must know
``model_type="sharebert"`` once it is imported. So :func:`install` registers right away when
transformers' auto modules are already loaded, and otherwise hooks their import: the config is
registered when ``configuration_auto`` has run, the models when ``modeling_auto`` has. Where that
happens inside a chain of half-executed transformers modules (``modeling_layers`` imports the auto
classes, and our models import ``modeling_layers``), the registration is retried at later imports.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings

_CONFIG_AUTO = "transformers.models.auto.configuration_auto"
_MODEL_AUTO = "transformers.models.auto.modeling_auto"


def register_config() -> None:
    from transformers.models.auto.configuration_auto import AutoConfig

    from .configuration_sharebert import ShareBertConfig

    AutoConfig.register("sharebert", ShareBertConfig, exist_ok=True)


def register_models(m=None) -> None:
    """Register the model classes of module ``m`` (default: ``sharebert.modeling_sharebert``)."""
    if m is None:
        if _initializing(f"{__package__}.modeling_sharebert"):  # its last line registers it
            raise ImportError("sharebert.modeling_sharebert is still executing")
        from . import modeling_sharebert as m
    from transformers.models.auto import modeling_auto as auto

    register_config()
    for name, cls in (("AutoModel", m.ShareBertModel), ("AutoModelForMaskedLM", m.ShareBertForMaskedLM),
                      ("AutoModelForCausalLM", m.ShareBertForCausalLM),
                      ("AutoModelForSequenceClassification", m.ShareBertForSequenceClassification),
                      ("AutoModelForTokenClassification", m.ShareBertForTokenClassification),
                      ("AutoModelForQuestionAnswering", m.ShareBertForQuestionAnswering)):
        getattr(auto, name).register(m.ShareBertConfig, cls, exist_ok=True)


def _initializing(name: str) -> bool:
    """Whether module ``name`` is still executing (importlib flags it while its import runs)."""
    return getattr(getattr(sys.modules.get(name), "__spec__", None), "_initializing", False)


def _busy() -> bool:
    """Whether a transformers module or our modeling module is still executing."""
    return any(_initializing(name) for name in list(sys.modules)
               if name.startswith("transformers") or name == f"{__package__}.modeling_sharebert")


def _try(callback) -> bool:
    """Run ``callback``; False when a module it imports is still half-executed (try again later)."""
    try:
        callback()
    except ImportError as e:  # e.g. ``transformers.modeling_layers`` imports the auto classes mid-way
        if _busy():
            return False
        warnings.warn(f"sharebert could not register with transformers' Auto classes: {e}", stacklevel=2)
    return True


class _Pending(importlib.abc.MetaPathFinder):
    """Retries deferred registrations at later imports, once no transformers module is mid-execution.

    Finders here never remove themselves from ``sys.meta_path``: the import system may be iterating
    it (a removal would make it skip the next finder); a finder with nothing left to do answers None.
    """

    def __init__(self):
        self.queue, self.running = [], False

    def find_spec(self, fullname, path, target=None):
        if self.queue and not self.running and not _busy():
            self.running = True
            try:
                self.queue = [callback for callback in self.queue if not _try(callback)]
            finally:
                self.running = False
        return None  # never imports anything itself


_pending = _Pending()


def _when_ready(callback) -> None:
    if _try(callback):
        return
    _pending.queue.append(callback)
    if _pending not in sys.meta_path:
        sys.meta_path.insert(0, _pending)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``callback`` (as soon as it is safe) once module ``name`` has executed, then steps aside.

    ``find_spec`` may also be called by mere probes (``importlib.util.find_spec``): every spec it
    returns carries the hook, and the finder is done only once the module has run.
    """

    def __init__(self, name: str, callback):
        self.name, self.callback, self.done = name, callback, False

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name or self.done:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            self.done = True
            _when_ready(self.callback)

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
            _when_ready(callback)
        elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
            sys.meta_path.insert(0, _AfterImport(name, callback))
