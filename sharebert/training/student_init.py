"""A student that starts from its teacher: the teacher's embedding tables reduced to the student's widths.

The teacher's token vectors ``W`` (E x H) are reduced by PCA (truncated SVD of the centred table):
``Q_F`` (H x F) the top-F principal directions, ``Q_V`` (H x V) the top-V (identity-like when V >= H).
ShareBERT's factorised embeddings ``LN_V(W_in LN_F(A[ids]) + pos + type)`` then start as:

- ``A = (W - mu) Q_F`` (E x F): each token's coordinates on the top-F directions;
- ``W_in = Q_V^T Q_F`` (V x F), bias ``mu Q_V``: back to the teacher's space seen through ``Q_V``;
- positions ``P_t Q_V`` and token types ``T_t Q_V`` (the first ``max_position_embeddings`` rows);
- the embedding LayerNorm's scale and shift seen through ``Q_V`` (``diag(Q_V^T diag(g) Q_V)``, ``b Q_V``);
- the student's output projection (V -> H, when V differs from H): ``Q_V`` itself, so a student
  vector maps back into the teacher's space.

The encoder's generated weights come from ``A`` through the (random) virtual projection, so the layers
start random but small; the residual stream starts as the teacher's embeddings.
"""

from __future__ import annotations

import torch


def pca_basis(table: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mean (H,), basis (H, k))``: the top-``k`` principal directions of ``table`` (rows = points), largest
    first; for ``k >= H`` the identity padded with zero columns (the space is kept whole). From the eigenvectors of
    the H x H covariance: the same directions as the SVD of the E x H table, which took 31 s on MiniLM's 30,522 x 384
    (2 loaded cores) where this takes well under one."""
    table = table.detach().double()
    mean = table.mean(0)
    H = table.shape[1]
    if k >= H:
        return mean.float(), torch.eye(H, k, dtype=torch.float32)
    import numpy as np

    centred = table - mean
    _, vectors = np.linalg.eigh((centred.T @ centred).numpy())  # eigenvalues ascending
    return mean.float(), torch.from_numpy(vectors[:, ::-1][:, :k].copy()).float()


def teacher_tables(teacher) -> dict[str, torch.Tensor | None]:
    """The teacher's word (E x e), position (P x e, None for relative or rotary positions), token-type (None
    without) tables and embedding LayerNorm (None without), of any encoder architecture
    (``teacher.embedding_tables``); e is the embedding width (ALBERT's, ELECTRA's: below the hidden size)."""
    from .teacher import embedding_tables

    return embedding_tables(teacher)


@torch.no_grad()
def init_from_teacher(student, teacher, head: torch.nn.Linear | None = None, rows=None) -> dict:
    """Set ``student``'s (a ``ShareBertModel``) embeddings from ``teacher``'s (see the module docstring), and
    ``head`` (V -> H), the student's output projection, to ``Q_V``; ``rows``: the teacher ids of the student's tokens
    (a cut vocabulary). Returns what was done (for metrics.json)."""
    t = teacher_tables(teacher)
    if rows is not None:  # a cut vocabulary (training.vocab): student id i is the teacher's token rows[i]
        t["word"] = t["word"][torch.as_tensor(rows, dtype=torch.long)]
    c = student.config
    E, H = t["word"].shape  # H: the teacher's embedding width, its hidden size but for a factorised teacher
    V, Fw = c.hidden_size, c.word_embedding_size
    if c.vocab_size < E:
        raise ValueError(f"the student's vocab_size {c.vocab_size} is smaller than the teacher's {E}")
    emb = student.embeddings
    mu, basis = pca_basis(t["word"], max(V, Fw))
    q_v = basis[:, :V]
    word = emb.word_embeddings.weight
    if hasattr(emb, "input_projection"):
        q_f = basis[:, :Fw]  # the top-F directions are the first F of the top-V (one decomposition for both)
        a = (t["word"].float() - mu) @ q_f  # E x F
        word[:E].copy_(a)
        emb.input_projection.weight.copy_(q_v.T @ q_f)
        emb.input_projection.bias.copy_(mu @ q_v)
        emb.input_norm.weight.fill_(float(a.std(dim=1).mean()))  # LN_F keeps a token's scale roughly as it was
        emb.input_norm.bias.zero_()
    else:
        word[:E].copy_(t["word"].float() @ q_v)
    if word.shape[0] > E and rows is not None:  # a cut vocabulary's extra rows: a source of generated weights
        word[E:].normal_(0.0, float(word[:E].std()))
    elif word.shape[0] > E:  # padding rows past the tokenizer: never looked up
        word[E:].zero_()
    if t["position"] is not None:  # else (relative or rotary positions) the student's own random start
        P = min(emb.position_embeddings.weight.shape[0], t["position"].shape[0])
        emb.position_embeddings.weight[:P].copy_(t["position"][:P].float() @ q_v)
    if t["token_type"] is not None:
        T = min(emb.token_type_embeddings.weight.shape[0], t["token_type"].shape[0])
        emb.token_type_embeddings.weight[:T].copy_(t["token_type"][:T].float() @ q_v)
    else:  # no token types: every type adds nothing at the start
        emb.token_type_embeddings.weight.zero_()
    if t["ln_weight"] is not None:
        emb.LayerNorm.weight.copy_(((q_v * q_v) * t["ln_weight"].float()[:, None]).sum(0))
    if t["ln_bias"] is not None:
        emb.LayerNorm.bias.copy_(t["ln_bias"].float() @ q_v)
    if head is not None and tuple(head.weight.shape) == tuple(
        q_v.shape
    ):  # else fitted on sentences (distill_embedding)
        head.weight.copy_(q_v)  # (H, V): a student vector back into the teacher's space
        head.bias.zero_()
    return {
        "init": "teacher",
        "teacher_width": H,
        "word_pca_dims": Fw if hasattr(emb, "input_projection") else V,
        "hidden_pca_dims": min(V, H),
    }
