"""Sentence vectors of a PyTorch encoder (any ``AutoModel`` backbone, a ShareBERT student included), pooled as a
sentence-transformers recipe pools (``pool``), through its Dense ``head`` where it has one: over texts
(:func:`encode`, batches of like length) or over a prepared folder's packed blocks (:func:`encode_blocks`)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ..model.modeling_sharebert import pool


@torch.no_grad()
def encode_blocks(model, blocks, count: int, pooling: str, head=None, batch_size: int = 64) -> np.ndarray:
    """Sentence vectors ``(count, H)`` of a backbone (+ ``head``) over the first ``count`` blocks ``(T,)``."""
    out = []
    model.eval()
    for i in range(0, count, batch_size):
        ids = torch.stack([blocks[j] for j in range(i, min(count, i + batch_size))]).to(model.device)
        mask = torch.ones_like(ids)
        v = pool(model(input_ids=ids, attention_mask=mask).last_hidden_state, mask, pooling)
        out.append((v if head is None else head(v)).float().cpu().numpy())
    return np.concatenate(out)


@torch.no_grad()
def encode(  # 9: the encoder and its recipe, then SentenceTransformer.encode's keywords with defaults
    model,
    tokenizer,
    sentences: list[str],
    pooling: str,
    head=None,
    seq_len: int = 128,
    batch_size: int = 64,
    normalize: bool = False,
    desc: str | None = None,
) -> np.ndarray:
    """Sentence vectors ``(N, H)`` of a backbone (+ ``head``), batches sorted by length, in input order;
    ``desc``: show progress under that name (long passes: the teacher over the training sentences)."""
    from ..formats.bars import bar

    order = np.argsort([len(s) for s in sentences])
    out = [None] * len(sentences)
    model.eval()
    for i in bar(range(0, len(order), batch_size), desc is not None, desc=desc, unit="batch"):
        idx = order[i : i + batch_size]
        enc = tokenizer(
            [sentences[j] for j in idx], truncation=True, max_length=seq_len, padding=True, return_tensors="pt"
        )
        enc = {k: v.to(model.device) for k, v in enc.items()}
        v = pool(model(**enc).last_hidden_state, enc["attention_mask"], pooling)
        if head is not None:
            v = head(v)
        if normalize:
            v = F.normalize(v, dim=-1)
        for j, row in zip(idx, v.float().cpu().numpy()):
            out[j] = row
    return np.stack(out)
