"""The modules of an embedding distillation: the teacher's Dense head and encoder as loaded, the student's output
projection (fitted at step 0), the loss on sentence vectors, the Trainer that computes it, and the student saved as a
sentence-transformers folder."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from sharebert_runtime.outdir import finite

from ..model.modeling_sharebert import pool
from .arguments import EMBEDDING_LOSSES
from .distill_embedding_setup import _EmbeddingRun
from .distill_losses import Projections, distill_losses, pairs_that_ran
from .distill_sentences import SentenceCollator
from .distill_trainer import DistillTrainer, stream_training_args


def embedding_loss(student: torch.Tensor, teacher: torch.Tensor, kind: str) -> torch.Tensor:
    """``mean(1 - cos)`` or ``mean((s - t)^2)`` over ``(B, H)`` vectors; 0 when they are equal."""
    s, t = student.float(), teacher.float()
    if kind == "cosine":
        return (1 - F.cosine_similarity(s, t, dim=-1, eps=1e-8)).mean()
    if kind == "mse":
        return F.mse_loss(s, t)
    raise ValueError(f"--loss {kind!r}: choose one of {', '.join(EMBEDDING_LOSSES)}")


_ACTIVATION_MODULES = {
    "Identity": nn.Identity,
    "Tanh": nn.Tanh,
    "Relu": nn.ReLU,
    "Sigmoid": nn.Sigmoid,
    "Gelu": nn.GELU,
}


def recipe_head(model_dir, recipe) -> nn.Module | None:
    """The recipe's Dense layers (``sharebert.formats.recipe``) as a frozen torch module, or None when it has none."""
    from ..formats.recipe import ACTIVATIONS, read_dense_weights

    layers = []
    for layer in recipe.dense:
        w, b = read_dense_weights(model_dir, layer)
        lin = nn.Linear(layer.in_features, layer.out_features, bias=b is not None)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(w))
            if b is not None:
                lin.bias.copy_(torch.from_numpy(b))
        layers += [lin, _ACTIVATION_MODULES[ACTIVATIONS[layer.activation]]()]
    return nn.Sequential(*layers).requires_grad_(False).eval() if layers else None


def student_head(student_dir, in_features: int, out_features: int, pooling: str) -> nn.Linear | None:
    """A student folder's own output projection ``(in_features -> out_features)``: its one Dense module, without
    activation, after the same ``pooling`` as the teacher's; so a student distilled further keeps the head it was
    trained with, also where the widths match (then no head is made afresh). None where the folder has no such head."""
    from ..formats.recipe import ACTIVATIONS, read_dense_weights, read_recipe

    recipe = read_recipe(student_dir)
    dense = recipe.dense
    if recipe.pooling != pooling or len(dense) != 1:
        return None
    layer = dense[0]
    if (
        ACTIVATIONS[layer.activation] != "Identity"
        or not layer.bias
        or (layer.in_features, layer.out_features) != (in_features, out_features)
    ):
        return None
    w, b = read_dense_weights(student_dir, layer)
    head = nn.Linear(in_features, out_features)
    with torch.no_grad():
        head.weight.copy_(torch.from_numpy(w))
        head.bias.copy_(torch.from_numpy(b))
    return head


def load_encoder(model_dir, config=None):
    """The backbone of any BERT-family or sharebert folder (``AutoModel``), eval mode, no gradients, eager
    attention (attention maps for the token-level terms), on the CPU (``distill_embedding`` moves it to the
    GPU, where there is one, once the student is initialised from it). ``config``: its transformers config where the
    run has read it (a copy is loaded with: from_pretrained sets its attention on the object), so the folder's
    ``config.json`` is not read again."""
    import copy

    from transformers import AutoModel

    import sharebert.model.modeling_sharebert  # noqa: F401  (registers the sharebert Auto classes)
    from sharebert_runtime.errors import first_line

    try:
        config = None if config is None else copy.deepcopy(config)
        model = AutoModel.from_pretrained(model_dir, config=config, attn_implementation="eager")
    except (OSError, ValueError) as e:
        raise ValueError(f"--teacher {model_dir} cannot be loaded: {first_line(e)}") from None
    model.requires_grad_(False)
    from .teacher import accept_known_inputs

    accept_known_inputs(model)
    return model.eval()


@torch.no_grad()
def fit_head(head: nn.Linear, student: np.ndarray, teacher: np.ndarray, ridge: float = 1e-2) -> None:
    """Set ``head`` (V -> H) to the ridge least-squares map from student vectors ``(N, V)`` to the teacher's
    ``(N, H)``: the best linear start for the output projection given the student's initial features."""
    s, t = student.astype(np.float64), teacher.astype(np.float64)
    ms, mt = s.mean(0), t.mean(0)
    sc = s - ms
    gram = sc.T @ sc + ridge * len(s) * np.eye(s.shape[1])
    w = np.linalg.solve(gram, sc.T @ (t - mt))  # (V, H)
    head.weight.copy_(torch.from_numpy(w.T).float())
    head.bias.copy_(torch.from_numpy(mt - ms @ w).float())


class EmbeddingProjections(Projections):
    """The token-level projections of ``distill`` plus ``head``: the student's output projection (V -> H), or
    None when the widths match. ``head`` is part of the student: it is saved as its Dense module."""

    def __init__(self, student_width: int, teacher_width: int, output_width: int):
        super().__init__(student_width, teacher_width)
        self.head = nn.Linear(student_width, output_width) if student_width != output_width else None


