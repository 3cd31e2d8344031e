"""A trace's forward: one pass over a long input that keeps, per layer, what any window of any head needs
to be recomputed exactly (LayerTrace: the post-rotary q and k of every head, each query row's log-sum-exp
of its masked scores, each key's value norm), in one buffer laid out up front (kept_buffers).

Each layer runs a fused kernel that returns the log-sum-exp beside its output (mha.trace.fused: torch's
flash kernel on the CPU, the memory-efficient or flash kernel on CUDA) where one computes it exactly as
`attend` does, and otherwise (Gemma 2's soft-cap, a sliding window shorter than the input) in row blocks
by hand, the blocked path, dealt out to the CPU's threads (mha._threads.deal); on the CPU the blocked path
also serves a trace that pools its overview (cheaper there: FUSED_CPU_OVERVIEW), pooling it from the
weights as they pass (mha.trace.overview). What a trace holds and its forward's peak are declared here
(bytes_per_token, expected_nbytes, peak_nbytes; the parts counted in mha.trace.memory). mha.trace.windows'
Trace keeps the result and reads windows, rows and overviews from it.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import cast

import torch

from mha._threads import deal
from mha.core.attention import attention_scores, band_keep
from mha.core.config import TransformerConfig
from mha.core.layers import Block
from mha.core.multihead import MultiHeadAttention
from mha.errors import Cancelled
from mha.networks.model import Transformer
from mha.trace.fused import Kernel, LseOverview, fused_attention, fused_kernel
from mha.trace.memory import forward_scratch, python_nbytes
from mha.trace.overview import OVERVIEW_SIZE, Pool, Pooled, edges

__all__ = [
    "BLOCKED",
    "FORWARD_SCORES",
    "ROW_BLOCK",
    "LayerTrace",
    "bytes_per_token",
    "expected_nbytes",
    "forward_rows",
    "kept_buffers",
    "key_span",
    "mask_band_",
    "peak_nbytes",
    "trace_forward",
]

# LayerTrace.path of a layer computed in row blocks by hand (the others name their fused kernel).
BLOCKED = "blocked"
# Whether a CPU trace that pools an overview runs the fused kernels (trace_forward(fused=None)). It does not:
# the overview pooled afterwards computes every score a second time, a GEMM half the kernel's own work,
# where the row blocks pool the scores they already hold. One SmolLM2-shaped layer at 8,192 tokens, one
# thread, as benchmarks/fused_trace.py --device cpu times them: the kernel 1.67 s, its overview 0.99 s
# more, the row blocks with theirs 1.80 s.
FUSED_CPU_OVERVIEW = False
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
    text (mha.trace.memory.python_nbytes)."""
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


def key_span(rows: tuple[int, int], causal: bool, window: int | None, n: int) -> tuple[int, int]:
    """The keys any of these query rows can see: in a decoder none after the last row, and with a sliding
    window none before the first row's window."""
    lo = max(0, rows[0] - window + 1) if window is not None else 0
    return lo, rows[1] if causal else n


def mask_band_(
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
        pool: Pool | None,
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
            deal(lambda i, mine: self._blocks(run, mine, pools[i], inference), starts, threads)
            # Each fork ([H, s, s] float32) freed once merged, before out_proj allocates.
            while self.pool is not None and len(pools) > 1:
                self.pool.merge(cast("Pool", pools.pop()))
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
                deal(lambda _, mine: self._pool_blocks(overview, mine, inference), blocks, threads)
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

    def _blocks(self, run: _Rows, starts: Iterable[int], pool: Pool | None, inference: bool) -> None:
        """The row blocks starting at `starts`, each written into its rows of run's top, peak and out."""
        attn, q, k, v = self.attn, run.q, run.k, run.v
        heads, n, dim = q.shape
        kv_heads = k.shape[0]
        group = heads // kv_heads
        keeps: dict[tuple[int, int, int], torch.Tensor] = {}
        with torch.no_grad(), torch.inference_mode(inference):
            for start in starts:
                rows = (start, min(start + run.block, n))
                cols = key_span(rows, self.causal, self.window, n)
                r, c = rows[1] - rows[0], cols[1] - cols[0]
                # (H_kv, G·r, D) against (H_kv, c, D): one GEMM per key head serves its G query heads, and
                # neither k nor v is ever repeated per group.
                grouped = q[:, rows[0] : rows[1]].reshape(kv_heads, group * r, dim)
                scores = attention_scores(
                    grouped, k[:, cols[0] : cols[1]], scale=attn.scale, softcap=attn.softcap
                ).view(heads, r, c)
                # Every row keeps its own token: no row is empty, so -inf never makes a NaN.
                mask_band_(scores, rows, cols, self.causal, self.window, float("-inf"), keeps)
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
        rotaries = network.rotaries(position_ids, x.dtype)
        # Every layer's pool writes its slice of the overview: never stacked from per-layer copies.
        into, overview = kept_buffers(cfg, n, x.dtype, x.device, None if cuts is None else len(cuts) - 1)
        last = len(network.layers) - 1
        for i, layer in enumerate(cast("list[Block]", network.layers)):
            if cancel is not None and cancel():
                raise Cancelled(f"trace cancelled before layer {i} of {len(network.layers)}")
            pool = None
            if overview is not None and cuts is not None:
                pool = Pool(cfg.num_heads, cuts, cuts, "max", acc=overview[i])
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
            rotary = rotaries[i]
            recorder = _Recorder(
                layer.attn, rotary, cfg.causal, window, pool, values=i < last, into=into[i], kernel=kernel
            )
            if i < last:
                x = layer(x, None, rotary=rotary, need_weights=False, attention=recorder)[0]
            else:
                # Only q and k matter in the last layer: its value path and feed-forward feed nothing.
                recorder(layer.attn_norm(x) if layer.pre_norm else x)
            assert recorder.kept is not None
            layers.append(recorder.kept)
    if overview is None or cuts is None:
        return layers, None
    # Pooled values live on the CPU (an accelerator pooled them where the scores were: one copy here).
    return layers, Pooled(overview.cpu(), cuts.tolist(), cuts.tolist(), "max")
