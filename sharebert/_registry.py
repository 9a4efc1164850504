"""Registration of the sharebert models with transformers' Auto classes."""
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)


def register() -> None:
    from . import modeling_sharebert as m
    from .configuration_sharebert import ShareBertConfig

    AutoConfig.register("sharebert", ShareBertConfig, exist_ok=True)
    for auto, cls in ((AutoModel, m.ShareBertModel), (AutoModelForMaskedLM, m.ShareBertForMaskedLM),
                      (AutoModelForCausalLM, m.ShareBertForCausalLM),
                      (AutoModelForSequenceClassification, m.ShareBertForSequenceClassification),
                      (AutoModelForTokenClassification, m.ShareBertForTokenClassification),
                      (AutoModelForQuestionAnswering, m.ShareBertForQuestionAnswering)):
        auto.register(ShareBertConfig, cls, exist_ok=True)
