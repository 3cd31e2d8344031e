"""Attention of long inputs without ever holding [L, H, n, n]: `Trace`, and the windows, rows and overviews
recomputed from it.

One forward keeps per layer only what any window of any head needs to be recomputed exactly: the
post-rotary (post q/k-norm) q and k of every head, and each query row's log-sum-exp of its masked scores.
Each layer runs a fused kernel that returns the log-sum-exp beside its output (mha.trace.fused: torch's
flash kernel on the CPU, the memory-efficient or flash kernel on CUDA) where one computes it exactly as
`attend` does, and otherwise (Gemma 2's soft-cap, a sliding window shorter than the input) in row blocks
by hand, the blocked path, which on the CPU also serves a trace that pools its overview (cheaper there:
FUSED_CPU_OVERVIEW); `Trace.path` says which ran. Weight (i, j) is then exp(score(i, j) - lse(i)),
the identity FlashAttention is built on, so a window, a row or a pooled overview costs only its own cells:
memory per trace is O(L·(H + H_kv)·n·D), never O(L·H·n²). At 8,192 tokens on a SmolLM2-135M shape that
is 0.75 GB, against the 72 GB of every head's full matrix.

    trace = model.trace(text)                    # mha.model.attention_model.AttentionModel.trace
    trace.overview(size=128, reduce="max")       # Pooled: values [L, H, s, s], s = min(size, n)
    trace.window(layer, head, rows=(q0, q1), cols=(k0, k1), max_cells=512, reduce="max")
    trace.row(layer, head, q)                    # [n], one query's exact weights

The forward that builds a trace is mha.trace.blocked's (trace_forward); pooling, "max" or "mean", and the
block edges that travel with every pooled result are mha.trace.overview's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import cast

import torch

from mha._finite import refuse_non_finite
from mha.core.attention import attention_scores
from mha.core.layers import Block
from mha.networks.model import Transformer
from mha.networks.result import ModelInfo
from mha.text.tokenize import Encoded
from mha.trace.blocked import ROW_BLOCK, LayerTrace, key_span, mask_band_, trace_forward
from mha.trace.memory import objects_nbytes
from mha.trace.overview import OVERVIEW_SIZE, Pool, Pooled, Reduce, check_reduce, edges

__all__ = ["Trace"]


@dataclass
class Trace:
    """One input's forward, kept so any window of any head can be recomputed exactly (module docstring)."""

    encoded: Encoded
    tokens: list[str]
    info: ModelInfo
    layers: list[LayerTrace]
    scale: float
    softcap: float | None
    causal: bool
    first_overview: Pooled | None = field(default=None, repr=False)  # computed during the forward

    @classmethod
    def of(
        cls,
        network: Transformer,
        encoded: Encoded,
        tokens: list[str],
        info: ModelInfo,
        *,
        overview_size: int | None = OVERVIEW_SIZE,
        cancel: Callable[[], bool] | None = None,
        fused: bool | None = None,
    ) -> Trace:
        """Trace `encoded` (one text or pair, as the model is fed it) through `network` (trace_forward)."""
        device = next(network.parameters()).device
        ids = torch.tensor([encoded.ids], device=device)
        typed = network.config.type_vocab_size > 0
        segment_ids = torch.tensor([encoded.type_ids], device=device) if typed else None
        layers, overview = trace_forward(
            network, ids, segment_ids=segment_ids, overview_size=overview_size, cancel=cancel, fused=fused
        )
        # Every window, row and overview is recomputed from these: checked once here, so a model whose values
        # overflowed is refused before the trace is kept (its scores overflowing make a row's lse infinite).
        kept = [t for layer in layers for t in (layer.q, layer.k, layer.lse, layer.norms) if t is not None]
        refuse_non_finite(info.name, {"its trace": kept + ([] if overview is None else [overview.values])})
        attn = cast("Block", network.layers[0]).attn
        return cls(encoded, tokens, info, layers, attn.scale, attn.softcap, network.config.causal, overview)

    @property
    def n(self) -> int:
        return len(self.tokens)

    @property
    def path(self) -> str:
        """How the forward ran: one LayerTrace.path when every layer took it ("fused-flash-cpu",
        "fused-efficient-cuda", "fused-flash-cuda" or "blocked"), else each path in layer order joined by
        "+" (a model with a sliding window on some layers only)."""
        return "+".join(dict.fromkeys(layer.path for layer in self.layers))

    @cached_property
    def nbytes(self) -> int:
        """Bytes the trace holds, what a cache of traces budgets: every kept tensor's whole buffer (a view
        would count the buffer it keeps alive), the tokens, and the encoding's per-token lists and texts."""
        tensors = [
            t for layer in self.layers for t in (layer.q, layer.k, layer.lse, layer.norms) if t is not None
        ]
        if self.first_overview is not None:
            tensors.append(self.first_overview.values)
        buffers = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
        return sum(buffers.values()) + objects_nbytes(self.tokens, self.encoded)

    @property
    def norms(self) -> torch.Tensor:
        """[L, H, n] float32 on the CPU: each key's value norm ‖f_h(x_j)‖ per layer and head (attend's
        result.norms, mha.analysis.norms), kept by the forward at [L, H, n]."""
        return torch.stack([cast(torch.Tensor, layer.norms) for layer in self.layers]).to(
            "cpu", torch.float32
        )

    def _check(self, layer: int, head: int) -> LayerTrace:
        if not 0 <= layer < len(self.layers):
            raise IndexError(f"layer {layer} out of range: the model has {len(self.layers)} layers")
        heads = self.layers[layer].q.shape[0]
        if not 0 <= head < heads:
            raise IndexError(f"head {head} out of range: the model has {heads} heads")
        return self.layers[layer]

    def _span(self, span: tuple[int, int] | None, what: str) -> tuple[int, int]:
        lo, hi = (0, self.n) if span is None else (int(span[0]), int(span[1]))
        if not 0 <= lo < hi <= self.n:
            raise ValueError(f"{what} {lo}..{hi} is not a non-empty range within 0..{self.n}")
        return lo, hi

    def weights(
        self, layer: int, heads: slice | int, rows: tuple[int, int], cols: tuple[int, int]
    ) -> torch.Tensor:
        """Exact weights [h, r, c] of `heads` (query heads) for query rows rows[0]..rows[1]-1 against keys
        cols[0]..cols[1]-1, in the model's dtype on its device."""
        kept = self.layers[layer]
        picked = range(kept.q.shape[0])[heads] if isinstance(heads, slice) else range(heads, heads + 1)
        group = kept.q.shape[0] // kept.k.shape[0]
        q = kept.q[picked.start : picked.stop : picked.step, rows[0] : rows[1]]
        k = kept.k[[h // group for h in picked], cols[0] : cols[1]]
        lse = kept.lse[picked.start : picked.stop : picked.step, rows[0] : rows[1]]
        return _weights_from_lse(q, k, lse, rows, cols, self, kept.window)

    def row(self, layer: int, head: int, q: int) -> torch.Tensor:
        """Float32 [n] on the CPU: query q's exact weights over every key."""
        self._check(layer, head)
        if not 0 <= q < self.n:
            raise IndexError(f"query {q} out of range: the input has {self.n} tokens")
        return self._finite(self.weights(layer, head, (q, q + 1), (0, self.n))[0, 0].to("cpu", torch.float32))

    def window(
        self,
        layer: int,
        head: int,
        rows: tuple[int, int] | None = None,
        cols: tuple[int, int] | None = None,
        *,
        max_cells: int = 512,
        reduce: Reduce = "max",
        weighting: str = "weight",
    ) -> Pooled:
        """Weights of query rows rows[0]..rows[1]-1 against keys cols[0]..cols[1]-1 (default: all): exact
        (one token per cell) on each side no longer than max_cells, else block-pooled to max_cells.
        weighting "norm": α_ij ‖f_h(x_j)‖ instead (mha.analysis.weight_norm_map), from the kept norms."""
        kept = self._check(layer, head)
        if weighting not in ("weight", "norm"):
            raise ValueError(f'weighting must be "weight" or "norm", got {weighting!r}')
        check_reduce(reduce)
        if max_cells < 1:
            raise ValueError(f"max_cells ({max_cells}) must be at least 1")
        rows, cols = self._span(rows, "rows"), self._span(cols, "cols")
        row_edges = edges(*rows, min(max_cells, rows[1] - rows[0]))
        col_edges = edges(*cols, min(max_cells, cols[1] - cols[0]))
        pool = Pool(1, row_edges, col_edges, reduce)
        for start in range(rows[0], rows[1], ROW_BLOCK):
            block = (start, min(start + ROW_BLOCK, rows[1]))
            weights = self.weights(layer, head, block, cols)
            if weighting == "norm":
                weights = weights * cast(torch.Tensor, kept.norms)[head, cols[0] : cols[1]]
            pool.add(weights, block, cols)
        pooled = pool.result()
        return Pooled(self._finite(pooled.values[0]), pooled.row_edges, pooled.col_edges, reduce)

    def overview(self, size: int = OVERVIEW_SIZE, reduce: Reduce = "max") -> Pooled:
        """Every head block-pooled: values [L, H, s, s], s = min(size, n)."""
        check_reduce(reduce)
        if size < 1:
            raise ValueError(f"size ({size}) must be at least 1")
        cells = min(size, self.n)
        first = self.first_overview
        if first is not None and first.reduce == reduce and len(first.row_edges) == cells + 1:
            return first
        cuts = edges(0, self.n, cells)
        values = torch.zeros(len(self.layers), self.layers[0].q.shape[0], cells, cells, dtype=torch.float32)
        for index, kept in enumerate(self.layers):
            pool = Pool(kept.q.shape[0], cuts, cuts, reduce, acc=values[index])
            for start in range(0, self.n, ROW_BLOCK):
                block = (start, min(start + ROW_BLOCK, self.n))
                cols = key_span(block, self.causal, kept.window, self.n)
                pool.add(self.weights(index, slice(None), block, cols), block, cols)
            pool.result()  # "mean": divided in place
        return Pooled(self._finite(values), cuts.tolist(), cuts.tolist(), reduce)

    def _finite(self, values: torch.Tensor) -> torch.Tensor:
        """`values`, recomputed from a trace whose kept tensors were finite, unless a score that its forward
        held finite overflowed here (another order of summation): NonFiniteOutputError then, never NaN."""
        refuse_non_finite(self.info.name, {"its trace": [values]})
        return values


def _weights_from_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    lse: torch.Tensor,
    rows: tuple[int, int],
    cols: tuple[int, int],
    trace: Trace,
    window: int | None,
) -> torch.Tensor:
    scores = attention_scores(q, k, scale=trace.scale, softcap=trace.softcap)
    weights = scores.sub_(lse.unsqueeze(-1)).exp_()
    return mask_band_(weights, rows, cols, trace.causal, window, 0.0)
