"""sharebert: tiny BERT-class models from shared embeddings (EPS/VEPS) and shared attention weights.

Importing ``sharebert`` is light: it loads neither torch nor transformers (the device runtime
``sharebert.deploy`` needs neither, and ``sharebert report`` answers without them). The model classes
load on first use (``from sharebert import ShareBertForMaskedLM``). The module that defines them,
``sharebert.modeling_sharebert``, registers them with transformers' Auto classes when it is imported:
after ``import sharebert.modeling_sharebert`` (or importing any model class), ``AutoConfig``,
``AutoModel*``, pipelines and optimum's ``ORTModel*`` know ``model_type="sharebert"``.
"""

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
}
__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'sharebert' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
