"""Taps: what an analysis reads out of one attention, or changes in it, beside its inputs.

An attention's inputs (query, key, value, its masks, rotary positions, a logit bias) say what it
computes; its taps say where some of its internals go and which heads count, for the analyses above the
core (mha.analysis, mha.trace, the corpus job). They travel as one object from a network's forward
through its blocks into MultiHeadAttention, so no layer between has to name each of them.

Shape legend: B batch, H heads, T query length, S key length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["NO_TAPS", "Taps"]


@dataclass(frozen=True)
class Taps:
    # A contiguous (B, H, T, S) buffer the weights are written into: a model's stacked buffer's slice,
    # which saves a copy of every layer's weights at the end.
    weights_out: torch.Tensor | None = None
    # (B, S, H, H), filled with the value products of this forward's values (mha.core.values).
    products_out: torch.Tensor | None = None
    # (B|1, H): each head's output (its slice before out_proj) multiplied by it; 0 removes the head from
    # the sum, as zeroing the input slice of transformers' o_proj does (mha.analysis.ablation).
    head_mask: torch.Tensor | None = None
    # A padded self-attention batch's real tokens among its B·T rows (mha.networks.model): projections
    # and feed-forward run on them alone; a padding row's q, k, v and outputs are 0.
    rows: torch.Tensor | None = None


NO_TAPS = Taps()  # the default: nothing read out, every head kept, every row computed
