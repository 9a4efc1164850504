"""Parameter, FLOP and memory accounting, computed analytically from a config (no model, no torch).

Everything here reads plain config fields (a ``ShareBertConfig``, a ``config.json`` dict or a preset
dict), so ``sharebert report`` and ``sharebert budget`` never allocate a model. ``tests/accounting/test_accounting.py``
checks every count against ``sum(p.numel())`` of the instantiated models and the FLOPs against
``torch.utils.flop_counter``.

Heads (``head=``):

* ``none``: the backbone as the ShareBERT paper counts it: embeddings, encoder, pooler (``ShareBertModel``).
* ``mlm``: the pre-training model as transformers' ``BertForMaskedLM`` is built: no pooler, MLM head
  (``ShareBertForMaskedLM``; a tied decoder adds only its bias). This is how the attention papers count.
* ``classifier``: pooler and a ``V x num_labels`` classifier (``ShareBertForSequenceClassification``).

FLOP convention: FLOPs = 2 x multiply-accumulates of the matrix products (linear layers, weight
generation, attention scores and context); element-wise work (biases, norms, softmax, GELU, the
shared-qkv scalings) and embedding lookups count 0, as in ``torch.utils.flop_counter``.
"""

from __future__ import annotations

from ..model.shape import FILL_ORDER, ModelShape, ShapeMixin

HEADS = ("none", "mlm", "classifier")
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "int8": 1}

_ATTENTION_MATRICES = frozenset(FILL_ORDER) - {"ffn_in", "ffn_out"}


def as_shape(config) -> ShapeMixin:
    """The one shape type: a ``ShareBertConfig`` or ``ModelShape`` as it is, a config dict (``config.json``) as a
    ``ModelShape``."""
    return config if isinstance(config, ShapeMixin) else ModelShape(validate=False, **config)


def _numel(matrices) -> int:
    return sum(r * c for _, (r, c) in matrices)


def count_params(config, head: str = "none") -> dict:
    """Learned and generated parameter counts with a per-component breakdown.

    Returns ``learned_params``, ``learned_params_without_word_embeddings`` (minus ``E x F``),
    ``learned_params_without_embeddings_module`` (minus word, position, token-type tables, the
    embedding norms and the input projection), ``generated_params``
    (entries of the materialised EPS/VEPS matrices), ``components`` (name -> learned count, summing
    to ``learned_params``), ``counted`` (which heads are included) and ``head``.
    """
    if head not in HEADS:
        raise ValueError(f"head must be one of {', '.join(HEADS)}, got {head!r}")
    s = as_shape(config)
    E, F, V, N, I = s.vocab_size, s.word_embedding_size, s.hidden_size, s.num_hidden_layers, s.intermediate_size
    with_pooler = head != "mlm" and s.pooler != "none"
    c = {"word_embeddings": E * F}
    if s.factorized:
        c["input_projection"] = F * V + V + 2 * F  # F -> V linear and the LayerNorm on F before it
    c["positions_and_token_types"] = (s.max_position_embeddings + s.type_vocab_size) * V
    c["embedding_norm"] = 2 * V
    if s.sharing == "veps":
        c["virtual_projection"] = F * V + V  # P and p of M = A @ P + p
    if s.sharing == "none":
        c["encoder_matrices"] = (1 if s.share_layers else N) * _numel(s.layer_matrices())
    c["layer_biases_and_norms"] = N * (s.attention_vectors() + I + V + 4 * V) + (
        2 * V if s.norm_position == "pre" else 0
    )
    if with_pooler:
        c["pooler"] = V + (V * V if s.pooler == "dense" else 0)  # a generated pooler learns only its bias
    if head == "mlm":
        width = F if s.mlm_head == "tied" else V
        c["mlm_head"] = V * width + width + 2 * width + E + (0 if s.mlm_head == "tied" else width * E)
    if head == "classifier":
        c["classifier"] = V * s.labels_count + s.labels_count
    learned = sum(c.values())
    embeddings_module = sum(
        c.get(k, 0) for k in ("word_embeddings", "input_projection", "positions_and_token_types", "embedding_norm")
    )
    generated = _numel(s.generated_targets(with_pooler=head != "mlm"))
    return {
        "head": head,
        "learned_params": learned,
        "learned_params_without_word_embeddings": learned - c["word_embeddings"],
        "learned_params_without_embeddings_module": learned - embeddings_module,
        "generated_params": generated,
        "columns_used": s.columns_used(),
        "components": c,
        "counted": {
            "pooler": with_pooler and s.pooler,
            "mlm_head": head == "mlm" and s.mlm_head,
            "classifier": head == "classifier",
        },
    }


