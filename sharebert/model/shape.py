"""Model shapes without torch or transformers: presets, derived shapes, validation.

``ShapeMixin`` holds everything that follows from a config's fields (the encoder's matrices, the
EPS column plan, validation); ``ShareBertConfig`` (transformers) and ``ModelShape`` (plain, for
``sharebert report`` and ``sharebert budget``, which must not pay for importing torch) both use it,
so a shape is defined in one place.
"""

from __future__ import annotations

import copy
import difflib
import math

from .plan import ColumnPlan

SHARING = ("none", "eps", "veps")
# The attention variants, in one table read by the model (``attention.py``), the shape rules and the
# accounting. Per variant, for hidden size V, h heads of d dims and ds per-head query/key dims taken
# from one shared matrix (symmetric: d; partial-qk: round(p * d)): each projection's weight matrix
# ``(out, in)`` and its bias length (0: none). The output projection (V x V, bias V) is common to all.
ATTENTION_VARIANTS = {
    "standard": lambda V, h, d, ds: {"query": ((V, V), V), "key": ((V, V), V), "value": ((V, V), V)},
    "symmetric": lambda V, h, d, ds: {"query": ((V, V), V), "value": ((V, V), V)},  # K = Q
    "pairwise": lambda V, h, d, ds: {"query": ((V, V), V), "pair": ((h * d, d), 0), "value": ((V, V), V)},  # S_h
    "shared-qkv": lambda V, h, d, ds: {"shared_qkv": ((V, V), V)},  # Q, K, V = S D_q, S D_k, S D_v
    "partial-qk": lambda V, h, d, ds: {
        "qk_shared": ((h * ds, V), h * ds),
        "query": ((h * (d - ds), V), h * (d - ds)),
        "key": ((h * (d - ds), V), h * (d - ds)),
        "value": ((V, V), V),
    },
}
# Learned per-dimension scalings (length V each) a variant has per layer: shared-qkv's diagonal D_q, D_k, D_v.
ATTENTION_SCALINGS = {"shared-qkv": ("query", "key", "value")}
ATTENTION = tuple(ATTENTION_VARIANTS)
POOLER = ("generated", "dense", "none")
MLM_HEADS = ("tied", "untied")

# Layer names, in the reference's fill order (Q, K, V, FF-in, FF-out, O, then the pooler).
FILL_ORDER = ("qk_shared", "query", "key", "pair", "shared_qkv", "value", "ffn_in", "ffn_out", "output")


def _sharebert(**kw):
    base = dict(
        vocab_size=30528,
        hidden_size=2048,
        num_hidden_layers=12,
        intermediate_size=4096,
        num_attention_heads=16,
        sharing="veps",
        max_position_embeddings=128,
        pooler="generated",
        pooler_activation="none",
        norm_position="pre",
    )
    return {**base, **kw}


def _bert(**kw):
    base = dict(
        vocab_size=30522,
        hidden_size=768,
        num_hidden_layers=12,
        intermediate_size=3072,
        num_attention_heads=12,
        sharing="none",
        embedding_size=None,
        max_position_embeddings=512,
        pooler="dense",
        pooler_activation="tanh",
        norm_position="post",
    )
    return {**base, **kw}


