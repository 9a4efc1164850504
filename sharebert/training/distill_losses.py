"""Knowledge distillation's losses and maps between a ShareBERT student and its teacher (docs/DISTILLATION.md).

The student learns from a frozen teacher through five weighted terms:

- ``kl``: ``T^2 * KL(softmax(teacher / T) || softmax(student / T))`` per example (MSE for STS-B);
- ``hard``: the student's own loss on the gold labels;
- ``hidden``: MSE between student hidden states, projected to the teacher's width by one learned
  linear map, and the teacher's, at the layers of the layer map (padding excluded);
- ``attention``: MSE between attention maps, per head; teacher heads averaged in groups (or
  repeated) when the head counts differ;
- ``embedding``: MSE between the embedding outputs (a second learned projection).

The layer map pairs each student iteration ``j`` (1-based; ShareBERT runs one shared layer
``num_hidden_layers`` times) with a teacher layer; by default uniformly, ``j -> j * L_t // L_s``. A student
trained with depth sampling (``train_min_depth``) runs fewer iterations in some steps: ``pairs_that_ran``.
The projections are trained with the student and never saved with it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .arguments import DistillWeights
from .augment import IGNORE_LABEL


def layer_map(student_layers: int, teacher_layers: int, given=None) -> tuple[tuple[int, int], ...]:
    """The checked layer map; uniform ``j -> j * L_t // L_s`` when ``given`` is None."""
    pairs = (
        given
        if given is not None
        else tuple((j, max(1, j * teacher_layers // student_layers)) for j in range(1, student_layers + 1))
    )
    for s, t in pairs:
        if not (1 <= s <= student_layers and 1 <= t <= teacher_layers):
            raise ValueError(
                f"--layer-map pair {s}:{t} is out of range: the student runs {student_layers} "
                f"iterations, the teacher has {teacher_layers} layers (both counted from 1)"
            )
    return tuple(pairs)


def pairs_that_ran(pairs, depth: int, student_layers: int, teacher_layers: int) -> tuple[tuple[int, int], ...]:
    """The layer map of a student that ran only its first ``depth`` iterations (``--depth-sampling``): the pairs
    of the iterations before ``depth`` unchanged (they computed what they compute at full depth), and iteration
    ``depth``, whose output the head reads, paired with the teacher's last layer. At full depth: ``pairs``."""
    if depth >= student_layers:
        return tuple(pairs)
    return tuple(p for p in pairs if p[0] < depth) + ((depth, teacher_layers),)


def head_groups(student_heads: int, teacher_heads: int) -> list[list[int]]:
    """For each student head, the teacher heads whose maps it learns (averaged)."""
    if teacher_heads >= student_heads:
        return [
            list(range(h * teacher_heads // student_heads, (h + 1) * teacher_heads // student_heads))
            for h in range(student_heads)
        ]
    return [[h * teacher_heads // student_heads] for h in range(student_heads)]


def soft_kl(student_logits, teacher_logits, temperature: float) -> torch.Tensor:
    """``T^2 * KL(p_teacher || p_student)`` at temperature ``T``, averaged over the rows."""
    t = temperature
    log_p_s = F.log_softmax(student_logits.float() / t, dim=-1)
    log_p_t = F.log_softmax(teacher_logits.float() / t, dim=-1)
    return (t * t) * F.kl_div(log_p_s, log_p_t, log_target=True, reduction="batchmean")


def masked_mse(a, b, mask) -> torch.Tensor:
    """Mean squared error over the positions where ``mask`` (broadcastable to ``a``'s leading dims) is 1."""
    mask = mask.to(a.dtype)
    while mask.dim() < a.dim():
        mask = mask.unsqueeze(-1)
    sq = (a.float() - b.float()).pow(2) * mask
    return sq.sum() / (mask.expand_as(a).sum()).clamp_min(1)


class Projections(nn.Module):
    """Learned maps from the student's hidden width to the teacher's (embedding output, hidden states)."""

    def __init__(self, student_width: int, teacher_width: int):
        super().__init__()
        self.embedding = nn.Linear(student_width, teacher_width)
        self.hidden = nn.Linear(student_width, teacher_width)
        if student_width == teacher_width:  # identity start: an exact copy of the teacher has zero loss
            for lin in (self.embedding, self.hidden):
                nn.init.eye_(lin.weight)
                nn.init.zeros_(lin.bias)


def hard_loss(logits, labels, regression: bool = False) -> torch.Tensor:
    """The student's gold-label loss: cross-entropy over the rows (or MLM positions) whose label is not
    ``IGNORE_LABEL`` (-100), MSE over the finite regression labels; 0 when a batch holds none (copies from
    ``--augment`` only)."""
    if regression:
        s, y = logits.float().squeeze(-1), labels.float().squeeze(-1)
        keep = torch.isfinite(y)
        return F.mse_loss(s[keep], y[keep]) if keep.any() else s.sum() * 0
    keep = labels != IGNORE_LABEL
    if not keep.any():
        return logits.sum() * 0
    return F.cross_entropy(logits.float()[keep], labels[keep])


def distill_losses(  # a loss, no workflow: a batch's outputs, mask and labels, and the map between the two models
    student_out,
    teacher_out,
    attention_mask,
    labels,
    projections: Projections,
    weights: DistillWeights,
    pairs,
    groups,
    regression: bool = False,
    logits_mask=None,
) -> dict[str, torch.Tensor]:
    """Each weighted term that is on, and ``"loss"``, their sum.

    ``student_out``/``teacher_out`` are model outputs (``logits`` and, where their terms are on,
    ``hidden_states``/``attentions``); ``logits_mask`` keeps the rows scored by the soft loss
    (MLM: the masked positions).
    """
    parts = {}
    if weights.kl:
        s, t = student_out.logits, teacher_out.logits.to(student_out.logits.dtype)
        if logits_mask is not None:
            s, t = s[logits_mask], t[logits_mask]
        n = min(s.shape[-1], t.shape[-1])  # MLM: vocabularies padded to different multiples; the rest is never a token
        s, t = s[..., :n], t[..., :n]
        parts["kl"] = weights.kl * (
            F.mse_loss(s.float(), t.float()) if regression else soft_kl(s, t, weights.temperature)
        )
    if weights.hard and labels is not None:
        parts["hard"] = weights.hard * hard_loss(student_out.logits, labels, regression)
    if weights.embedding:
        parts["embedding"] = weights.embedding * masked_mse(
            projections.embedding(student_out.hidden_states[0]), teacher_out.hidden_states[0], attention_mask
        )
    if weights.hidden:
        parts["hidden"] = (
            weights.hidden
            * sum(
                masked_mse(
                    projections.hidden(student_out.hidden_states[s]), teacher_out.hidden_states[t], attention_mask
                )
                for s, t in pairs
            )
            / len(pairs)
        )
    if weights.attention:
        pair_mask = attention_mask[:, None, :, None] * attention_mask[:, None, None, :]
        total = 0
        for s, t in pairs:
            ta = teacher_out.attentions[t - 1]
            ta = torch.stack([ta[:, g].mean(1) for g in groups], dim=1)
            total = total + masked_mse(student_out.attentions[s - 1], ta, pair_mask.expand_as(ta))
        parts["attention"] = weights.attention * total / len(pairs)
    parts["loss"] = sum(parts.values()) if parts else student_out.logits.sum() * 0
    return parts


def student_teacher_maps(model, teacher, w: DistillWeights, seed: int):
    """The layer map, the head groups and the (freshly seeded) width projections between student and teacher."""
    from transformers import set_seed

    pairs = layer_map(model.config.num_hidden_layers, teacher.config.num_hidden_layers, w.layer_map)
    groups = head_groups(model.config.num_attention_heads, teacher.config.num_attention_heads)
    set_seed(seed)
    return pairs, groups, Projections(model.config.hidden_size, teacher.config.hidden_size)
