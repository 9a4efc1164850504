"""Embeddings Parameter-Sharing (EPS): dense weights built from columns of an embedding matrix.

A source matrix ``M`` of shape ``(E, W)`` lends whole columns to each target weight; the column
plan and the layout (``T[i, j] = M[k % E, c0 + k // E]`` with ``k = i * cols + j``) are in
``sharebert/model/plan.py``. Generation is one matrix product: ``M[:, used].T`` is a ``(sum(G), E)``
buffer whose rows are the generated columns, and every target is a view of a piece of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from .plan import ColumnPlan, TargetSlot

__all__ = ["TargetSlot", "ColumnPlan", "generate_from_source", "generate_virtual", "EPSLinear", "share_linears_"]


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


def tracing() -> bool:
    """Whether the forward is being recorded (TorchScript trace, ONNX export, torch.compile / torch.export):
    then no data-dependent shortcut and no cached constant may be taken."""
    return torch.jit.is_tracing() or torch.onnx.is_in_onnx_export() or torch.compiler.is_compiling()


class _SourceCache:
    """Eval-mode cache of generated weights, keyed on every source tensor's identity and version.

    Any in-place update (optimizer step, ``load_state_dict``), a move (``to()``) or a swap of
    ``.data`` changes the key, so the cache cannot go stale. Only used without autograd, and
    bypassed while tracing (an export must record the generation, not a cached constant).
    """

    def __init__(self):
        self.key, self.value = None, None

    def get(self, sources: Iterable[torch.Tensor], make: Callable[[], dict[str, torch.Tensor]]):
        if torch.is_grad_enabled() or tracing():
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

    def __init__(self, generator: EPSGenerator, name: str, bias: torch.Tensor | None):
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
