"""RMSNorm (Zhang & Sennrich 2019) as the decoder families write it: x / sqrt(mean(x²) + eps) · w.

Computed in float32 for float32 and half-precision models, then cast back, as the reference code does
(float64 stays float64: the reference would round it to float32). Gemma stores
w − 1 (its weights start at 0): `offset=1.0` multiplies by (1 + w), in float32 before the cast as Gemma
does, where Llama casts first and then multiplies.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["RMSNorm"]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, *, eps: float = 1e-6, offset: float = 0.0) -> None:
        super().__init__()
        self.eps = eps
        self.offset = offset
        # Initialised so that the norm starts as the identity scale: 1 (Llama) or 1 + 0 (Gemma).
        self.weight = nn.Parameter(torch.full((dim,), 1.0 - offset))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x if x.dtype == torch.float64 else x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.offset:
            return (h * (self.offset + self.weight.to(h.dtype))).type_as(x)
        # Cast to the weight's dtype, as T5's norm does: the same as x's but where a float16 T5 carries its
        # residual stream in float32 (mha.core.layers.cast_network), whose norms feed float16 layers.
        return self.weight * h.to(self.weight.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}, offset={self.offset}"
