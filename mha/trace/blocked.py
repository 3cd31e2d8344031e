"""Attention of long inputs without ever holding [L, H, n, n].

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

    trace = model.trace(text)                    # mha.loading.pretrained.AttentionModel.trace
    trace.overview(size=128, reduce="max")       # Pooled: values [L, H, s, s], s = min(size, n)
    trace.window(layer, head, rows=(q0, q1), cols=(k0, k1), max_cells=512, reduce="max")
    trace.row(layer, head, q)                    # [n], one query's exact weights

Pooling is declared: "max" keeps a single sharp spike visible, "mean" keeps mass (a block's mean over
all its cells, masked ones counting as zero). Block edges are deterministic, `edges(lo, hi, cells)`, and
travel with every pooled result so a page can label its axes.
"""

from __future__ import annotations

import bisect
import math
import mmap
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import wait
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal, TypeVar, cast

import torch

from mha._threads import one_thread_each
from mha.core.attention import attention_scores, band_keep
from mha.core.config import TransformerConfig
from mha.core.layers import Block
from mha.core.multihead import MultiHeadAttention
from mha.errors import Cancelled
from mha.networks.model import Transformer
from mha.networks.result import ModelInfo
from mha.text.tokenize import Encoded
from mha.trace.fused import Kernel, LseOverview, fused_attention, fused_kernel
from mha.trace.memory import forward_scratch, objects_nbytes, python_nbytes

__all__ = [
    "BLOCKED",
    "OVERVIEW_SIZE",
    "REDUCTIONS",
    "ROW_BLOCK",
    "LayerTrace",
    "Pooled",
    "Trace",
    "bytes_per_token",
    "edges",
    "expected_nbytes",
    "forward_rows",
    "kept_buffers",
    "peak_nbytes",
    "trace_forward",
]

Reduce = Literal["max", "mean"]
REDUCTIONS: tuple[Reduce, ...] = ("max", "mean")
# LayerTrace.path of a layer computed in row blocks by hand (the others name their fused kernel).
BLOCKED = "blocked"
# Whether a CPU trace that pools an overview runs the fused kernels (trace_forward(fused=None)). It does not:
# the overview pooled afterwards computes every score a second time, a GEMM half the kernel's own work,
# where the row blocks pool the scores they already hold. One SmolLM2-shaped layer at 8,192 tokens, one
# thread (docs/design.md): the kernel 1.67 s, its overview 0.99 s more, the row blocks with theirs 1.80 s.
FUSED_CPU_OVERVIEW = False
# Blocks per side of the overview pooled during the forward (Trace.first_overview).
OVERVIEW_SIZE = 128
# Query rows whose scores are alive at once in a window, a row or an overview recomputed from a trace: up
# to H·ROW_BLOCK·n floats (36 MiB for 9 heads at n = 8,192).
ROW_BLOCK = 128
# The forward's row blocks hold about this many scores per head (128 rows at n = 1,024, 64 at 2,048, 32
# from 4,096 on): each block's scores pass through five operations, cheaper while they stay in the CPU's
# cache (one SmolLM2-shaped layer at n = 8,192 on one thread: 1.56 s in blocks of 32 rows, 1.82 s of 128).
FORWARD_SCORES = 1 << 17


