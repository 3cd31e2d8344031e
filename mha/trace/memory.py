"""What a trace (mha.trace.blocked) holds, counted: the kept objects, and the scratch its forward allocates.

A trace keeps q, k and the log-sum-exp of every layer and its pooled overview (`Trace.nbytes`), and while
its forward runs it also holds one layer's activations and, on each CPU thread, one row block's scores (the
blocked path) or one tile of the overview's scores (the fused path, mha.trace.fused).
The service admits a trace by the sum (`mha.trace.blocked.peak_nbytes`), so these bounds are what make the
memory row for traces (docs/memory-and-load.md) hold; tests/mha/test_trace_memory.py measures every
allocation a forward makes against them.

Shape legend: L layers, H query heads, H_kv key/value heads, D head dim, E embed dim, F feed-forward width,
n tokens, r a forward block's rows, s the overview's cells per side, w its widest cell's tokens, T CPU
threads.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from mha.core.config import TransformerConfig

__all__ = [
    "PYTHON_BYTES",
    "PYTHON_BYTES_PER_TOKEN",
    "forward_scratch",
    "fused_scratch",
    "objects_nbytes",
    "python_nbytes",
]

# A trace's Python objects, at most: its token strings, the encoding's per-token lists (ids, offsets,
# sources, ...) and its text took 220-410 bytes a token with the test families' tokenizers (BERT's
# WordPiece to Llama's byte-level BPE; English, Japanese, emoji), plus ~1.1 KB however short the input
# (the Encoded object, its lists' and tuples' own headers).
PYTHON_BYTES_PER_TOKEN = 512
PYTHON_BYTES = 2048
# Tensors of a forward whose size does not grow with n (scalars, the rotary frequencies [D / 2]), at most.
SMALL = 4096
# torch computes RMSNorm (mha.core.norm) and the overview's pooling in float32 whatever the model's dtype.
FLOAT32 = 4
# torch's CPU flash kernel (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp) splits queries into blocks of
# at most 256 rows and keys into blocks of at most 512, and allocates on each thread a float32 buffer of
# q_split·kv_split + 2·q_split + q_split·D values, and a q_split·kv_split one in a half-precision dtype. No
# operator returns them, so tests/mha/test_trace_memory.py cannot see them: declared here.
FLASH_Q_SPLIT, FLASH_KV_SPLIT = 256, 512


def objects_nbytes(*roots: Any) -> int:
    """sys.getsizeof of every object reachable from `roots` through lists, tuples and dataclass fields,
    each counted once: a trace's tokens and its encoding's per-token lists and texts."""
    seen: set[int] = set()
    total, todo = 0, list(roots)
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, list | tuple):
            todo.extend(obj)
        elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            todo.extend(getattr(obj, f.name) for f in dataclasses.fields(obj))
    return total


def python_nbytes(n: int) -> int:
    """What an n-token trace's Python objects take, at most (PYTHON_BYTES_PER_TOKEN)."""
    return PYTHON_BYTES + n * PYTHON_BYTES_PER_TOKEN


