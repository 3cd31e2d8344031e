"""A trace's fused path: each layer's attention through one torch kernel that also returns every row's
log-sum-exp (lse), and the max-pooled overview recomputed afterwards from the kept q, k and lse.

mha.trace.blocked keeps, per layer, the post-rotary q and k and each query row's lse; any weight is then
exp(q·kᵀ·scale − lse). Where a fused kernel computes the layer exactly as `attend` does (no soft-cap, no
sliding window shorter than the input, no logit bias), it gives the lse at the cost of a blind forward:

    CPU                      aten._scaled_dot_product_flash_attention_for_cpu (grouped heads as they are)
    CUDA, float32            aten._scaled_dot_product_efficient_attention(compute_log_sumexp=True)
    CUDA, float16/bfloat16   aten._scaled_dot_product_flash_attention
    (docs/benchmarks.md has the CUDA kernels measured on an H200; the CUDA branch has not run on a GPU here)

The overview's max needs no softmax: the max over a cell of exp(s − lse) is exp of the max over the cell of
s − lse, so a block of scores is reduced to its cells and only the cells are exponentiated. The overview's
cells are whole row blocks (a cell's rows are never split between two threads), and where the cells are of
unequal width (n not a multiple of the overview size) each cell's last token is repeated up to the widest
cell's width (`cell_tokens`), so every block is one reshape and reduction per axis: max is idempotent.

Shape legend: H query heads, H_kv key/value heads, G = H / H_kv, D head dim, n tokens, s cells per side,
w the widest cell's tokens, r a block's rows (whole cells), c a tile's keys (whole cells).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import torch

__all__ = ["FUSED_KERNELS", "LseOverview", "cell_tokens", "fused_attention", "fused_kernel", "scores_fit"]

log = logging.getLogger(__name__)

Kernel = Literal["fused-flash-cpu", "fused-efficient-cuda", "fused-flash-cuda"]
FUSED_KERNELS: tuple[Kernel, ...] = ("fused-flash-cpu", "fused-efficient-cuda", "fused-flash-cuda")
# CUDA's flash kernel (FlashAttention 2) takes half precision only, head dims up to 256 in multiples of 8.
_FLASH_CUDA_DTYPES = (torch.float16, torch.bfloat16)
_FLASH_CUDA_MAX_DIM = 256


def fused_kernel(
    *,
    device: torch.device,
    dtype: torch.dtype,
    head_dim: int,
    softcap: float | None,
    window: int | None,
    n: int,
    biased: bool,
) -> Kernel | None:
    """The fused kernel that computes this layer exactly as `attend`, or None (the blocked path): none
    takes a soft-cap (Gemma 2) or a logit bias (T5's relative positions), and a sliding window that hides
    keys (W < n: query i keeps keys j > i - W) would need an n x n mask."""
    if softcap is not None or biased or (window is not None and window < n):
        return None
    if device.type == "cpu":
        return "fused-flash-cpu"
    if device.type != "cuda":
        return None
    if dtype in _FLASH_CUDA_DTYPES and head_dim % 8 == 0 and head_dim <= _FLASH_CUDA_MAX_DIM:
        return "fused-flash-cuda"
    if dtype in (torch.float32, *_FLASH_CUDA_DTYPES):
        return "fused-efficient-cuda"
    return None


def fused_attention(
    kernel: Kernel, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(output (1, H, n, D), lse (1, H, n) float32) of q (1, H, n, D) over k and v (1, H_kv, n, D), or
    None where a CUDA kernel refused the shapes or a score could overflow float32 (the caller runs the
    blocked path instead)."""
    if not scores_fit(q, k, scale):
        return None
    if kernel == "fused-flash-cpu":
        # Grouped heads as they are: query head h reads key head h // G, as repeat_interleave orders them.
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, causal, scale=scale
        )
        return out, lse
    # The CUDA kernels take as many key as query heads: k and v repeated (H·n·D each, small beside q·k).
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    n = q.shape[2]
    try:
        if kernel == "fused-flash-cuda":
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention(
                q, k, v, 0.0, causal, False, scale=scale
            )[:2]
            return out, lse
        out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, None, True, 0.0, causal, scale=scale
        )[:2]
        return out, lse[..., :n]  # the kernel pads lse's rows to a multiple of 32
    except torch.cuda.OutOfMemoryError:
        raise  # the blocked path would not fit either
    except RuntimeError as error:  # a GPU or shape the kernel does not support: the blocked path is exact
        log.warning("%s refused a layer (%s); it runs blocked", kernel, str(error).splitlines()[0])
        return None