PRESETS: dict[str, dict] = {
    # ShareBERT paper, Table 2 (BERT + VEPS + EF).
    "sharebert-small": _sharebert(embedding_size=128),
    "sharebert-base": _sharebert(embedding_size=384),
    "sharebert-large": _sharebert(embedding_size=768, num_hidden_layers=6),
    "sharebert-f24-v512": _sharebert(
        embedding_size=24, hidden_size=512, num_hidden_layers=10, intermediate_size=512, num_attention_heads=8
    ),
    "sharebert-f64-v768": _sharebert(
        embedding_size=64, hidden_size=768, num_hidden_layers=12, intermediate_size=768, num_attention_heads=12
    ),
    # Sized to pre-train on 2 CPU cores.
    "sharebert-tiny": _sharebert(
        embedding_size=64, hidden_size=256, num_hidden_layers=4, intermediate_size=512, num_attention_heads=4
    ),
    # ShareBERT paper, Table 2 (BERT + EPS, BERT + EPS + EF): BERT's 512 positions and a dense pooler (the
    # printed 24.5M / 43.0M and the 'shared dims' 130/233/388/1100 need both; see docs/ACCOUNTING.md).
    "bert-eps-i1024": _sharebert(
        sharing="eps",
        embedding_size=None,
        hidden_size=768,
        intermediate_size=1024,
        num_attention_heads=12,
        max_position_embeddings=512,
        pooler="dense",
        pooler_activation="tanh",
    ),
    "bert-eps-i3072": _sharebert(
        sharing="eps",
        embedding_size=None,
        hidden_size=768,
        intermediate_size=3072,
        num_attention_heads=12,
        max_position_embeddings=512,
        pooler="dense",
        pooler_activation="tanh",
    ),
    "bert-eps-i6144": _sharebert(
        sharing="eps",
        embedding_size=None,
        hidden_size=768,
        intermediate_size=6144,
        num_attention_heads=12,
        max_position_embeddings=512,
        pooler="dense",
        pooler_activation="tanh",
    ),
    "bert-eps-ef-f1152": _sharebert(
        sharing="eps", embedding_size=1152, max_position_embeddings=512, pooler="dense", pooler_activation="tanh"
    ),
    # ShareBERT paper, Table 2 (small BERT baselines: vocab 30528, 128 positions).
    "bert-h128": _bert(
        vocab_size=30528, hidden_size=128, intermediate_size=512, num_attention_heads=2, max_position_embeddings=128
    ),
    "bert-h256": _bert(
        vocab_size=30528, hidden_size=256, intermediate_size=1024, num_attention_heads=4, max_position_embeddings=128
    ),
    # Attention papers (Courtois, Kowsher): BERT base and small.
    "bert-base": _bert(),
    "bert-small": _bert(hidden_size=512, num_hidden_layers=4, intermediate_size=2048, num_attention_heads=8),
    # Partial Q-K paper: character-level GPT (6 layers, 6 heads, 384 dims, block 256) and a CPU size.
    "charlm-6l": _bert(
        vocab_size=128,
        hidden_size=384,
        num_hidden_layers=6,
        intermediate_size=1536,
        num_attention_heads=6,
        max_position_embeddings=256,
        pooler="none",
        norm_position="pre",
        attention="partial-qk",
        hidden_dropout_prob=0.2,
        attention_probs_dropout_prob=0.2,
        is_decoder=True,
    ),
    "charlm-tiny": _bert(
        vocab_size=128,
        hidden_size=128,
        num_hidden_layers=4,
        intermediate_size=512,
        num_attention_heads=4,
        max_position_embeddings=128,
        pooler="none",
        norm_position="pre",
        attention="partial-qk",
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        is_decoder=True,
    ),
}
# Every BERT preset with each attention variant, e.g. "bert-base-symmetric".
for _name in ("bert-base", "bert-small"):
    for _variant in ATTENTION[1:]:
        PRESETS[f"{_name}-{_variant}"] = {**PRESETS[_name], "attention": _variant}

# ShareBertConfig's field defaults (the shape of ``sharebert-tiny``).
DEFAULTS = dict(
    vocab_size=30528,
    embedding_size=64,
    hidden_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    intermediate_size=512,
    hidden_act="gelu",
    hidden_dropout_prob=0.1,
    attention_probs_dropout_prob=0.1,
    max_position_embeddings=128,
    type_vocab_size=2,
    initializer_range=0.02,
    layer_norm_eps=1e-12,
    sharing="veps",
    share_layers=None,
    attention="standard",
    qk_share_ratio=0.5,
    attention_scale_power=0.5,
    norm_position="pre",
    pooler="generated",
    pooler_activation="none",
    mlm_head="tied",
    mlm_logits_in_training="all",
    train_min_depth=None,  # training only: each training forward runs a depth drawn from train_min_depth..N
    classifier_dropout=None,
    classifier_pooling="cls",  # what the sequence classifier reads: [CLS] (through the pooler, if any) or the mean
    pad_token_id=0,
)


