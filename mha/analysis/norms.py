"""Weight × value norm: what each head moves, not only where it looks (Kobayashi et al. 2020, "Attention is
Not Only a Weight: Analyzing Transformers with Vector Norms"; their code: gorokoba560/norm-analysis-of-
transformer).

Conventions, every one of them:

- x_j is key j's input to the attention sub-layer: in a pre-norm block (GPT-2, Llama and today's decoders)
  the residual stream after the block's norm, LN(h_j); in a post-norm block (BERT and its kin) the block's
  input h_j itself, whose norm came at the end of the previous block. The norms after the attention (a
  post-norm block's LN(h + attn), Gemma 2's post-attention norm) act on the sum over heads and the
  residual; no head owns a share of them, so they are outside every f_h.
- f_h(x_j) = (x_j W_V^h + b_V^h) W_O^h: key j's value through head h, its value bias included, then
  through head h's slice of the output projection W_O (the columns that read head h's D outputs). A
  grouped-query head h reads value head h // G (its group's shared value) through its own W_O^h.
- The output projection's bias b_O is added once after the heads (Σ_h Σ_j α^h_ij f_h(x_j) + b_O, since
  every row of α sums to 1) and belongs to no head: it is in no f_h, no norm and no map here.
- Head h moves α^h_ij f_h(x_j) from key j into query i. Its norm α^h_ij ‖f_h(x_j)‖ is the weighted map
  (`weight_norm_map`); ‖Σ_h α^h_ij f_h(x_j)‖, the heads' vectors summed before the norm, is the layer's map
  (`layer_norm_map`, Kobayashi's "attention-norm" of the whole multi-head layer).

Both come from `AttentionResult.value_products` [L, n, H, H] (attend(..., norms=True)): for key j, the inner
products <f_h(x_j), f_g(x_j)> of every pair of heads, from the forward that made the attentions. Its
diagonal is ‖f_h(x_j)‖² (`AttentionResult.norms`, [L, H, n]); the layer's map needs the rest:
‖Σ_h α^h_ij f_h(x_j)‖² = Σ_h Σ_g α^h_ij α^g_ij <f_h(x_j), f_g(x_j)>.
"""

from __future__ import annotations

import torch

__all__ = ["LAYER_MAP_MAX_TOKENS", "layer_norm_map", "row_shares", "weight_norm_map"]

# The layer's map costs n²·H² a layer (every pair of heads at every cell): up to 512 tokens, as the page's
# attention; a long input's trace keeps the per-head norms only.
LAYER_MAP_MAX_TOKENS = 512


def weight_norm_map(attentions: torch.Tensor, norms: torch.Tensor) -> torch.Tensor:
    """[L, H, n, s] α^h_ij ‖f_h(x_j)‖ from attentions [L, H, n, s] and norms [L, H, s] (s keys: n, or a
    source's for cross attention): the size of what head h moves from key j into query i."""
    if attentions.ndim != 4 or norms.shape != (*attentions.shape[:2], attentions.shape[3]):
        raise ValueError(
            f"norms must be [L, H, keys] = {[*attentions.shape[:2], attentions.shape[3]]} for attentions "
            f"{list(attentions.shape)}, got {list(norms.shape)}"
        )
    return attentions * norms.unsqueeze(-2)


def row_shares(maps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(shares, totals): each row of `maps` [..., n, s] divided by its total, so a row sums to 1 as
    attention does, and the totals [..., n]. A row of total 0 (a query that moves nothing) stays 0."""
    totals = maps.sum(-1)
    safe = torch.where(totals > 0, totals, torch.ones_like(totals))
    return maps / safe.unsqueeze(-1), totals


def layer_norm_map(attentions: torch.Tensor, value_products: torch.Tensor) -> torch.Tensor:
    """[L, n, s] ‖Σ_h α^h_ij f_h(x_j)‖ from attentions [L, H, n, s] and value products [L, s, H, H]: what
    the whole layer moves from key j into query i, before the output bias and the residual. Up to
    LAYER_MAP_MAX_TOKENS queries and keys."""
    layers, heads, rows, cols = attentions.shape
    if value_products.shape != (layers, cols, heads, heads):
        raise ValueError(
            f"value_products must be [L, keys, H, H] = {[layers, cols, heads, heads]}, "
            f"got {list(value_products.shape)}"
        )
    if max(rows, cols) > LAYER_MAP_MAX_TOKENS:
        raise ValueError(f"the layer's map is for up to {LAYER_MAP_MAX_TOKENS} tokens, got {max(rows, cols)}")
    out = attentions.new_empty(layers, rows, cols)
    for layer in range(layers):
        a = attentions[layer].permute(2, 1, 0)  # (s, n, H): key j's weights from every query and head
        squared = ((a @ value_products[layer]) * a).sum(-1)  # (s, n): α_ijᵀ P_j α_ij
        # A sum of squares is >= 0; rounding can leave -1e-9 where the vectors cancel.
        out[layer] = squared.clamp(min=0).sqrt().t()
    return out
