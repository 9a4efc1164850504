"""ShareBertConfig: the one source of truth for a model's shape, with presets and validation.

``sharing`` picks where the encoder's weight matrices come from:

* ``none``: ordinary learned matrices (a BERT-style encoder; ``share_layers`` makes it ALBERT-like);
* ``eps``: columns of the word-embedding matrix ``(E, F)`` (ShareBERT EPS);
* ``veps``: columns of the virtual embedding ``A @ P + p`` of shape ``(E, V)`` (ShareBERT VEPS).

``attention`` picks how Q, K and V are formed (see ``sharebert/model/attention.py``).
"""

from __future__ import annotations

from transformers import PretrainedConfig

from .shape import PRESETS, ShapeMixin, pad_vocab_size, preset_fields

__all__ = ["ShareBertConfig", "PRESETS", "pad_vocab_size"]

# Fields transformers 4's PretrainedConfig gave every config (transformers 5 leaves them to each model's config,
# as BertConfig does): a causal LM sets ``is_decoder`` and ``generate`` reads the special token ids.
_DECODER_FIELDS = {"is_decoder": False, "add_cross_attention": False, "bos_token_id": None, "eos_token_id": None}


class ShareBertConfig(ShapeMixin, PretrainedConfig):
    """Configuration of ShareBERT and of the BERT-style encoders with shared attention weights.

    Shape: ``vocab_size`` E, ``embedding_size`` F (word-embedding width; ``None`` means the hidden
    size), ``hidden_size`` V, ``num_hidden_layers`` N, ``intermediate_size`` I.
    """

    model_type = "sharebert"

    def __init__(
        self,
        vocab_size: int = 30528,
        embedding_size: int | None = 64,
        hidden_size: int = 256,
        num_hidden_layers: int = 4,
        num_attention_heads: int = 4,
        intermediate_size: int = 512,
        hidden_act: str = "gelu",
        hidden_dropout_prob: float = 0.1,
        attention_probs_dropout_prob: float = 0.1,
        max_position_embeddings: int = 128,
        type_vocab_size: int = 2,
        initializer_range: float = 0.02,
        layer_norm_eps: float = 1e-12,
        sharing: str = "veps",
        share_layers: bool | None = None,
        attention: str = "standard",
        qk_share_ratio: float = 0.5,
        attention_scale_power: float = 0.5,
        norm_position: str = "pre",
        pooler: str = "generated",
        pooler_activation: str = "none",
        mlm_head: str = "tied",
        mlm_logits_in_training: str = "all",
        train_min_depth: int | None = None,
        classifier_dropout: float | None = None,
        classifier_pooling: str = "cls",
        pad_token_id: int = 0,
        use_cache: bool = True,
        **kwargs,
    ):
        kwargs.setdefault("tie_word_embeddings", mlm_head == "tied")
        # transformers 5's PreTrainedConfig does not declare these; the models and generate read them
        for key, default in _DECODER_FIELDS.items():
            kwargs.setdefault(key, default)
        super().__init__(pad_token_id=pad_token_id, **kwargs)
        self.vocab_size = vocab_size
        self.embedding_size = embedding_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.max_position_embeddings = max_position_embeddings
        self.type_vocab_size = type_vocab_size
        self.initializer_range = initializer_range
        self.layer_norm_eps = layer_norm_eps
        self.sharing = sharing
        self.share_layers = sharing != "none" if share_layers is None else share_layers
        self.attention = attention
        self.qk_share_ratio = qk_share_ratio
        self.attention_scale_power = attention_scale_power
        self.norm_position = norm_position
        self.pooler = pooler
        self.pooler_activation = pooler_activation
        self.mlm_head = mlm_head
        self.mlm_logits_in_training = mlm_logits_in_training
        self.train_min_depth = train_min_depth
        self.classifier_dropout = classifier_dropout
        self.classifier_pooling = classifier_pooling
        self.use_cache = use_cache  # causal LM generation keeps a key/value cache
        self.validate()

    # -- presets -------------------------------------------------------------------------------
    @classmethod
    def from_preset(cls, name: str, **overrides) -> ShareBertConfig:
        """Build a preset (see ``PRESETS``) with keyword overrides, e.g. ``attention='symmetric'``."""
        kwargs = preset_fields(name, **overrides)
        kwargs.setdefault("name_or_path", name)
        config = cls(**kwargs)
        config.preset = name
        return config

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        """As ``PretrainedConfig.from_dict``, then validated again: keyword overrides
        (``from_pretrained(folder, classifier_pooling="mean")``) are set after ``__init__`` checked the folder's."""
        result = super().from_dict(config_dict, **kwargs)
        (result[0] if isinstance(result, tuple) else result).validate()
        return result
