"""The pooled overview: weights pooled into blocks, the blocks' edges travelling with the values.

Pooling is declared: "max" keeps a single sharp spike visible, "mean" keeps mass (a block's mean over
all its cells, masked ones counting as zero). Block edges are deterministic, `edges(lo, hi, cells)`, and
travel with every pooled result so a page can label its axes. A trace's forward pools its overview into a
Pool as its row blocks pass (mha.trace.blocked); a window or an overview asked of a kept trace pools the
weights it recomputes the same way (mha.trace.windows).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Literal

import torch

__all__ = ["OVERVIEW_SIZE", "REDUCTIONS", "Pool", "Pooled", "Reduce", "check_reduce", "edges"]

Reduce = Literal["max", "mean"]
REDUCTIONS: tuple[Reduce, ...] = ("max", "mean")
# Blocks per side of the overview pooled during the forward (Trace.first_overview).
OVERVIEW_SIZE = 128


def edges(lo: int, hi: int, cells: int) -> torch.Tensor:
    """cells + 1 token boundaries splitting lo..hi-1 into `cells` blocks whose sizes differ by at most one:
    block c covers tokens edges[c] .. edges[c + 1] - 1. cells = hi - lo gives one token per block."""
    if not 1 <= cells <= hi - lo:
        raise ValueError(f"cannot split {hi - lo} tokens into {cells} blocks")
    return lo + torch.arange(cells + 1) * (hi - lo) // cells


@dataclass(frozen=True)
class Pooled:
    """Weights pooled into blocks: values [..., rows, cols] float32 on the CPU; block r covers query tokens
    row_edges[r] .. row_edges[r + 1] - 1, block c key tokens col_edges[c] .. col_edges[c + 1] - 1."""

    values: torch.Tensor
    row_edges: list[int]
    col_edges: list[int]
    reduce: Reduce

    @property
    def exact(self) -> bool:
        """One token per block on both axes: the values are the weights themselves."""
        return self.values.shape[-2] == self.row_edges[-1] - self.row_edges[0] and (
            self.values.shape[-1] == self.col_edges[-1] - self.col_edges[0]
        )

    @property
    def factor(self) -> tuple[int, int]:
        """The largest block's (rows, cols) in tokens: "pooled x k" on each axis."""
        rows, cols = torch.tensor(self.row_edges).diff(), torch.tensor(self.col_edges).diff()
        return int(rows.max()), int(cols.max())


class Pool:
    """Accumulates blocks of weights [h, r, c] into [h, R, C] pooled cells by `reduce`.

    A block's rows are pooled first, over its middle dim, so each reduction runs along contiguous keys and
    the keys are then pooled on data a row-block's height smaller. Where the block's cells on an axis are
    all the same size (edges from an n the cells divide) that axis is one reshape and reduction; one token
    per cell leaves the axis as it is; otherwise rows are reduced cell by cell and keys scattered.
    """

    def __init__(
        self,
        heads: int,
        row_edges: torch.Tensor,
        col_edges: torch.Tensor,
        reduce: Reduce,
        acc: torch.Tensor | None = None,
    ) -> None:
        self.reduce = reduce
        self.row_edges, self.col_edges = row_edges, col_edges
        self.row_cuts, self.col_cuts = row_edges.tolist(), col_edges.tolist()
        rows, cols = len(row_edges) - 1, len(col_edges) - 1
        # Weights are >= 0, so 0 is max's identity as well as sum's. `acc` (zeros [heads, rows, cols]) is
        # one layer's slice of a caller's [L, H, rows, cols]: every layer pooled in place, never stacked.
        self.acc = torch.zeros(heads, rows, cols, dtype=torch.float32) if acc is None else acc

    def add(self, weights: torch.Tensor, rows: tuple[int, int], cols: tuple[int, int]) -> None:
        """weights [h, r, c] of query rows rows[0]..rows[1]-1 against keys cols[0]..cols[1]-1."""
        w = weights.to(device=self.acc.device, dtype=torch.float32)
        first_row, row_cuts = _cuts(self.row_cuts, *rows)
        first_col, col_cuts = _cuts(self.col_cuts, *cols)
        pooled = self._reduce(w, 1, row_cuts)  # [h, R', c]
        pooled = self._reduce(pooled, 2, col_cuts)  # [h, R', C']
        into = self.acc[:, first_row : first_row + pooled.shape[1], first_col : first_col + pooled.shape[2]]
        if self.reduce == "max":
            torch.maximum(into, pooled, out=into)
        else:
            into.add_(pooled)

    def _reduce(self, w: torch.Tensor, dim: int, cuts: list[int]) -> torch.Tensor:
        """w pooled along `dim` (1 or 2) into the len(cuts) - 1 cells between the cuts (offsets into w)."""
        sizes = [b - a for a, b in zip(cuts, cuts[1:], strict=False)]
        if max(sizes) == 1:
            return w
        if min(sizes) == max(sizes):
            grouped = w.unflatten(dim, (len(sizes), sizes[0]))
            return grouped.amax(dim + 1) if self.reduce == "max" else grouped.sum(dim + 1)
        if dim == 1:  # a row block spans few cells: one reduction each, along contiguous keys
            parts = [w[:, a:b] for a, b in zip(cuts, cuts[1:], strict=False)]
            return torch.stack([p.amax(1) if self.reduce == "max" else p.sum(1) for p in parts], dim=1)
        bins = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes)).to(w.device)
        how = "amax" if self.reduce == "max" else "sum"
        out = w.new_zeros(*w.shape[:2], len(sizes))
        return out.scatter_reduce_(2, bins.expand_as(w), w, how)

    def fork(self) -> Pool:
        """An empty pool over the same cells, for blocks accumulated on another thread (merge)."""
        return Pool(self.acc.shape[0], self.row_edges, self.col_edges, self.reduce)

    def merge(self, other: Pool) -> None:
        """Add what `other` (a fork) pooled: cells are max'ed or summed, in any order."""
        if self.reduce == "max":
            torch.maximum(self.acc, other.acc, out=self.acc)
        else:
            self.acc.add_(other.acc)

    def result(self) -> Pooled:
        """The pooled cells; "mean" divides them in place (into acc) by each cell's area."""
        values = self.acc
        if self.reduce == "mean":
            values.div_(self.row_edges.diff().view(-1, 1) * self.col_edges.diff().view(1, -1))
        return Pooled(values, self.row_edges.tolist(), self.col_edges.tolist(), self.reduce)


def _cuts(boundaries: list[int], lo: int, hi: int) -> tuple[int, list[int]]:
    """(index of the cell holding token lo, offsets from lo of where lo..hi-1 crosses cell boundaries,
    0 and hi - lo included)."""
    first = bisect.bisect_right(boundaries, lo) - 1
    last = bisect.bisect_left(boundaries, hi)
    return first, [0, *(b - lo for b in boundaries[first + 1 : last]), hi - lo]


def check_reduce(reduce: str) -> None:
    if reduce not in REDUCTIONS:
        raise ValueError(f"reduce must be one of {', '.join(REDUCTIONS)}, got {reduce!r}")
