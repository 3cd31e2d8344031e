"""What each head moves along its weights (Kobayashi et al. 2020): a key's value vector through one head's
slice of the output projection, f_h(x_j) = (x_j W_V^h + b_V^h) W_O^h, and the inner products and norms of
those vectors that attend(..., norms=True) and a trace keep (mha.analysis.norms reads them).

Shape legend: B batch, H query heads, H_kv key/value heads, G = H // H_kv, S keys, D head dim, E embed dim.
`out_weight` is out_proj's weight (E, H·D); a grouped-query head h reads value head h // G through its own
W_O^h, as MultiHeadAttention orders them.
"""

from __future__ import annotations

import torch

__all__ = ["NORMS_BLOCK_VALUES", "value_norms", "value_products"]

# value_norms forms R_h v_j (H·D values a key) for this many values' worth of keys at a time.
NORMS_BLOCK_VALUES = 1 << 18


def value_products(
    v: torch.Tensor, out_weight: torch.Tensor, heads: int, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """(B, S, H, H): <f_h(x_j), f_g(x_j)> for every key j and pair of query heads h, g, where
    f_h(x_j) = (x_j W_V^h + b_V^h) W_O^h is key j's value through head h's slice of the output
    projection (Kobayashi et al. 2020). Its diagonal is ‖f_h(x_j)‖², and α_ij f_h(x_j) is what head h
    moves from key j into query i. v (B, H_kv, S, D) is MultiHeadAttention.heads' (value bias included); a
    grouped-query head h reads value head h // G through its own W_O^h. out_proj's bias is added once
    after the heads and belongs to none of them: it is not in any f_h."""
    batch, kv_heads, src, head_dim = v.shape
    width = out_weight.shape[0]
    group = heads // kv_heads
    w = out_weight.view(width, kv_heads, group, head_dim)  # W_O^h = [:, h // G, h % G, :]
    if out is None:
        out = v.new_empty(batch, src, heads, heads)
    # f is (B, rows, H, E): in blocks of keys, so a long input never holds every key's H·E vectors.
    rows = max(1, (1 << 22) // max(1, batch * heads * width))
    for start in range(0, src, rows):
        block = v[:, :, start : start + rows]  # (B, H_kv, r, D)
        f = torch.einsum("bksd,ekgd->bskge", block, w).reshape(batch, block.shape[2], heads, width)
        out[:, start : start + rows] = f @ f.transpose(-1, -2)
    return out


def value_norms(v: torch.Tensor, out_weight: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, H, S): ‖f_h(x_j)‖, the diagonal of `value_products` without the pairs (what a trace keeps,
    [H, n] a layer). W_O^h = Q_h R_h (E x D, Q_h orthonormal columns), so ‖W_O^h v‖ = ‖R_h v‖: D values a
    key and head instead of E, a tenth of the work for SmolLM2's shapes, and a norm of a vector, with no
    cancellation (as a Gram form vᵀ W_O^hᵀ W_O^h v would have); in blocks of keys, at most
    NORMS_BLOCK_VALUES values of scratch whatever S."""
    batch, kv_heads, src, head_dim = v.shape
    width = out_weight.shape[0]
    w = out_weight.view(width, kv_heads, heads // kv_heads, head_dim).permute(1, 2, 0, 3)
    r = torch.linalg.qr(w.float(), mode="r").R.to(v.dtype)  # (H_kv, G, D, D), upper triangular
    out = v.new_empty(batch, heads, src)
    rows = max(1, NORMS_BLOCK_VALUES // max(1, batch * heads * head_dim))
    for start in range(0, src, rows):
        block = v[:, :, start : start + rows]  # (B, H_kv, r, D)
        f = torch.einsum("bksd,kgfd->bkgsf", block, r)  # (B, H_kv, G, r, D): R_h v_j
        out[:, :, start : start + rows] = torch.linalg.vector_norm(f, dim=-1).view(batch, heads, -1)
    return out