def forward_rows(n: int) -> int:
    """Query rows per block in a trace's forward for an n-token input: at most ROW_BLOCK, fewer from 2,048
    tokens on so a block's scores stay near FORWARD_SCORES per head, but at least 32 (fewer make the GEMMs
    narrow and the loop long)."""
    return min(ROW_BLOCK, max(32, FORWARD_SCORES // n))


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


class _Pool:
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

    def fork(self) -> _Pool:
        """An empty pool over the same cells, for blocks accumulated on another thread (merge)."""
        return _Pool(self.acc.shape[0], self.row_edges, self.col_edges, self.reduce)

    def merge(self, other: _Pool) -> None:
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


@dataclass
class LayerTrace:
    """What one layer keeps: q [H, n, D] and k [H_kv, n, D] as its scores read them (q/k-normed, rotated),
    each query row's log-sum-exp [H, n] of its masked scores, each key's value norm [H, n] (‖f_h(x_j)‖,
    mha.analysis.norms: what a window weighted by norm reads), and the sliding window it attends in; `path`
    is how its forward ran: a fused kernel's name (mha.trace.fused.FUSED_KERNELS) or BLOCKED."""

    q: torch.Tensor
    k: torch.Tensor
    lse: torch.Tensor
    window: int | None
    path: str = BLOCKED
    norms: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        kept = (self.q, self.k, self.lse) if self.norms is None else (self.q, self.k, self.lse, self.norms)
        return sum(t.numel() * t.element_size() for t in kept)


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
        return self.weights(layer, head, (q, q + 1), (0, self.n))[0, 0].to("cpu", torch.float32)

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
        _check_reduce(reduce)
        if max_cells < 1:
            raise ValueError(f"max_cells ({max_cells}) must be at least 1")
        rows, cols = self._span(rows, "rows"), self._span(cols, "cols")
        row_edges = edges(*rows, min(max_cells, rows[1] - rows[0]))
        col_edges = edges(*cols, min(max_cells, cols[1] - cols[0]))
        pool = _Pool(1, row_edges, col_edges, reduce)
        for start in range(rows[0], rows[1], ROW_BLOCK):
            block = (start, min(start + ROW_BLOCK, rows[1]))
            weights = self.weights(layer, head, block, cols)
            if weighting == "norm":
                weights = weights * cast(torch.Tensor, kept.norms)[head, cols[0] : cols[1]]
            pool.add(weights, block, cols)
        pooled = pool.result()
        return Pooled(pooled.values[0], pooled.row_edges, pooled.col_edges, reduce)

    def overview(self, size: int = OVERVIEW_SIZE, reduce: Reduce = "max") -> Pooled:
        """Every head block-pooled: values [L, H, s, s], s = min(size, n)."""
        _check_reduce(reduce)
        if size < 1:
            raise ValueError(f"size ({size}) must be at least 1")
        cells = min(size, self.n)
        first = self.first_overview
        if first is not None and first.reduce == reduce and len(first.row_edges) == cells + 1:
            return first
        cuts = edges(0, self.n, cells)
        values = torch.zeros(len(self.layers), self.layers[0].q.shape[0], cells, cells, dtype=torch.float32)
        for index, kept in enumerate(self.layers):
            pool = _Pool(kept.q.shape[0], cuts, cuts, reduce, acc=values[index])
            for start in range(0, self.n, ROW_BLOCK):
                block = (start, min(start + ROW_BLOCK, self.n))
                cols = _key_span(block, self.causal, kept.window, self.n)
                pool.add(self.weights(index, slice(None), block, cols), block, cols)
            pool.result()  # "mean": divided in place
        return Pooled(values, cuts.tolist(), cuts.tolist(), reduce)


def bytes_per_token(config: TransformerConfig, itemsize: int) -> int:
    """What one more token adds to a trace (LayerTrace): q [H, D] and k [H_kv, D] per layer, and each query's
    log-sum-exp and each key's value norm per layer and head, all `itemsize` bytes a value (the model's
    dtype)."""
    dim = config.head_dim or config.embed_dim // config.num_heads
    layers, heads, kv_heads = config.num_layers, config.num_heads, config.num_kv_heads or config.num_heads
    return layers * (heads + kv_heads) * dim * itemsize + 2 * layers * heads * itemsize  # lse, norms


def expected_nbytes(config: TransformerConfig, n: int, itemsize: int) -> int:
    """Trace.nbytes of an n-token input traced with the default overview, at most: its tensors exactly (per
    token, and the float32 overview L·H·s², s = min(OVERVIEW_SIZE, n)), and its tokens, per-token lists and
    text (mha.trace_memory.python_nbytes)."""
    overview = config.num_layers * config.num_heads * min(OVERVIEW_SIZE, n) ** 2 * 4
    return n * bytes_per_token(config, itemsize) + overview + python_nbytes(n)


def peak_nbytes(
    config: TransformerConfig, n: int, itemsize: int, *, threads: int = 1, overview_size: int = OVERVIEW_SIZE
) -> int:
    """The most an n-token trace_forward holds at once, at most: the trace it builds (expected_nbytes) and
    its scratch (mha.trace.memory.forward_scratch) on `threads` CPU threads (torch.get_num_threads())."""
    cells = min(overview_size, n)
    rows = forward_rows(n)
    scratch = forward_scratch(
        config, n, itemsize, rows=rows, threads=threads, cells=cells, scores=FORWARD_SCORES
    )
    return expected_nbytes(config, n, itemsize) + scratch


def _check_reduce(reduce: str) -> None:
    if reduce not in REDUCTIONS:
        raise ValueError(f"reduce must be one of {', '.join(REDUCTIONS)}, got {reduce!r}")


def _key_span(rows: tuple[int, int], causal: bool, window: int | None, n: int) -> tuple[int, int]:
    """The keys any of these query rows can see: in a decoder none after the last row, and with a sliding
    window none before the first row's window."""
    lo = max(0, rows[0] - window + 1) if window is not None else 0
    return lo, rows[1] if causal else n


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
    return _mask_(weights, rows, cols, trace.causal, window, 0.0)


def _mask_(
    scores: torch.Tensor,
    rows: tuple[int, int],
    cols: tuple[int, int],
    causal: bool,
    window: int | None,
    value: float,
    keeps: dict[tuple[int, int, int], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Fill scores [..., r, c] of query rows rows[0]..rows[1]-1 against keys cols[0]..cols[1]-1 with
    `value` where the band masks them, touching only the key columns some of these rows mask: in a decoder
    those after the first row, with a window those before the last row's window. A row block far from the
    diagonal is thus never passed over. `keeps` caches the band's masks: they depend only on where the
    columns lie relative to the first row (the band is shift-invariant), which a forward's equal blocks
    repeat."""
    spans = []
    if window is not None:
        spans.append((cols[0], min(cols[1], rows[1] - window)))
    if causal:
        spans.append((max(cols[0], rows[0] + 1), cols[1]))
    if len(spans) == 2 and spans[0][1] >= spans[1][0]:
        spans = [(spans[0][0], spans[1][1])]
    for lo, hi in spans:
        if lo < hi:
            shape = (rows[1] - rows[0], lo - rows[0], hi - rows[0])
            keep = None if keeps is None else keeps.get(shape)
            if keep is None:
                keep = band_keep((0, shape[0]), shape[1:], causal=causal, window=window, device=scores.device)
                assert keep is not None  # causal or windowed, or there would be no span
                keep = ~keep
                if keeps is not None:
                    keeps[shape] = keep
            scores[..., lo - cols[0] : hi - cols[0]].masked_fill_(keep, value)
    return scores


def _threads(blocks: int, device: torch.device) -> int:
    """The CPU threads to deal `blocks` row blocks out to: torch's, where each gets at least two, else 1."""
    threads = torch.get_num_threads()
    return threads if threads > 1 and blocks >= 2 * threads and device.type == "cpu" else 1


T = TypeVar("T")


def _deal(work: Callable[[int, Iterator[T]], None], blocks: Sequence[T], threads: int) -> None:
    """work(i, its blocks) for each i < threads on its own CPU thread, torch on one thread in each
    (mha._threads); each thread's iterator hands it the next block when it asks, the last first.

    Each thread runs its blocks alone, as SDPA's kernel gives each thread its own tiles: a block's dozen
    operations, each split across the threads, made as many barriers where a thread descheduled by a busy
    machine stalls the other. Handed out one at a time, a descheduled thread holds back only the block it
    is in, not a fixed share; the last blocks first, as a decoder's see the most keys."""
    lock, left = threading.Lock(), list(blocks)

    def take() -> Iterator[T]:
        while True:
            with lock:
                if not left:
                    return
                block = left.pop()
            yield block

    with one_thread_each(threads) as workers:
        done = [workers.submit(work, i, take()) for i in range(threads)]
        wait(done)  # all finished before an error is raised or the threads restored
        for future in done:
            future.result()


@dataclass
class _Rows:
    """One layer's forward in row blocks: its q [H, n, D], k and v [H_kv, n, D], and what the blocks write
    into their own rows: each row's top score and largest weight [H, n], and the mixed values [H, n, D]."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    top: torch.Tensor
    peak: torch.Tensor
    out: torch.Tensor | None
    block: int


class _Recorder:
    """Runs one layer's self-attention (Block's `attention` hook), fused or in row blocks, and keeps its
    LayerTrace."""

    def __init__(
        self,
        attn: MultiHeadAttention,
        rotary: tuple[torch.Tensor, torch.Tensor] | None,
        causal: bool,
        window: int | None,
        pool: _Pool | None,
        values: bool,
        into: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
        kernel: Kernel | None = None,
    ) -> None:
        self.attn, self.rotary, self.causal, self.window = attn, rotary, causal, window
        self.pool, self.values, self.kernel = pool, values, kernel
        self.into = into  # where this layer's q [H, n, D], k [H_kv, n, D], lse and norms [H, n] are kept
        self.kept: LayerTrace | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        attn = self.attn
        # (1, H, n, D), (1, H_kv, n, D) x 2
        q_heads, k_heads, v_heads = attn.heads(x, x, x, True, self.rotary)
        # Copied into the trace's buffer (kept_buffers) and v made contiguous: the GEMMs below read whole
        # rows, and a kept view would hold the fused projection (v included) alive with it.
        q, k, lse, norms = self.into
        q.copy_(q_heads[0])
        k.copy_(k_heads[0])
        v = v_heads[0].contiguous()
        del q_heads, k_heads, v_heads
        norms.copy_(attn.value_norms(v[None])[0])  # what a window weighted by norm reads
        heads, n, _ = q.shape
        # Grad and inference mode are per thread: the blocks take the caller's (an inference tensor is
        # updated in place only in inference mode), on whichever thread they run.
        inference = torch.is_inference_mode_enabled()
        if self.kernel is not None:
            causal, scale = self.causal, attn.scale
            fused = fused_attention(self.kernel, q[None], k[None], v[None], causal=causal, scale=scale)
            if fused is not None:
                del v
                return self._fused(x, *fused, self.kernel, inference)
        out = q.new_empty(heads, n, v.shape[-1]) if self.values else None
        run = _Rows(q, k, v, lse, q.new_empty(heads, n), out, forward_rows(n))
        starts = list(range(0, n, run.block))
        threads = _threads(len(starts), q.device)
        if threads == 1:
            self._blocks(run, starts, self.pool, inference)
        else:
            pools = [self.pool] + [self.pool and self.pool.fork() for _ in range(threads - 1)]
            _deal(lambda i, mine: self._blocks(run, mine, pools[i], inference), starts, threads)
            # Each fork ([H, s, s] float32) freed once merged, before out_proj allocates.
            while self.pool is not None and len(pools) > 1:
                self.pool.merge(cast("_Pool", pools.pop()))
            del pools
        # lse = top + log(sum) = top - log(largest weight): that weight is the top score's, exp(0) / sum.
        # run.top is lse's buffer: the subtraction leaves the lse there.
        self.kept = LayerTrace(q=q, k=k, lse=run.top.sub_(run.peak.log_()), window=self.window, norms=norms)
        if out is None:
            return x  # the last layer: nothing reads its output
        return attn.out_proj(out.transpose(0, 1).reshape(1, n, heads * v.shape[-1]))

    def _fused(
        self, x: torch.Tensor, out: torch.Tensor, fused_lse: torch.Tensor, kernel: Kernel, inference: bool
    ) -> torch.Tensor:
        """Keep a fused kernel's lse (1, H, n), pool the overview from q, k and lse (mha.trace.fused), and
        project the kernel's output (1, H, n, D)."""
        q, k, lse, norms = self.into
        lse.copy_(fused_lse[0])
        del fused_lse
        heads, n, dim = q.shape
        if self.pool is not None:
            pool = self.pool
            overview = LseOverview(
                q, k, lse, pool.acc, pool.row_cuts, self.attn.scale, self.causal, scores=FORWARD_SCORES
            )
            blocks = overview.blocks(forward_rows(n))
            threads = _threads(len(blocks), q.device)
            if threads == 1:
                self._pool_blocks(overview, blocks, inference)
            else:
                _deal(lambda _, mine: self._pool_blocks(overview, mine, inference), blocks, threads)
            overview.finish()
        self.kept = LayerTrace(q=q, k=k, lse=lse, window=self.window, path=kernel, norms=norms)
        if not self.values:
            return x  # the last layer: nothing reads its output
        # The CPU kernel's output is laid out (1, n, H, D) under its (1, H, n, D) strides: a view here.
        return self.attn.out_proj(out.transpose(1, 2).reshape(1, n, heads * dim))

    def _pool_blocks(self, overview: LseOverview, blocks: Iterable[tuple[int, int]], inference: bool) -> None:
        """The overview's row blocks `blocks`, on whichever thread, in the caller's inference mode."""
        with torch.no_grad(), torch.inference_mode(inference):
            overview.run(blocks)

    def _blocks(self, run: _Rows, starts: Iterable[int], pool: _Pool | None, inference: bool) -> None:
        """The row blocks starting at `starts`, each written into its rows of run's top, peak and out."""
        attn, q, k, v = self.attn, run.q, run.k, run.v
        heads, n, dim = q.shape
        kv_heads = k.shape[0]
        group = heads // kv_heads
        keeps: dict[tuple[int, int, int], torch.Tensor] = {}
        with torch.no_grad(), torch.inference_mode(inference):
            for start in starts:
                rows = (start, min(start + run.block, n))
                cols = _key_span(rows, self.causal, self.window, n)
                r, c = rows[1] - rows[0], cols[1] - cols[0]
                # (H_kv, G·r, D) against (H_kv, c, D): one GEMM per key head serves its G query heads, and
                # neither k nor v is ever repeated per group.
                grouped = q[:, rows[0] : rows[1]].reshape(kv_heads, group * r, dim)
                scores = attention_scores(
                    grouped, k[:, cols[0] : cols[1]], scale=attn.scale, softcap=attn.softcap
                ).view(heads, r, c)
                # Every row keeps its own token: no row is empty, so -inf never makes a NaN.
                _mask_(scores, rows, cols, self.causal, self.window, float("-inf"), keeps)
                # Two vectorised max passes (the row's top score, then its largest weight) cost a tenth
                # of an argmax and a gather.
                torch.amax(scores, dim=-1, out=run.top[:, rows[0] : rows[1]])
                weights = torch.softmax(scores, dim=-1, out=scores)  # one fused pass, in place
                torch.amax(weights, dim=-1, out=run.peak[:, rows[0] : rows[1]])
                if pool is not None:
                    pool.add(weights, rows, cols)
                if run.out is not None:
                    mixed = torch.bmm(weights.view(kv_heads, group * r, c), v[:, cols[0] : cols[1]])
                    run.out[:, rows[0] : rows[1]] = mixed.view(heads, r, -1)
                    del mixed
                # Freed now, not when the next block's scores replace them: one block alive a thread.
                del scores, weights


def kept_buffers(
    config: TransformerConfig, n: int, dtype: torch.dtype, device: torch.device, cells: int | None
) -> tuple[list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]], torch.Tensor | None]:
    """Every layer's q [H, n, D], k [H_kv, n, D], lse [H, n] and value norms [H, n] in `dtype`, and the
    zeroed float32 overview [L, H, s, s] (s = cells; None: none): views into one buffer, all that a trace
    keeps. On the CPU the buffer is an anonymous memory map of its own, so a freed trace's pages go straight
    back to the system, and the forward's short-lived scratch never lies between them in the C heap (where
    the holes it left stayed resident: glibc serves allocations under 32 MiB from its arenas once large ones
    were freed)."""
    heads, kv_heads = config.num_heads, config.num_kv_heads or config.num_heads
    dim = config.head_dim or config.embed_dim // heads
    itemsize = torch.empty((), dtype=dtype).element_size()
    shapes = [(heads, n, dim), (kv_heads, n, dim), (heads, n), (heads, n)]  # q, k, lse, norms
    layer_bytes = sum(math.prod(shape) for shape in shapes) * itemsize
    # The overview first: float32 at offset 0, then values of <= 4 bytes at multiples of their size.
    overview_bytes = 0 if cells is None else config.num_layers * heads * cells * cells * 4
    total = overview_bytes + config.num_layers * layer_bytes
    if device.type == "cpu":
        buffer = torch.frombuffer(mmap.mmap(-1, total), dtype=torch.uint8)  # zeros, paged in as written
    else:
        buffer = torch.zeros(total, dtype=torch.uint8, device=device)
    overview = None
    if cells is not None:
        overview = buffer[:overview_bytes].view(torch.float32).view(config.num_layers, heads, cells, cells)
    layers, offset = [], overview_bytes
    for _ in range(config.num_layers):
        views = []
        for shape in shapes:
            size = math.prod(shape) * itemsize
            views.append(buffer[offset : offset + size].view(dtype).view(shape))
            offset += size
        layers.append((views[0], views[1], views[2], views[3]))
    return layers, overview


def trace_forward(
    network: Transformer,
    input_ids: torch.Tensor,
    *,
    segment_ids: torch.Tensor | None = None,
    overview_size: int | None = OVERVIEW_SIZE,
    cancel: Callable[[], bool] | None = None,
    fused: bool | None = None,
) -> tuple[list[LayerTrace], Pooled | None]:
    """One sequence's forward (input_ids (1, n)): every layer's LayerTrace, and the max-pooled overview of
    every head at `overview_size` (None: none).

    With `fused`, a layer that a fused kernel computes exactly (mha.trace.fused) runs it, and its overview
    is pooled afterwards from q, k and lse; the other layers, or all with fused=False, run in row blocks
    and pool the overview from the weights as they pass. fused=None chooses by the device: fused, except
    on the CPU when an overview is pooled, where the blocked path is the cheaper (FUSED_CPU_OVERVIEW)."""
    cfg = network.config
    if input_ids.ndim != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"a trace is of one sequence: input_ids (1, n), got {tuple(input_ids.shape)}")
    n = input_ids.shape[1]
    if n > cfg.max_tokens:
        raise ValueError(f"input length ({n}) exceeds the model's maximum ({cfg.max_tokens})")
    position_ids = network.position_ids(input_ids)
    windowed = set(cfg.window_layers)
    layers: list[LayerTrace] = []
    cuts = None if overview_size is None else edges(0, n, min(overview_size, n))
    with torch.no_grad():
        x = network.embeddings(input_ids, position_ids, segment_ids)
        if fused is None:
            fused = x.device.type != "cpu" or cuts is None or FUSED_CPU_OVERVIEW
        rotary = network.rotary(position_ids, x.dtype)
        # Every layer's pool writes its slice of the overview: never stacked from per-layer copies.
        into, overview = kept_buffers(cfg, n, x.dtype, x.device, None if cuts is None else len(cuts) - 1)
        last = len(network.layers) - 1
        for i, layer in enumerate(cast("list[Block]", network.layers)):
            if cancel is not None and cancel():
                raise Cancelled(f"trace cancelled before layer {i} of {len(network.layers)}")
            pool = None
            if overview is not None and cuts is not None:
                pool = _Pool(cfg.num_heads, cuts, cuts, "max", acc=overview[i])
            window = cfg.sliding_window if i in windowed else None
            kernel = None
            if fused:
                kernel = fused_kernel(
                    device=x.device,
                    dtype=x.dtype,
                    head_dim=layer.attn.head_dim,
                    softcap=layer.attn.softcap,
                    window=window,
                    n=n,
                    biased=network.relative_bias is not None,
                )
            recorder = _Recorder(
                layer.attn, rotary, cfg.causal, window, pool, values=i < last, into=into[i], kernel=kernel
            )
            if i < last:
                x = layer(x, None, rotary=rotary, need_weights=False, weights_out=None, attention=recorder)[0]
            else:
                # Only q and k matter in the last layer: its value path and feed-forward feed nothing.
                recorder(layer.attn_norm(x) if layer.pre_norm else x)
            assert recorder.kept is not None
            layers.append(recorder.kept)
    if overview is None or cuts is None:
        return layers, None
    # Pooled values live on the CPU (an accelerator pooled them where the scores were: one copy here).
    return layers, Pooled(overview.cpu(), cuts.tolist(), cuts.tolist(), "max")
