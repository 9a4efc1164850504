"""Task-data augmentation for distillation: perturbed copies of the training examples, labelled by the teacher.

A small student learns a task from its teacher's logits better when it sees more inputs than the training
set holds (Tang et al. 2019, "Distilling task-specific knowledge from BERT into simple neural networks";
TinyBERT's augmentation). Each copy perturbs the token ids of one example:

- each word token is replaced by ``[MASK]`` with probability ``p_mask``;
- each one-token word is replaced, with probability ``p_swap``, by one of its ``k`` nearest words in the
  teacher's input-embedding table (cosine), a word the teacher's vocabulary knows as a whole token.

Copies keep the example's segments (token types) and length. Their gold labels are unknown after the
change, so they carry ``IGNORE_LABEL`` (NaN for regression) and teach through the teacher's logits alone.
"""

from __future__ import annotations

import numpy as np
import torch

from .encoded import EncodedSplit

IGNORE_LABEL = -100  # the label of a copy: the hard (gold-label) loss skips it
MAX_ROWS = 2_000_000  # examples and copies together (about 30 times SST-2's training set): built in memory


def check_augment(copies: int, tokenizer, teacher_dir, examples: int | None = None) -> None:
    """``ValueError`` (naming the option) for copies that cannot be made: no ``[MASK]`` token in the teacher's
    tokenizer, or (once ``examples`` is known) more than ``MAX_ROWS`` rows in all."""
    if tokenizer.mask_token_id is None:
        raise ValueError(
            f"--augment masks words with the teacher's mask token; the tokenizer of {teacher_dir} has none"
        )
    rows = (examples or 0) * (copies + 1)
    if rows > MAX_ROWS:
        raise ValueError(
            f"--augment {copies} makes {rows:,} training rows from {examples:,} examples, more than "
            f"{MAX_ROWS:,}: ask for fewer copies (or fewer examples, --max-train-samples)"
        )


def word_ids(tokenizer) -> np.ndarray:
    """Boolean mask ``(V,)``: the ids of whole alphabetic words (no ``##`` piece, special or unused token)."""
    vocab = tokenizer.get_vocab()
    special = set(tokenizer.all_special_ids)
    mask = np.zeros(max(vocab.values()) + 1, dtype=bool)
    for token, i in vocab.items():
        mask[i] = token.isalpha() and i not in special and not token.startswith("[")
    return mask


@torch.no_grad()
def nearest_words(
    embeddings: torch.Tensor, ids: np.ndarray, candidates: np.ndarray, k: int, chunk: int = 4096
) -> dict[int, np.ndarray]:
    """For each id in ``ids``, its ``k`` nearest ids among ``candidates`` (itself excluded) by the cosine of
    rows of ``embeddings`` ``(V, H)``: ``{id: (k,) ids}``."""
    table = torch.nn.functional.normalize(embeddings.detach().float().cpu(), dim=-1)  # a teacher on a GPU too
    cand = torch.from_numpy(np.flatnonzero(candidates))
    cand_vecs = table[cand]
    out = {}
    for s in range(0, len(ids), chunk):
        part = torch.from_numpy(ids[s : s + chunk])
        sims = table[part] @ cand_vecs.T  # (chunk, C)
        sims[cand[None, :] == part[:, None]] = -2.0  # never itself
        top = sims.topk(k, dim=-1).indices
        for i, row in zip(part.tolist(), cand[top].numpy()):
            out[i] = row
    return out


def augment(  # 9: the split, copies and tables, then TinyBERT's augmentation knobs as keywords with its defaults
    ds: EncodedSplit,
    copies: int,
    tokenizer,
    embeddings: torch.Tensor,
    regression: bool = False,
    p_mask: float = 0.1,
    p_swap: float = 0.1,
    k: int = 8,
    seed: int = 0,
) -> EncodedSplit:
    """``ds`` followed by ``copies`` perturbed copies of each of its examples (module docstring), labelled
    ``IGNORE_LABEL`` (NaN when ``regression``). ``embeddings``: the teacher's input table ``(V, H)``."""
    if copies <= 0:
        return ds
    rng = np.random.default_rng(seed)
    words = word_ids(tokenizer)
    words = np.pad(words, (0, max(0, embeddings.shape[0] - len(words))))[: embeddings.shape[0]]
    ids = ds.encodings["input_ids"]
    seen = np.unique(np.concatenate([np.asarray(r) for r in ids]))
    seen = seen[seen < len(words)]
    k = min(k, int(words.sum()) - 1)  # a vocabulary of few whole words: fewer neighbours, or no swaps
    near = nearest_words(embeddings, seen[words[seen]], words, k) if k >= 1 else {}
    is_piece = np.zeros(len(words) + 1, dtype=bool)
    is_piece[[i for t, i in tokenizer.get_vocab().items() if t.startswith("##") and i < len(words)]] = True
    mask_id = tokenizer.mask_token_id
    new_ids = []
    for _ in range(copies):
        for row in ids:
            row = np.asarray(row)
            inside = row < len(words)
            is_word = np.zeros(len(row), dtype=bool)
            is_word[inside] = words[row[inside]] | is_piece[row[inside]]
            whole = is_word.copy()  # a one-token word: a word not continued by a ## piece
            whole[:-1] &= ~is_piece[np.minimum(row[1:], len(words))]
            whole &= ~is_piece[np.minimum(row, len(words))]
            draw = rng.random(len(row))
            out = row.copy()
            for j in np.flatnonzero(whole & (draw < p_swap)):
                out[j] = near[int(row[j])][rng.integers(k)] if int(row[j]) in near else row[j]
            out[is_word & (draw >= p_swap) & (draw < p_swap + p_mask)] = mask_id
            new_ids.append(out.tolist())
    enc = {key: list(v) * (copies + 1) if key != "input_ids" else list(v) + new_ids for key, v in ds.encodings.items()}
    fill = float("nan") if regression else IGNORE_LABEL
    return EncodedSplit(enc, list(ds.labels) + [fill] * (len(ds) * copies))