def preset_fields(name: str, **overrides) -> dict:
    """The config fields of preset ``name`` with ``overrides``; ``ValueError`` for an unknown name."""
    if name not in PRESETS:
        close = difflib.get_close_matches(name, PRESETS, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ValueError(f"unknown preset {name!r}{hint}; known presets: {', '.join(PRESETS)}")
    return {**copy.deepcopy(PRESETS[name]), **overrides}


# Every field ``--set`` may change: the defaults above and what a preset sets besides them (``is_decoder``).
CONFIG_FIELDS = frozenset(DEFAULTS) | {key for fields in PRESETS.values() for key in fields}
# The string fields and their allowed values (``"none"`` is a value here, not Python's None).
CHOICES = {
    "sharing": SHARING,
    "attention": ATTENTION,
    "pooler": POOLER,
    "mlm_head": MLM_HEADS,
    "mlm_logits_in_training": ("masked", "all"),
    "norm_position": ("pre", "post"),
    "pooler_activation": ("tanh", "none"),
    # a classifier reads [CLS] (through the pooler) or the mean: two of the modes the model's torch ``pool`` computes
    "classifier_pooling": ("cls", "mean"),
}


def parse_overrides(items: list[str] | None) -> dict:
    """``["attention=symmetric", "hidden_size=512"]`` -> typed dict (ints, floats, bools, None).

    ``ValueError`` for a key that is not a config field (a typo would otherwise be stored and ignored).
    """
    out = {}
    for item in items or []:
        if "=" not in item:
            raise ValueError(f"--set expects key=value, got {item!r}")
        key, raw = item.split("=", 1)
        low = raw.strip().lower()
        if low in ("true", "false"):
            value = low == "true"
        elif low in ("none", "null") and raw.strip() not in CHOICES.get(key.strip().replace("-", "_"), ()):
            value = None
        else:
            try:
                value = int(raw)
            except ValueError:
                try:
                    value = float(raw)
                except ValueError:
                    value = raw
        key = key.strip().replace("-", "_")
        if key not in CONFIG_FIELDS:
            close = difflib.get_close_matches(key, CONFIG_FIELDS, n=1)
            hint = f"did you mean {close[0]}?" if close else f"known fields: {', '.join(sorted(CONFIG_FIELDS))}"
            raise ValueError(f"--set {key}: not a config field; {hint}")
        out[key] = value
    return out


class ShapeMixin:
    """Derived shape and validation, from the config fields (``vocab_size``, ``hidden_size``, ...)."""

    # -- derived shape -------------------------------------------------------------------------
    @property
    def word_embedding_size(self) -> int:
        """Width of the learned word-embedding table (F, or V when not factorised)."""
        return self.embedding_size or self.hidden_size

    @property
    def factorized(self) -> bool:
        """Whether looked-up token vectors are projected ``F -> V`` before the encoder."""
        return self.word_embedding_size != self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def qk_shared_dim(self) -> int:
        """Per-head query/key dims taken from the shared matrix (partial-qk), ``round(p * d_head)``."""
        return {"symmetric": self.head_dim, "partial-qk": round(self.qk_share_ratio * self.head_dim)}.get(
            self.attention, 0
        )

    def attention_projections(self) -> dict[str, tuple[tuple[int, int], int]]:
        """One layer's attention projections ``{name: ((out, in), bias length)}`` (``ATTENTION_VARIANTS``;
        empty ones, as partial-qk's at p = 0 or 1, left out)."""
        table = ATTENTION_VARIANTS[self.attention](
            self.hidden_size, self.num_attention_heads, self.head_dim, self.qk_shared_dim
        )
        return {name: (shape, bias) for name, (shape, bias) in table.items() if shape[0] * shape[1] > 0}

    def attention_vectors(self) -> int:
        """Per-layer learned attention vectors: projection biases, scalings (shared-qkv) and the output bias."""
        V = self.hidden_size
        return (
            sum(b for _, b in self.attention_projections().values())
            + V * len(ATTENTION_SCALINGS.get(self.attention, ()))
            + V
        )

    def layer_matrices(self) -> list[tuple[str, tuple[int, int]]]:
        """The encoder's weight matrices ``(name, (out, in))`` in fill order, for this attention."""
        V, I = self.hidden_size, self.intermediate_size
        shapes = {name: shape for name, (shape, _) in self.attention_projections().items()}
        shapes.update(ffn_in=(I, V), ffn_out=(V, I), output=(V, V))
        return [(n, shapes[n]) for n in FILL_ORDER if n in shapes]

    def generated_targets(self, with_pooler: bool = True) -> list[tuple[str, tuple[int, int]]]:
        """Targets generated by EPS/VEPS (empty when ``sharing == 'none'``); the pooler is planned (its
        columns are reserved) whenever it is generated, but a model without one (``with_pooler=False``:
        the MLM and causal-LM models) does not generate it."""
        if self.sharing == "none":
            return []
        targets = self.layer_matrices()
        if self.pooler == "generated" and with_pooler:
            targets.append(("pooler", (self.hidden_size, self.hidden_size)))
        return targets

    def columns_used(self, with_pooler: bool = True) -> int:
        """Source columns the EPS plan takes: ``sum(ceil(rows * cols / E))`` (paper eq. 3-4); a model
        without a pooler (``with_pooler=False``) leaves the pooler's reserved columns uncomputed."""
        return sum(math.ceil(r * c / self.vocab_size) for _, (r, c) in self.generated_targets(with_pooler))

    @property
    def labels_count(self) -> int:
        """Classifier outputs: ``id2label``'s size, else ``num_labels``, else 2 (transformers' default)."""
        labels = getattr(self, "id2label", None)
        return len(labels) if labels else (getattr(self, "num_labels", None) or 2)

    def column_plan(self) -> ColumnPlan | None:
        """EPS column plan over the source matrix, or ``None`` without sharing."""
        if self.sharing == "none":
            return None
        width = self.hidden_size if self.sharing == "veps" else self.word_embedding_size
        return ColumnPlan.build(self.vocab_size, width, self.generated_targets())

    # -- validation ----------------------------------------------------------------------------
    def validate(self) -> None:
        """Raise ``ValueError`` with what is wrong and what to change."""

        def need(ok, msg):
            if not ok:
                raise ValueError(f"invalid ShareBertConfig: {msg}")

        for key, allowed in CHOICES.items():
            need(getattr(self, key) in allowed, f"{key}={getattr(self, key)!r} is not one of {', '.join(allowed)}")
        for key in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
        ):
            value = getattr(self, key)
            need(isinstance(value, int) and value > 0, f"{key} must be a positive integer, got {value!r}")
        need(
            self.embedding_size is None or (isinstance(self.embedding_size, int) and self.embedding_size > 0),
            f"embedding_size must be a positive integer or None, got {self.embedding_size!r}",
        )
        need(
            self.hidden_size % self.num_attention_heads == 0,
            f"hidden_size {self.hidden_size} is not divisible by num_attention_heads {self.num_attention_heads}; "
            f"pick heads among the divisors of {self.hidden_size} "
            f"(e.g. {self.hidden_size // 64 or 1} for 64-dim heads)",
        )
        need(
            isinstance(self.qk_share_ratio, (int, float)) and 0.0 <= self.qk_share_ratio <= 1.0,
            f"qk_share_ratio must lie in [0, 1] (0 = standard, 1 = symmetric), got {self.qk_share_ratio!r}",
        )
        need(
            not (self.pooler == "generated" and self.sharing == "none"),
            "pooler='generated' needs sharing='eps' or 'veps'; use pooler='dense' for a plain encoder",
        )
        need(
            not (self.sharing == "veps" and not self.factorized),
            "sharing='veps' needs embedding_size smaller than hidden_size (the virtual projection maps F -> V); "
            "use sharing='eps' for an unfactorised embedding",
        )
        need(
            self.train_min_depth is None
            or (
                isinstance(self.train_min_depth, int)
                and not isinstance(self.train_min_depth, bool)
                and 1 <= self.train_min_depth <= self.num_hidden_layers
            ),
            f"train_min_depth must be None or an integer in 1..{self.num_hidden_layers} (num_hidden_layers), "
            f"got {self.train_min_depth!r}",
        )
        for key in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            need(0.0 <= getattr(self, key) < 1.0, f"{key} must lie in [0, 1), got {getattr(self, key)!r}")
        self.column_plan()  # raises ValueError with the column shortfall and the ways out


class ModelShape(ShapeMixin):
    """A config's shape fields as a plain object (no transformers): ``ModelShape(**config_json)``.

    Unknown fields (``architectures``, ``id2label``, ...) are kept as attributes; ``validate=False``
    skips the checks (the budget planner scores thousands of grid points it has already filtered).
    """

    def __init__(self, validate: bool = True, **fields):
        for key, value in {**DEFAULTS, "is_decoder": False, **fields}.items():
            setattr(self, key, value)
        if self.share_layers is None:
            self.share_layers = self.sharing != "none"
        if validate:
            self.validate()

    @classmethod
    def from_preset(cls, name: str, **overrides) -> ModelShape:
        return cls(**preset_fields(name, **overrides))


def pad_vocab_size(size: int, multiple: int = 8) -> int:
    """Round a vocabulary size up to a multiple (bert-base-uncased 30522 -> 30528, as in the paper)."""
    return int(math.ceil(size / multiple) * multiple)