def forward_scratch(
    config: TransformerConfig, n: int, itemsize: int, *, rows: int, threads: int, cells: int, scores: int
) -> int:
    """Bytes mha.trace.blocked.trace_forward holds at once beyond the trace it builds, at most, for an n-token
    input in blocks of `rows` query rows on `threads` CPU threads, pooling an s x s overview (s = cells).

    A layer's activations, per token, each value in the model's dtype or float32 where wider (norms):
    - the feed-forward: the residual stream entering the layer and leaving its attention, the norm, and
      the sub-layer's output or the sum (4 E), beside the input projection (2 F gated, gate and up in one
      matmul; F plain) and the activation's output (F);
    - the attention, rotating q: the stream entering the layer and its norm (2 E), the q/k/v projection
      (H + 2 H_kv)·D, q's product with cos, the rotated half times sin and their sum (3 H·D), and where q
      and k are normed first (Qwen3) the normed q and k beside them;
    - the attention's out_proj: the same 2 E, v's contiguous copy H_kv·D, the heads' output H·D, its
      reshaped copy H·D and the projection E, and each row's top score and largest weight (2 H);
    - the attention's row blocks: the same 2 E, v, the heads' output and the 2 H; and on each thread one
      block's scores [H, r, n] (with a
      float32 copy for the pool unless they are float32), its mixed values [H, r, D], its rows pooled
      into at most R' cells [H, R', n] float32 twice over (each cell's reduction, then their stack), and
      the band masks (a byte a cell); each thread past the first pools into its own float32 [H, s, s].
    - or, fused (fused_scratch), the fused kernel's or the overview's, whichever a layer runs.
    The largest of these, plus what every layer reads: the rotary cos and sin (2 D a token, for each table:
    two where the window layers have a rope of their own, Gemma 3) and the position ids (int64, and each
    table's angles' float32 row: 16 bytes a token, 4 more a second table), and SMALL for what does not
    grow with n (scalars, the rotary frequencies).
    """
    heads, kv_heads = config.num_heads, config.num_kv_heads or config.num_heads
    dim = config.head_dim or config.embed_dim // heads
    embed, width = config.embed_dim, config.ffn_dim
    value = max(itemsize, FLOAT32)
    ffn = 4 * embed + (2 if config.mlp == "gated" else 1) * width + width
    attention = 2 * embed + (heads + 2 * kv_heads) * dim + 3 * heads * dim
    if config.qk_norm:
        attention += (heads + kv_heads) * dim
    out_proj = 3 * embed + kv_heads * dim + 2 * heads * dim + 2 * heads
    beside_blocks = 2 * embed + kv_heads * dim + heads * dim + 2 * heads
    rows = min(rows, n)  # a block is never longer than the input
    # A block of r rows spans at most r / (n // s) + 2 overview cells; one token a cell (n <= s) pools
    # nothing, so no copy is made.
    pooled_rows = 0 if n <= cells else min(rows, rows // (n // cells) + 2)
    # Blocks are dealt out to the threads only when each gets two (mha.trace.blocked._Recorder), else one runs
    # all.
    if -(-n // rows) < 2 * threads:
        threads = 1
    block = heads * rows * n * (itemsize + (0 if itemsize == FLOAT32 else FLOAT32))
    block += heads * rows * dim * itemsize + 2 * heads * pooled_rows * n * FLOAT32 + rows * n
    blocks = n * value * beside_blocks + threads * block + (threads - 1) * heads * cells * cells * FLOAT32
    fused = fused_scratch(config, n, itemsize, rows=rows, threads=threads, cells=cells, scores=scores)
    # The value norms a layer keeps (MultiHeadAttention.value_norms) are formed once q, k and v are in
    # place, the projection and its rotation freed: a block of at most min(n, NORMS_BLOCK_VALUES / H·D)
    # keys' R_h v (no more values than q), its einsum's copy and the [H, n] norms: within `attention`'s
    # 3 H·D + (H + 2 H_kv)·D a token, which were freed for them.
    tables = 1 if config.local_rope is None else 2
    rotary = n * (tables * value * 2 * dim + 12 + 4 * tables)
    return max(n * value * max(ffn, attention, out_proj), blocks, fused) + rotary + SMALL


def fused_scratch(
    config: TransformerConfig, n: int, itemsize: int, *, rows: int, threads: int, cells: int, scores: int
) -> int:
    """Bytes a layer of the fused path (mha.trace.fused) holds at once beside the trace, at most, the layer's
    projections and out_proj aside (forward_scratch counts those for both paths):
    - the kernel: the stream entering the layer and its norm (2 E), v's contiguous copy H_kv·D, the output
      H·D and the float32 lse (H) a token; on CUDA, where k and v are repeated to the query heads, 2 H·D
      more; and on each CPU thread the kernel's own buffers (FLASH_Q_SPLIT);
    - the overview: the same 2 E and the output, and on each thread one tile of r rows (whole cells of w
      tokens: about `rows`, at least one cell) against c keys (whole cells, about `scores` / r): its q
      gathered (H·r·D) and −lse (twice H·r), the scores H·r·c, the diagonal's mask (a byte a score), the
      rows pooled H·(r / w)·c and the cells pooled, k gathered where cells are uneven (H_kv·c·D), and
      int64 token indices (r + c per tile, s·w for the layer).
    """
    heads, kv_heads = config.num_heads, config.num_kv_heads or config.num_heads
    dim = config.head_dim or config.embed_dim // heads
    embed, value = config.embed_dim, max(itemsize, FLOAT32)
    repeated = 2 * heads * dim if kv_heads < heads else 0
    kernel = n * (value * (2 * embed + kv_heads * dim + heads * dim) + FLOAT32 * heads + itemsize * repeated)
    q_split, kv_split = min(FLASH_Q_SPLIT, n), min(FLASH_KV_SPLIT, n)
    workspace = FLOAT32 * (q_split * kv_split + 2 * q_split + q_split * dim) + itemsize * q_split * kv_split
    cells = min(cells, n)
    width = -(-n // cells)  # the widest cell's tokens
    r = min(max(1, rows // width), cells) * width  # a block is never more than every cell
    c = min(max(1, scores // (r * width)) * width, cells * width)
    tile = value * (heads * r * dim + 2 * heads * r + heads * r * c + heads * (r // width) * c)
    tile += r * c + value * (heads * (r // width) * (c // width) + kv_heads * c * dim) + 8 * (r + c)
    if -(-cells // (r // width)) < 2 * threads:  # dealt out only where each thread gets two blocks
        threads = 1
    overview = n * value * (2 * embed + heads * dim) + threads * tile + 8 * cells * width
    return max(kernel + threads * workspace, overview)
