"""Rotary position embedding (Su et al. 2021, "RoFormer"), as today's decoder checkpoints apply it.

A query or key vector at position p is rotated pairwise: dimension i of the first half and dimension
i + d/2 of the second (the "rotate half" layout of Llama, Qwen, Mistral, Gemma and Phi checkpoints) turn by
the angle p·θ_i, with θ_i = 1 / base^(2i / d) for the d = `rotary_dim` leading dimensions; the rest of the
head passes unchanged (partial rotary). The dot product q·k then depends on the positions only through
their difference. Scaled variants change θ (and may scale cos and sin by an attention factor):

- ``default``: θ_i as above.
- ``linear`` (position interpolation): θ_i / factor.
- ``dynamic`` (NTK-aware): for n > max_position_embeddings the base grows to
  base·(factor·n / max_pos − (factor − 1))^(d / (d − 2)); unchanged up to max_pos.
- ``llama3``: low frequencies (wavelength above original_max / low_freq_factor) divided by factor, high ones
  (below original_max / high_freq_factor) kept, a linear blend in between.
- ``yarn``: a ramp between interpolated (θ / factor) and extrapolated θ across the dimensions, by the
  correction range of beta_fast and beta_slow; cos and sin scaled by 0.1·ln(factor) + 1 (or the
  mscale ratio, or a given attention_factor).
- ``longrope`` (Phi-3): θ_i divided by per-dimension short factors, or long factors once n exceeds the
  original maximum; cos and sin scaled by sqrt(1 + ln(factor) / ln(original_max)).

Each formula is transformers' `modeling_rope_utils` (the reference, tests/mha/test_rope.py compares them
value for value), computed here without any state: transformers' dynamic and longrope variants keep what
the longest input so far set, we compute from this input's length alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from mha.errors import UnsupportedCheckpointError

__all__ = ["ROPE_TYPES", "Rope", "apply_rotary", "rotate_half"]

ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")


@dataclass(frozen=True)
class Rope:
    """The rotary embedding of one model: what `rope_parameters` (transformers 5) or `rope_theta` with
    `rope_scaling` (older config.json files) say, and the head size it rotates."""

    head_dim: int
    theta: float = 10000.0
    rope_type: str = "default"
    partial_rotary_factor: float = 1.0
    max_position_embeddings: int = 2048
    # the type's own parameters (factor, low_freq_factor, original_max_position_embeddings, ...)
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise UnsupportedCheckpointError(
                f"rope type {self.rope_type!r} is not supported; supported: {', '.join(ROPE_TYPES)}"
            )
        if not math.isfinite(self.theta) or self.theta <= 0:
            raise UnsupportedCheckpointError(
                f"rope base (rope_theta) {self.theta} must be a finite number > 0"
            )
        if self.rotary_dim < 2 or self.rotary_dim % 2:
            raise UnsupportedCheckpointError(
                f"rotary dimension {self.rotary_dim} (head_dim {self.head_dim} x partial_rotary_factor "
                f"{self.partial_rotary_factor}) must be even and at least 2"
            )

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, head_dim: int) -> Rope:
        """From a config.json dict: `rope_parameters` (transformers 5) or top-level `rope_theta` and
        `rope_scaling` (older files; its `type` is the old name of `rope_type`)."""
        params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
        rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
        params.pop("type", None)
        theta = params.pop("rope_theta", None) or config.get("rope_theta") or 10000.0
        partial = params.pop("partial_rotary_factor", None) or config.get("partial_rotary_factor") or 1.0
        max_positions = int(config.get("max_position_embeddings") or 2048)
        if rope_type in ("llama3", "yarn", "longrope"):
            # Phi-3 keeps the pretraining length outside rope_scaling, and it wins (as in transformers).
            outside = config.get("original_max_position_embeddings")
            params["original_max_position_embeddings"] = int(
                outside or params.get("original_max_position_embeddings") or max_positions
            )
        return cls(
            head_dim=head_dim,
            theta=float(theta),
            rope_type=str(rope_type),
            partial_rotary_factor=float(partial),
            max_position_embeddings=max_positions,
            params=params,
        )

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    def inverse_frequencies(self, n: int) -> tuple[Tensor, float]:
        """θ [rotary_dim / 2] (float32) for an input of n positions, and the factor on cos and sin."""
        d = self.rotary_dim
        exponents = torch.arange(0, d, 2, dtype=torch.int64).float() / d
        base = self.theta
        p = self.params
        if self.rope_type == "default":
            return 1.0 / base**exponents, 1.0
        if self.rope_type == "linear":
            return 1.0 / base**exponents / p["factor"], 1.0
        if self.rope_type == "dynamic":
            length = max(n, self.max_position_embeddings)
            factor = p["factor"]
            base = base * (factor * length / self.max_position_embeddings - (factor - 1)) ** (d / (d - 2))
            return 1.0 / base**exponents, 1.0
        if self.rope_type == "llama3":
            return _llama3(1.0 / base**exponents, p), 1.0
        if self.rope_type == "yarn":
            return _yarn(base, d, p, self.max_position_embeddings)
        return _longrope(base, exponents, p, n, self.max_position_embeddings)

    def cos_sin(self, positions: Tensor, *, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
        """cos and sin [..., T, rotary_dim] for integer `positions` [..., T], computed in float32 as the
        checkpoints' reference code does, then cast to `dtype`."""
        n = int(positions.max()) + 1 if positions.numel() else 0
        inv_freq, scaling = self.inverse_frequencies(n)
        angles = positions[..., None].float() * inv_freq.to(positions.device)
        angles = torch.cat((angles, angles), dim=-1)
        return (angles.cos() * scaling).to(dtype), (angles.sin() * scaling).to(dtype)


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) over the last dimension's halves: each pair (i, i + d/2) turned by 90°."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate the leading cos.shape[-1] dimensions of x [B, H, T, head_dim] by the angles whose cos and sin
    are [B or 1, T, rotary_dim]; the other dimensions pass (partial rotary)."""
    cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)  # broadcast over heads
    d = cos.shape[-1]
    if d == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    rotated, passed = x[..., :d], x[..., d:]
    return torch.cat((rotated * cos + rotate_half(rotated) * sin, passed), dim=-1)


def _llama3(inv_freq: Tensor, p: Mapping[str, Any]) -> Tensor:
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    old_context = p["original_max_position_embeddings"]
    wavelength = 2 * math.pi / inv_freq
    scaled = torch.where(wavelength > old_context / low, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelength - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelength >= old_context / high) & (wavelength <= old_context / low)
    return torch.where(medium, blended, scaled)


def _yarn(base: float, d: int, p: Mapping[str, Any], max_position_embeddings: int) -> tuple[Tensor, float]:
    original = p["original_max_position_embeddings"]
    factor = p.get("factor") or max_position_embeddings / original
    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = p.get("mscale"), p.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor, 1.0)
    beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

    def correction_dim(
        rotations: float,
    ) -> float:  # the dimension that turns `rotations` times over `original`
        return d * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001  # the reference's guard against a zero-width ramp
    ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    frequencies = base ** (torch.arange(0, d, 2).float() / d)
    extrapolated = 1.0 - ramp
    inv_freq = (1.0 / (factor * frequencies)) * (1 - extrapolated) + (1.0 / frequencies) * extrapolated
    return inv_freq, float(attention_factor)


def _yarn_mscale(scale: float, mscale: float) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _longrope(
    base: float, exponents: Tensor, p: Mapping[str, Any], n: int, max_position_embeddings: int
) -> tuple[Tensor, float]:
    original = p["original_max_position_embeddings"]
    factor = p.get("factor") or max_position_embeddings / original
    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    ext = torch.tensor(p["long_factor"] if n > original else p["short_factor"], dtype=torch.float32)
    return 1.0 / (ext * base**exponents), float(attention_factor)
