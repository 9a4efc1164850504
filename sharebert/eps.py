"""Embeddings Parameter-Sharing (EPS): dense weights built from columns of an embedding matrix.

A source matrix ``M`` of shape ``(E, W)`` lends whole columns to each target weight ``T`` of shape
``(rows, cols)``: ``T`` has ``L = rows * cols`` entries and takes ``G = ceil(L / E)`` columns
(ShareBERT eq. 3); all targets together may take at most ``W`` columns (eq. 4).

Layout (documented choice, tested in ``tests/test_eps.py``):

* Columns are taken from the right end of ``M``. The first target gets the right-most block,
  the next target the block left of it, and so on; inside its block a target's columns are in
  ascending order. The used columns are therefore one contiguous slice ``M[:, W - sum(G):]``.
* A target is filled from its columns top to bottom, one column after the other, in row-major
  order of ``T``. With ``c0`` the target's first (left-most) column and ``k = i * cols + j``::

      T[i, j] = M[k % E, c0 + k // E]

  The last ``G * E - L`` entries of the block (``delta``, eq. 6) are unused.

This order makes generation one matrix product: ``M[:, used].T`` is a ``(sum(G), E)`` buffer whose
rows are the generated columns, and every target is a reshape (a view) of a piece of it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["TargetSlot", "ColumnPlan", "generate_from_source", "generate_virtual", "EPSLinear", "share_linears_"]


@dataclass(frozen=True)
class TargetSlot:
    """Where one target weight of shape ``(rows, cols)`` lives in the source matrix."""

    name: str
    shape: tuple[int, int]
    first_column: int  # left-most source column of this target's block
    num_columns: int  # G = ceil(L / E)
    source_rows: int  # E

    @property
    def numel(self) -> int:
        return self.shape[0] * self.shape[1]

    @property
    def unused(self) -> int:
        """Entries of the block left over after filling the target (eq. 6's delta)."""
        return self.num_columns * self.source_rows - self.numel


@dataclass(frozen=True)
class ColumnPlan:
    """Column assignment of a list of targets in an ``(E, W)`` source matrix."""

    source_rows: int  # E
    source_width: int  # W
    slots: tuple[TargetSlot, ...]

    @classmethod
    def build(cls, source_rows: int, source_width: int, targets: Sequence[tuple[str, tuple[int, int]]]) -> "ColumnPlan":
        """Plan ``targets`` (``(name, (rows, cols))`` pairs, in fill order) right to left.

        Raises ``ValueError`` naming the shortfall when they need more than ``source_width`` columns.
        """
        if source_rows < 1 or source_width < 1:
            raise ValueError(f"EPS source matrix must be non-empty, got {source_rows} x {source_width}")
        names = [name for name, _ in targets]
        if len(set(names)) != len(names):
            raise ValueError(f"EPS target names must be unique, got {names}")
        needs = [(name, (int(r), int(c)), math.ceil(int(r) * int(c) / source_rows)) for name, (r, c) in targets]
        total = sum(g for _, _, g in needs)
        if total > source_width:
            detail = ", ".join(f"{name} {r}x{c}: {g}" for name, (r, c), g in needs)
            raise ValueError(
                f"EPS column budget exceeded: the targets need {total} columns of the {source_rows} x "
                f"{source_width} source matrix but only {source_width} are available "
                f"(short by {total - source_width}; per target: {detail}). Ways out: use sharing='veps' "
                f"(a virtual embedding as wide as the hidden size), a wider source (larger embedding_size "
                f"or hidden_size), fewer generated targets (e.g. pooler='dense'), or an attention variant "
                f"with fewer matrices (symmetric, shared-qkv, partial-qk)."
            )
        slots, right = [], source_width
        for name, shape, g in needs:
            right -= g
            slots.append(TargetSlot(name, shape, right, g, source_rows))
        return cls(source_rows, source_width, tuple(slots))

    @property
    def columns_used(self) -> int:
        return sum(s.num_columns for s in self.slots)

    @property
    def first_column(self) -> int:
        """Left-most used column: the plan uses ``M[:, first_column:]``."""
        return self.source_width - self.columns_used

    @property
    def generated_params(self) -> int:
        return sum(s.numel for s in self.slots)

    def slot(self, name: str) -> TargetSlot:
        for s in self.slots:
            if s.name == name:
                return s
        raise KeyError(f"no EPS target named {name!r}; targets: {[s.name for s in self.slots]}")

    def source_index(self, name: str, i: int, j: int) -> tuple[int, int]:
        """``(r, c)`` such that target ``name``'s entry ``[i, j]`` equals ``M[r, c]``."""
        s = self.slot(name)
        k = i * s.shape[1] + j
        return k % self.source_rows, s.first_column + k // self.source_rows

    def split_sizes(self) -> list[int]:
        """Sizes that cut the flattened ``(columns_used, E)`` buffer into targets and unused tails.

        Buffer rows run from the left-most used column, so the last-planned target comes first.
        """
        sizes = []
        for s in sorted(self.slots, key=lambda s: s.first_column):
            sizes += [s.numel, s.unused]
        return sizes

    def split(self, buffer: torch.Tensor) -> dict[str, torch.Tensor]:
        """Cut a contiguous ``(columns_used, E)`` buffer into target views ``{name: (rows, cols)}``.

        ``split`` (not slicing) keeps the backward pass to one concatenation instead of one
        zero-filled buffer per target.
        """
        pieces = buffer.reshape(-1).split(self.split_sizes())
        ordered = sorted(self.slots, key=lambda s: s.first_column)
        return {s.name: pieces[2 * n].view(s.shape) for n, s in enumerate(ordered)}


def generate_from_source(plan: ColumnPlan, source: torch.Tensor) -> dict[str, torch.Tensor]:
    """EPS: targets from the columns of ``source`` ``(E, W)``; one transposing copy."""
    return plan.split(source[:, plan.first_column :].t().contiguous())


def generate_virtual(
    plan: ColumnPlan, embeddings: torch.Tensor, projection: torch.Tensor, bias: torch.Tensor
) -> dict[str, torch.Tensor]:
    """VEPS: targets from ``M = A @ P + p`` without forming the unused columns.

    ``embeddings`` A ``(E, F)``, ``projection`` P ``(F, W)``, ``bias`` p ``(W,)``. One matrix
    product ``P[:, used].T @ A.T + p[used]`` gives the ``(columns_used, E)`` buffer.
    """
    c0 = plan.first_column
    buffer = torch.addmm(bias[c0:, None], projection[:, c0:].t(), embeddings.t())
    return plan.split(buffer)


class _SourceCache:
    """Eval-mode cache of generated weights, keyed on every source tensor's identity and version.

    Any in-place update (optimizer step, ``load_state_dict``), a move (``to()``) or a swap of
    ``.data`` changes the key, so the cache cannot go stale. Only used without autograd, and
    bypassed while tracing (an export must record the generation, not a cached constant).
    """

    def __init__(self):
        self.key, self.value = None, None

    def get(self, sources: Iterable[torch.Tensor], make: Callable[[], dict[str, torch.Tensor]]):
        if torch.is_grad_enabled() or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():
            self.key = self.value = None
            return make()
        key = tuple((t.data_ptr(), t._version, t.device, t.dtype, t.shape) for t in sources)
        key += (torch.is_inference_mode_enabled(),)
        if key != self.key:
            self.key, self.value = None, make()
            self.key = key
        return self.value


class EPSLinear(nn.Module):
    """A linear layer whose weight is a target of a shared EPS generator; it owns only its bias."""

    def __init__(self, generator: "EPSGenerator", name: str, bias: torch.Tensor | None):
        super().__init__()
        object.__setattr__(self, "_generator", generator)  # not a submodule: owned by the model root
        self.target = name
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())

    @property
    def weight(self) -> torch.Tensor:
        return self._generator.weights()[self.target]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"target={self.target!r}, shape={self._generator.plan.slot(self.target).shape}"


