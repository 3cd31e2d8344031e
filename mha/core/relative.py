"""T5's relative position bias: a learned logit bias per head for each bucket of key − query distance.

Shape legend: H heads, T query length, S key length.

Distances below half the buckets (a quarter, bidirectional) get a bucket each; longer ones share
logarithmically wider buckets up to `max_distance`, beyond which all share the last. Bidirectional (the
encoder) gives keys after the query their own half of the buckets; unidirectional (the decoder) maps every
later key to bucket 0, which its causal mask hides anyway. The first layer owns the table, and its bias
serves every layer of the stack (T5's `has_relative_attention_bias` on block 0 only); cross-attention has
none. The arithmetic is transformers' `T5Attention._relative_position_bucket`, step for step, so the
float32 logarithm lands in the same bucket at every boundary.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from mha.core.layers import Embedding

__all__ = ["RelativePositionBias", "relative_position_bucket"]


def relative_position_bucket(
    relative_position: torch.Tensor, *, bidirectional: bool, num_buckets: int, max_distance: int
) -> torch.Tensor:
    """Bucket (long, in 0..num_buckets-1) of each key − query distance (a long tensor of any shape)."""
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative_position > 0).long() * num_buckets  # later keys: the upper half
        distance = relative_position.abs()
    else:
        distance = -relative_position.clamp(max=0)  # later keys count as distance 0
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    # The log of 0 is -inf for the small distances; torch.where picks the exact bucket for those.
    log_ratio = torch.log(distance.float() / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (log_ratio * (num_buckets - max_exact)).to(torch.long)
    large = large.clamp(max=num_buckets - 1)
    return buckets + torch.where(is_small, distance, large)


class RelativePositionBias(nn.Module):
    """The bias (1, H, T, S) every self-attention layer of one stack adds to its logits."""

    def __init__(self, num_heads: int, *, num_buckets: int, max_distance: int, bidirectional: bool) -> None:
        super().__init__()
        self.embedding = Embedding(num_buckets, num_heads)  # bucket -> one bias per head
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bidirectional = bidirectional

    def forward(self, query_length: int, key_length: int) -> torch.Tensor:
        device = self.embedding.weight.device
        context = torch.arange(query_length, dtype=torch.long, device=device).view(-1, 1)
        memory = torch.arange(key_length, dtype=torch.long, device=device).view(1, -1)
        bucket = relative_position_bucket(
            memory - context,  # (T, S): key − query
            bidirectional=self.bidirectional,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
        )
        return self.embedding(bucket).permute(2, 0, 1).unsqueeze(0)  # (T, S, H) -> (1, H, T, S)

    def extra_repr(self) -> str:
        return f"buckets={self.num_buckets}, max_distance={self.max_distance}, both ways={self.bidirectional}"