def scores_fit(q: torch.Tensor, k: torch.Tensor, scale: float) -> bool:
    """Whether no score scale·q·k can overflow float32, where the kernels compute scores: a score is a sum
    of D products, so D·max|q|·max|k|·scale bounds every one (elementwise maxima are exact in any dtype,
    where a half-precision norm could overflow itself). Where one could overflow, the blocked path computes
    the scores and its lse shows it; a kernel's lse need not (the CPU kernel on an AVX-512 machine returned
    0 for rows of infinite scores). NaN in q or k fails the test too."""
    # aminmax, not vector_norm(ord=inf): ~20x faster on the CPU (0.09 against 1.6 ms for a 9 x 2048 x 64 q).
    tops = torch.stack([torch.stack(torch.aminmax(t)).abs().amax() for t in (q, k)]).double().tolist()
    # Half of float32's largest: the GEMM's rounding (relative ~D·2^-24) stays far inside.
    return bool(q.shape[-1] * tops[0] * tops[1] * scale < torch.finfo(torch.float32).max / 2)


def cell_tokens(cuts: list[int]) -> torch.Tensor | None:
    """[s, w] int64: the tokens of cell c (cuts[c] .. cuts[c + 1] - 1), its last one repeated up to the
    widest cell's w tokens; None when every cell is w tokens wide (slot i is token i)."""
    sizes = [b - a for a, b in zip(cuts, cuts[1:], strict=False)]
    if min(sizes) == max(sizes):
        return None
    starts, stops = torch.tensor(cuts[:-1]).view(-1, 1), torch.tensor(cuts[1:]).view(-1, 1)
    return torch.minimum(starts + torch.arange(max(sizes)).view(1, -1), stops - 1)


@dataclass
class LseOverview:
    """One layer's max-pooled overview [H, s, s] written into `acc` from its kept q [H, n, D], k [H_kv, n, D]
    and lse [H, n]: `blocks(rows)` splits it into row blocks of whole cells, `run(blocks)` computes them
    (any thread, any order: each writes only its own cells), `finish()` turns the cells into weights."""

    q: torch.Tensor
    k: torch.Tensor
    lse: torch.Tensor
    acc: torch.Tensor
    cuts: list[int]
    scale: float
    causal: bool
    # a tile's scores per head, about: what a forward block holds (mha.trace.blocked.FORWARD_SCORES)
    scores: int

    def __post_init__(self) -> None:
        self.cells, self.device = len(self.cuts) - 1, self.q.device
        slots = cell_tokens(self.cuts)
        self.slots = None if slots is None else slots.to(self.device)  # indices where they gather
        self.width = self.cuts[1] - self.cuts[0] if self.slots is None else self.slots.shape[1]
        # Cells never computed (a decoder's above the diagonal) are exp(-inf) = 0 once finished.
        self.acc.fill_(-math.inf)

    def blocks(self, rows: int) -> list[tuple[int, int]]:
        """Row blocks (first cell, last cell + 1) of about `rows` query rows each, at least one cell."""
        step = max(1, rows // self.width)
        return [(t, min(t + step, self.cells)) for t in range(0, self.cells, step)]

    def run(self, blocks: Iterable[tuple[int, int]]) -> None:
        for t0, t1 in blocks:
            self._block(t0, t1)

    def finish(self) -> None:
        self.acc.exp_()

    def _tokens(self, c0: int, c1: int) -> torch.Tensor:
        """The token of every slot of cells c0 .. c1 - 1, (c1 - c0)·w."""
        if self.slots is None:
            return torch.arange(c0 * self.width, c1 * self.width, device=self.device)
        return self.slots[c0:c1].flatten()

    def _take(self, t: torch.Tensor, c0: int, c1: int) -> torch.Tensor:
        """t [h, n, ...]'s slots of cells c0 .. c1 - 1: a slice, or the cells' tokens gathered."""
        if self.slots is None:
            return t[:, c0 * self.width : c1 * self.width]
        return t[:, self._tokens(c0, c1)]

    def _block(self, t0: int, t1: int) -> None:
        q, k, w = self.q, self.k, self.width
        heads, kv_heads, dim = q.shape[0], k.shape[0], q.shape[2]
        group, r = heads // kv_heads, (t1 - t0) * w
        # (H_kv, G·r, D): one GEMM per key head serves its G query heads; −lse rides in as the GEMM's C.
        q_block = self._take(q, t0, t1).reshape(kv_heads, group * r, dim)
        neg_lse = self._take(self.lse, t0, t1).neg().reshape(kv_heads, group * r, 1)
        last = t1 if self.causal else self.cells  # a decoder's rows see no key after their last cell
        step = max(1, self.scores // (r * w))
        for u0 in range(0, last, step):
            u1 = min(u0 + step, last)
            keys = self._take(k, u0, u1).transpose(1, 2)  # (H_kv, D, c)
            scores = torch.baddbmm(neg_lse, q_block, keys, alpha=self.scale).view(heads, r, -1)  # s − lse
            if self.causal and u1 > t0:  # the tile reaches the diagonal: keys after a row are masked
                d0 = max(u0, t0)
                after = self._tokens(d0, u1).view(1, -1) > self._tokens(t0, t1).view(-1, 1)
                scores[..., (d0 - u0) * w :].masked_fill_(after, -math.inf)
            # Rows first (an elementwise max of contiguous rows), then keys on data w times smaller.
            pooled = scores.view(heads, t1 - t0, w, -1).amax(2).view(heads, t1 - t0, u1 - u0, w).amax(-1)
            self.acc[:, t0:t1, u0:u1] = pooled