class EPSGenerator(nn.Module):
    """Generates every target of a plan from an embedding matrix, once per forward pass.

    Call :meth:`weights` from each layer: within one forward (same parameter versions, same
    autograd graph step) the result is reused via a per-call memo set by :meth:`begin`.
    """

    def __init__(self, embedding: nn.Parameter, plan: ColumnPlan):
        super().__init__()
        object.__setattr__(self, "_embedding", embedding)  # owned by the embedding module
        self.plan = plan
        self._cache = _SourceCache()
        self._memo = None

    def weights(self) -> dict[str, torch.Tensor]:
        if self._memo is not None:
            return self._memo
        return self._cache.get([self._embedding], lambda: generate_from_source(self.plan, self._embedding))

    def forward_hook(self, module, args):  # forward pre-hook on the root model
        self._memo = None
        self._memo = self.weights()

    def clear_hook(self, module, args, output):
        self._memo = None


def share_linears_(
    model: nn.Module,
    embedding: nn.Parameter,
    filter_fn: Callable[[nn.Module, str], bool] | None = None,
) -> ColumnPlan:
    """Replace ``nn.Linear`` layers of ``model`` in place by EPS layers generated from ``embedding``.

    ``embedding`` ``(E, W)`` is the source matrix (usually a word-embedding table). ``filter_fn(module,
    fqn)`` picks the layers (default: every ``nn.Linear``). Targets are planned in module order;
    each keeps its own learned bias. The weights are generated once per forward of ``model``.
    Returns the column plan; raises ``ValueError`` if the layers do not fit in ``W`` columns.
    """
    chosen = [
        (fqn, m)
        for fqn, m in model.named_modules()
        if isinstance(m, nn.Linear) and (filter_fn is None or filter_fn(m, fqn))
    ]
    if not chosen:
        raise ValueError("share_linears_: no nn.Linear layer matched the filter")
    plan = ColumnPlan.build(embedding.shape[0], embedding.shape[1], [(fqn, tuple(m.weight.shape)) for fqn, m in chosen])
    generator = EPSGenerator(embedding, plan)
    model.add_module("eps_generator", generator)
    for fqn, linear in chosen:
        parent_name, _, child = fqn.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, EPSLinear(generator, fqn, linear.bias))
    model.register_forward_pre_hook(generator.forward_hook)
    model.register_forward_hook(generator.clear_hook)
    return plan