def count_flops(config, head: str = "none", seq_len: int = 128, batch: int = 1) -> dict:
    """FLOPs of one forward (2 x MACs of the matrix products) with a breakdown, and the paper's convention.

    ``breakdown``: ``weight_generation`` (VEPS ``P[:, used].T @ A.T`` over the columns the plan uses;
    EPS copies columns, 0), ``input_projection`` (F -> V), ``projections`` (Q/K/V/O and the pairwise
    ``S_h``), ``attention`` (scores ``Q K^T`` and context ``probs V``), ``feed_forward``, ``pooler``,
    ``head`` (MLM head over every position, or the classifier). ``inference`` excludes the weight
    generation (paid once at load); ``training_forward`` includes it (paid every training step).
    ``paper_convention`` is what ShareBERT's 28 / 126 / 74 GFLOPs count (SPEC section 5): encoder
    layers + input projection + pooler + the reference's untied ``V x V`` + ``V x E`` MLM head over
    all positions, without the weight generation.
    """
    if head not in HEADS:
        raise ValueError(f"head must be one of {', '.join(HEADS)}, got {head!r}")
    if seq_len < 1 or batch < 1:
        raise ValueError(f"seq_len and batch must be positive, got seq_len={seq_len}, batch={batch}")
    s = as_shape(config)
    E, F, V, N, I = s.vocab_size, s.word_embedding_size, s.hidden_size, s.num_hidden_layers, s.intermediate_size
    tokens = batch * seq_len
    attention_numel = _numel((n, rc) for n, rc in s.layer_matrices() if n in _ATTENTION_MATRICES)
    pooler = 2 * batch * V * V if s.pooler != "none" else 0
    b = {
        "weight_generation": 2 * E * F * s.columns_used(with_pooler=head != "mlm") if s.sharing == "veps" else 0,
        "input_projection": 2 * tokens * F * V if s.factorized else 0,
        "projections": N * 2 * tokens * attention_numel,
        "attention": N * 2 * 2 * batch * s.num_attention_heads * seq_len * seq_len * s.head_dim,
        "feed_forward": N * 2 * tokens * 2 * V * I,
        "pooler": pooler if head != "mlm" else 0,
        "head": 0,
    }
    if head == "mlm":
        width = F if s.mlm_head == "tied" else V
        b["head"] = 2 * tokens * (V * width + width * E)
    elif head == "classifier":
        b["head"] = 2 * batch * V * s.labels_count
    encoder = b["input_projection"] + b["projections"] + b["attention"] + b["feed_forward"]
    inference = sum(b.values()) - b["weight_generation"]
    return {
        "convention": "FLOPs = 2 x multiply-accumulates of matrix products; element-wise ops and lookups count 0",
        "head": head,
        "seq_len": seq_len,
        "batch": batch,
        "breakdown": b,
        "inference": inference,
        "training_forward": inference + b["weight_generation"],
        "paper_convention": encoder + pooler + 2 * tokens * (V * V + V * E),
        "weight_generation_full_matrix": 2 * E * F * V if s.sharing == "veps" else 0,
    }


def count_bytes(config, head: str = "none") -> dict:
    """Bytes stored (learned parameters) and materialised at load (generated weights) per dtype.

    int8 counts one byte per number (per-tensor scales are negligible); ``at_load`` = stored + materialised.
    """
    n = count_params(config, head)
    stored = {d: n["learned_params"] * k for d, k in DTYPE_BYTES.items()}
    materialised = {d: n["generated_params"] * k for d, k in DTYPE_BYTES.items()}
    return {
        "stored": stored,
        "materialised": materialised,
        "at_load": {d: stored[d] + materialised[d] for d in DTYPE_BYTES},
    }


def published() -> dict:
    """The papers' figures (``sharebert/data/published.json``, with citations)."""
    import json
    from pathlib import Path

    return json.loads((Path(__file__).resolve().parents[1] / "data" / "published.json").read_text())


def paper_figures(preset: str | None, head: str = "none") -> dict | None:
    """Published figures for an unmodified preset under ``head``'s accounting, or ``None``.

    Keys (when published): ``params``, ``exact_params``, ``without_embeddings`` (and ``without``:
    which reading of the paper's 'w/o embeds' it matches, ``word_embeddings`` or ``embeddings_module``), ``gflops``,
    ``label``, ``source`` (citation).
    """
    if not preset:
        return None
    data = published()
    out = {}
    if head == "none" and preset in data["table2"]["rows"]:
        row = data["table2"]["rows"][preset]
        out.update({k: row[k] for k in ("label", "params", "exact_params", "without_embeddings") if k in row})
        out["without"] = row.get("without", "word_embeddings")
        out["source"] = f"{data['sources']['sharebert']}, Table 2"
    if head == "mlm" and preset in data["attention_counts"]["rows"]:
        row = data["attention_counts"]["rows"][preset]
        out.update(
            params=row["params"], exact_params=row["params"], source=f"{data['sources'][row['source']]}, {row['table']}"
        )
    if out and preset in data["flops"]["gflops"]:
        out["gflops"] = data["flops"]["gflops"][preset]
        out["gflops_source"] = f"{data['sources']['sharebert']}, Limitations (batch 1, sequence 128)"
    return out or None
