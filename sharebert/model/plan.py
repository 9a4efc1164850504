"""EPS column plans: which source columns build which target weight (no torch needed).

A source matrix ``M`` of shape ``(E, W)`` lends whole columns to each target weight ``T`` of shape
``(rows, cols)``: ``T`` has ``L = rows * cols`` entries and takes ``G = ceil(L / E)`` columns
(ShareBERT eq. 3); all targets together may take at most ``W`` columns (eq. 4).

Layout (documented choice, tested in ``tests/model/test_eps.py``):

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
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["TargetSlot", "ColumnPlan"]


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
    def build(cls, source_rows: int, source_width: int, targets: Sequence[tuple[str, tuple[int, int]]]) -> ColumnPlan:
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

    def without(self, name: str) -> ColumnPlan:
        """The plan minus target ``name``, every other target keeping its columns; only the left-most
        (last-planned) target can go, so the used columns stay one slice ``M[:, first_column:]``."""
        dropped = self.slot(name)
        if dropped.first_column != self.first_column:
            raise ValueError(f"only the left-most EPS target ({self.slots[-1].name}) can be dropped, not {name!r}")
        return ColumnPlan(self.source_rows, self.source_width, tuple(s for s in self.slots if s.name != name))

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

    def split(self, buffer):
        """Cut a contiguous ``(columns_used, E)`` buffer into target views ``{name: (rows, cols)}``.

        ``split`` (not slicing) keeps the backward pass to one concatenation instead of one
        zero-filled buffer per target.
        """
        pieces = buffer.reshape(-1).split(self.split_sizes())
        ordered = sorted(self.slots, key=lambda s: s.first_column)
        return {s.name: pieces[2 * n].view(s.shape) for n, s in enumerate(ordered)}