class EmbeddingTrainer(DistillTrainer):
    """``distill``'s trainer whose loss is the sentence-embedding ``loss`` (``embedding_loss``) between the student's
    and the teacher's vectors pooled by ``pooling`` (plus any token-level terms). ``teacher_head``: the teacher's
    Dense layers, applied to its pooled vector (None: none)."""

    def __init__(self, *a, pooling: str, loss: str, teacher_head=None, **kw):
        super().__init__(*a, **kw)
        self.pooling, self.loss, self.teacher_head = pooling, loss, teacher_head

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        w = self.weights
        need_h, need_a = bool(w.hidden or w.embedding), bool(w.attention)
        targets = inputs.pop("teacher_logits", None)
        out = model(**inputs, output_hidden_states=need_h, output_attentions=need_a)
        s = pool(out.last_hidden_state, inputs["attention_mask"], self.pooling)
        if self.projections.head is not None:
            s = self.projections.head(s)
        parts = {}
        if need_h or need_a or targets is None:  # --data, or token-level terms: the teacher runs on the batch
            with torch.no_grad():
                t_out = self.teacher(**inputs, output_hidden_states=need_h, output_attentions=need_a)
            if targets is None:
                targets = pool(t_out.last_hidden_state, inputs["attention_mask"], self.pooling)
                targets = targets if self.teacher_head is None else self.teacher_head(targets)
        if need_h or need_a:
            terms = replace(w, kl=0.0, hard=0.0)
            ran = len(out.attentions) if need_a else len(out.hidden_states) - 1  # fewer under depth sampling
            pairs = pairs_that_ran(
                self.pairs, ran, model.config.num_hidden_layers, self.teacher.config.num_hidden_layers
            )
            parts = {
                k: v
                for k, v in distill_losses(
                    out, t_out, inputs["attention_mask"], None, self.projections, terms, pairs, self.groups
                ).items()
                if k != "loss"
            }
        parts["sentence"] = embedding_loss(s, targets, self.loss)
        for k, v in parts.items():
            self._parts[k] = float(v.detach())
        total = sum(parts.values())
        return (total, out) if return_outputs else total


def _embedding_trainer(r: _EmbeddingRun, train_ds, pairs, groups, trained_on: dict, packed: bool):
    """The embedding trainer, bound by ``--max-time`` (under a ``budget``: what the budget leaves training) and
    ``--max-steps``, marking its checkpoints. ``pairs``, ``groups``: the token-level terms' layer map
    (``distill_losses.student_teacher_maps``). ``packed``: the training rows are --data's blocks, all one length."""
    from .callbacks import MarkCheckpoints, WallClockLimit

    args, t, s_tok, budget = r.args, r.teacher, r.s_tok, r.budget

    # sentences of like length batched together: a batch costs its longest sentence times its size, and WikiText's
    # run from 8 to 60 tokens, so random batches are half padding
    grouped = {} if packed else {"train_sampling_strategy": "group_by_length"}
    targs = stream_training_args(r.out, args, r.progress, remove_unused_columns=False, **grouped)
    clock = WallClockLimit(args.max_time) if args.max_time else None
    if budget is not None:  # training gets what the command's budget leaves (resumed: its checkpoint's seconds too)
        clock = WallClockLimit(budget.training_seconds())
    trainer = EmbeddingTrainer(
        model=r.model,
        args=targs,
        train_dataset=train_ds,
        processing_class=s_tok,
        data_collator=SentenceCollator(s_tok),
        teacher=t.model,
        projections=r.projections,
        weights=args.weights,
        pairs=pairs,
        groups=groups,
        callbacks=[MarkCheckpoints(args.save_minutes, keep=2), *r.callbacks],
        data=trained_on,
        pooling=t.recipe.pooling,
        loss=args.loss,
        teacher_head=t.head,
        limit=clock,
        max_steps=args.max_steps,
        progress=r.progress,
    )
    return trainer


def _save_result(r: _EmbeddingRun, trainer, model, metrics: dict) -> None:
    """The trained student ``model`` as a folder (:func:`save_student`), its log history, curves and metrics."""
    from .callbacks import write_results

    save_student(model, r.projections.head, r.s_tok, r.out, r.teacher.recipe, r.seq_len)
    write_results(trainer, r.out, finite(metrics))


def save_student(model, head, tokenizer, out: Path, teacher_recipe, seq_len: int) -> None:
    """The student as a sentence-transformers folder: backbone and tokenizer, then the teacher's recipe with the
    student's own output projection (if any) as its one Dense layer (``sharebert.formats.recipe.write_recipe``). Every
    file says the length the student was trained at, ``seq_len`` (at most its ``max_position_embeddings``): the
    tokenizer's ``model_max_length`` and the recipe's ``max_seq_length``, so ``truncation=True`` never gives more tokens
    than the model has positions."""
    from ..formats.recipe import DenseLayer, EmbeddingRecipe, write_recipe

    model.save_pretrained(str(out))
    kept, tokenizer.model_max_length = tokenizer.model_max_length, seq_len  # its files say what the model reads
    try:
        tokenizer.save_pretrained(str(out))
    finally:
        tokenizer.model_max_length = kept
    dense, weights = (), ()
    if head is not None:
        dense = (DenseLayer("2_Dense", head.in_features, head.out_features, True, "torch.nn.modules.linear.Identity"),)
        weights = [(head.weight.detach().cpu().numpy(), head.bias.detach().cpu().numpy())]
    recipe = EmbeddingRecipe(
        pooling=teacher_recipe.pooling,
        normalize=teacher_recipe.normalize,
        dense=dense,
        max_seq_length=seq_len,
        do_lower_case=teacher_recipe.do_lower_case,
        source="modules.json",
    )
    write_recipe(out, recipe, weights, hidden_size=model.config.hidden_size)
