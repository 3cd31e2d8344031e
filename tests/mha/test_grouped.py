"""MultiHeadAttention's decoder pieces (grouped-query heads, head_dim, scale, soft-cap, q/k norm, rotary)
against a plain reference written out here: K and V repeated per group (transformers' repeat_kv), float64."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from mha import MultiHeadAttention
from mha.core.attention import build_keep_mask
from mha.core.rope import Rope, apply_rotary

# float64: the same dot products summed in other orders (<= 64 terms of size ~10): 64·2**-53·10 ≈ 7e-14,
# so 1e-10 is rounding with a wide margin and far below any wrong weight.
TOL = {"atol": 1e-10, "rtol": 0}
E = 48


def module(heads: int, kv_heads: int, **kwargs: object) -> MultiHeadAttention:
    torch.manual_seed(0)
    m = MultiHeadAttention(E, heads, num_kv_heads=kv_heads, **kwargs).double().eval()  # type: ignore[arg-type]
    with torch.no_grad():
        for p in m.parameters():  # biases and norm weights away from 0 and 1: a forgotten one shows
            if p.ndim == 1:
                p.copy_(
                    1.0 + 0.3 * torch.randn_like(p) if "norm" in _name(m, p) else 0.5 * torch.randn_like(p)
                )
    return m


def _name(m: torch.nn.Module, p: torch.Tensor) -> str:
    return next(name for name, q in m.named_parameters() if q is p)


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def reference(
    m: MultiHeadAttention,
    x: torch.Tensor,
    keep: torch.Tensor | None,
    rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention as transformers' eager path writes it: project, norm, rotate, repeat K/V, (+ bias),
    softmax."""
    batch, length, _ = x.shape
    heads, kv, d = m.num_heads, m.num_kv_heads, m.head_dim
    w_q, w_k, w_v = m.in_proj.weight.split(m.widths)
    b_q, b_k, b_v = m.in_proj.bias.split(m.widths) if m.in_proj.bias is not None else (None, None, None)
    q = F.linear(x, w_q, b_q).view(batch, length, heads, d).transpose(1, 2)
    k = F.linear(x, w_k, b_k).view(batch, length, kv, d).transpose(1, 2)
    v = F.linear(x, w_v, b_v).view(batch, length, kv, d).transpose(1, 2)
    if m.q_norm is not None and m.k_norm is not None:
        q, k = rms(q, m.q_norm.weight, m.q_norm.eps), rms(k, m.k_norm.weight, m.k_norm.eps)
    if rotary is not None:
        q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
    k = k.repeat_interleave(heads // kv, dim=1)  # head h reads key/value head h // G
    v = v.repeat_interleave(heads // kv, dim=1)
    scores = q @ k.transpose(-1, -2) * m.scale
    if m.softcap is not None:
        scores = torch.tanh(scores / m.softcap) * m.softcap
    if bias is not None:
        scores = scores + bias
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    out = (weights @ v).transpose(1, 2).reshape(batch, length, heads * d)
    return m.out_proj(out), weights


def keep_mask(kind: str, batch: int, heads: int, length: int) -> torch.Tensor | None:
    if kind == "none":
        return None
    if kind == "causal":
        return build_keep_mask(
            causal=True, batch=batch, heads=1, tgt_len=length, src_len=length, device="cpu"
        )
    if kind == "padded":  # the second sequence's last 3 tokens are padding, and causal
        pad = torch.ones(batch, 1, 1, length, dtype=torch.bool)
        pad[-1, ..., -3:] = False
        return build_keep_mask(
            mask=pad, causal=True, batch=batch, heads=1, tgt_len=length, src_len=length, device="cpu"
        )
    # per head: a different random pattern for each query head, each row keeping its diagonal
    generator = torch.Generator().manual_seed(3)
    per_head = torch.rand(batch, heads, length, length, generator=generator) > 0.4
    return per_head | torch.eye(length, dtype=torch.bool)


@pytest.mark.parametrize(("heads", "kv_heads"), [(8, 8), (8, 4), (8, 2), (8, 1), (6, 3)])
@pytest.mark.parametrize("mask", ["none", "causal", "padded", "per-head"])
@pytest.mark.parametrize("batch", [1, 2])
def test_grouped_heads_equal_repeated_kv(heads: int, kv_heads: int, mask: str, batch: int) -> None:
    m = module(heads, kv_heads)
    x = torch.randn(batch, 9, E, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    keep = keep_mask(mask, batch, heads, 9)
    out, weights = m(x, keep=keep)
    ref_out, ref_weights = reference(m, x, keep)
    assert weights is not None and weights.shape == (batch, heads, 9, 9)
    torch.testing.assert_close(weights, ref_weights, **TOL)
    torch.testing.assert_close(out, ref_out, **TOL)
    with torch.inference_mode():  # the weights-only path (a model's last layer) gives the same weights
        torch.testing.assert_close(m.attention_weights(x, keep=keep), ref_weights, **TOL)


@pytest.mark.parametrize("need_weights", [True, False])
def test_grouped_heads_add_a_per_head_logit_bias(need_weights: bool) -> None:
    # A bias (1, H, T, S) per query head, as T5's relative positions are, lined up with each head's group.
    m = module(8, 2)
    x = torch.randn(2, 9, E, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    bias = torch.randn(1, 8, 9, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    keep = keep_mask("padded", 2, 8, 9)
    out, weights = m(x, keep=keep, bias=bias, need_weights=need_weights)
    ref_out, ref_weights = reference(m, x, keep, bias=bias)
    torch.testing.assert_close(out, ref_out, **TOL)
    if need_weights:
        assert weights is not None
        torch.testing.assert_close(weights, ref_weights, **TOL)
    else:
        assert weights is None


def test_kv_heads_are_shared_by_their_group_only() -> None:
    # With K of key/value head 1 scaled up, only query heads 4..7 (group 1 of 2) change their weights.
    m = module(8, 2)
    x = torch.randn(1, 7, E, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    before = m(x)[1]
    with torch.no_grad():
        rows = slice(m.widths[0] + m.head_dim, m.widths[0] + 2 * m.head_dim)  # k rows of kv head 1
        m.in_proj.weight[rows] *= 3.0
    after = m(x)[1]
    assert before is not None and after is not None
    torch.testing.assert_close(after[:, :4], before[:, :4], **TOL)
    assert (after[:, 4:] - before[:, 4:]).abs().max() > 0.01


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_decoder_pieces_equal_the_written_out_reference(kv_heads: int) -> None:
    # Qwen3-like: head_dim other than E / H, q/k RMSNorm before RoPE, biases on q/k/v but not out; plus
    # Gemma 2's scale and soft-cap, with a partial rotary to cover the passing dimensions.
    m = module(4, kv_heads, head_dim=20, qk_norm_eps=1e-6, out_bias=False, scale=0.3, softcap=2.5)
    assert m.out_proj.bias is None and m.in_proj.bias is not None
    length = 11
    x = torch.randn(2, length, E, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    rope = Rope(head_dim=20, theta=100.0, partial_rotary_factor=0.6)
    cos, sin = (t.double() for t in rope.cos_sin(torch.arange(length)[None]))
    keep = keep_mask("padded", 2, 4, length)
    out, weights = m(x, keep=keep, rotary=(cos, sin))
    ref_out, ref_weights = reference(m, x, keep, rotary=(cos, sin))
    torch.testing.assert_close(weights, ref_weights, **TOL)
    torch.testing.assert_close(out, ref_out, **TOL)
    with torch.inference_mode():
        torch.testing.assert_close(m.attention_weights(x, keep=keep, rotary=(cos, sin)), ref_weights, **TOL)
    # The cap bounds every logit to (-cap, cap): within a row no weight exceeds another by exp(2·cap).
    full = keep.expand_as(weights)
    high = weights.masked_fill(~full, 0.0).amax(-1)
    low = weights.masked_fill(~full, 1.0).amin(-1)
    assert float((high / low).max().detach()) <= math.exp(2 * 2.5)


def test_grouped_attention_trains() -> None:
    m = module(8, 2).train()
    x = torch.randn(2, 5, E, dtype=torch.float64, requires_grad=True)
    out, _ = m(x, causal=True)
    out.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())


def test_bad_grouping_and_rotary_cross_attention_are_refused() -> None:
    with pytest.raises(ValueError, match=r"num_heads \(8\) is not divisible by num_kv_heads \(3\)"):
        MultiHeadAttention(E, 8, num_kv_heads=3)
    m = MultiHeadAttention(E, 4, kdim=10, vdim=10)
    cos = sin = torch.ones(1, 3, 12)
    with pytest.raises(ValueError, match="self-attention only"):
        m(torch.randn(1, 3, E), torch.randn(1, 5, 10), torch.randn(1, 5, 10), rotary=(cos, sin))


def test_a_per_head_mask_shared_by_the_batch_reaches_every_path() -> None:
    # (1, H, T, S): one pattern per head for every sequence of the batch; each path must broadcast it.
    m = module(8, 2)
    x = torch.randn(2, 6, E, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    keep = keep_mask("per-head", 1, 8, 6)
    assert keep is not None and keep.shape == (1, 8, 6, 6)
    reference_weights = reference(m, x, keep)[1]
    torch.testing.assert_close(m(x, keep=keep)[1], reference_weights, **TOL)
    with torch.inference_mode():
        torch.testing.assert_close(m.attention_weights(x, keep=keep), reference_weights, **TOL)
