"""sharebert: tiny BERT-class models from shared embeddings (EPS/VEPS) and shared attention weights.

Importing ``sharebert`` registers the models with transformers' Auto classes when torch and
transformers are installed; the device runtime (``sharebert.deploy``) needs neither.
"""
__version__ = "0.1.0"

try:  # the full toolkit; absent on a device install
    import torch as _torch  # noqa: F401
    import transformers as _transformers  # noqa: F401
except ImportError:  # pragma: no cover - exercised by the torch-free deploy test
    pass
else:
    from ._registry import register as _register

    _register()
    from .configuration_sharebert import PRESETS, ShareBertConfig
    from .modeling_sharebert import (
        ShareBertForCausalLM,
        ShareBertForMaskedLM,
        ShareBertForQuestionAnswering,
        ShareBertForSequenceClassification,
        ShareBertForTokenClassification,
        ShareBertModel,
    )

    __all__ = [
        "PRESETS", "ShareBertConfig", "ShareBertModel", "ShareBertForMaskedLM", "ShareBertForCausalLM",
        "ShareBertForSequenceClassification", "ShareBertForTokenClassification", "ShareBertForQuestionAnswering",
    ]
