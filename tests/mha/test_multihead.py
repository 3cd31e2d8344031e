"""MultiHeadAttention equals torch.nn.MultiheadAttention given the same weights (float64, 1e-10)."""

from __future__ import annotations

import math

import pytest
import torch

from mha import MultiHeadAttention
from mha.core.attention import scaled_dot_product_attention

# float64: two summation orders of the same dot products (<= 512 terms, sums of size ~10) differ by at most
# 512·2**-53·10 ≈ 6e-13, so 1e-10 is rounding with a wide margin and still far below any wrong weight.
TOL = {"atol": 1e-10, "rtol": 0}


def pair_of_modules(
    embed_dim: int,
    heads: int,
    *,
    bias: bool = True,
    kdim: int | None = None,
    vdim: int | None = None,
    seed: int = 0,
) -> tuple[MultiHeadAttention, torch.nn.MultiheadAttention]:
    torch.manual_seed(seed)
    ours = MultiHeadAttention(embed_dim, heads, bias=bias, kdim=kdim, vdim=vdim).double().eval()
    ref = torch.nn.MultiheadAttention(
        embed_dim, heads, bias=bias, kdim=kdim, vdim=vdim, batch_first=True, dtype=torch.float64
    ).eval()
    with torch.no_grad():
        if bias:  # ours starts with zero biases: give both modules the same random ones
            for p in ours.parameters():
                if p.ndim == 1:
                    p.normal_()
        if ours.fused:
            ref.in_proj_weight.copy_(ours.in_proj.weight)
        else:
            ref.q_proj_weight.copy_(ours.q_proj.weight)
            ref.k_proj_weight.copy_(ours.k_proj.weight)
            ref.v_proj_weight.copy_(ours.v_proj.weight)
        if bias:
            ref.in_proj_bias.copy_(
                ours.in_proj.bias
                if ours.fused
                else torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias])
            )
            ref.out_proj.bias.copy_(ours.out_proj.bias)
        ref.out_proj.weight.copy_(ours.out_proj.weight)
    return ours, ref


def reference(ref: torch.nn.MultiheadAttention, q, k, v, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    out, weights = ref(q, k, v, need_weights=True, average_attn_weights=False, **kwargs)
    return out, weights


@pytest.mark.parametrize(("shape", "heads"), [((2, 5, 512), 8), ((32, 10, 512), 8), ((3, 7, 48), 6)])
def test_self_attention_matches_torch(shape: tuple[int, int, int], heads: int) -> None:
    ours, ref = pair_of_modules(shape[-1], heads)
    x = torch.randn(*shape, dtype=torch.float64)
    out, weights = ours(x)
    expected_out, expected_weights = reference(ref, x, x, x)
    assert weights is not None and weights.shape == (shape[0], heads, shape[1], shape[1])
    torch.testing.assert_close(weights, expected_weights, **TOL)
    torch.testing.assert_close(out, expected_out, **TOL)


def test_seed_shapes() -> None:
    ours, _ = pair_of_modules(512, 8)
    out, weights = ours(torch.randn(32, 10, 512, dtype=torch.float64))
    assert out.shape == (32, 10, 512)
    assert weights is not None and weights.shape == (32, 8, 10, 10)


def test_cross_attention_projects_key_and_value_with_their_own_weights() -> None:
    ours, ref = pair_of_modules(32, 4)
    q, kv = torch.randn(2, 3, 32, dtype=torch.float64), torch.randn(2, 6, 32, dtype=torch.float64)
    v = torch.randn(2, 6, 32, dtype=torch.float64)
    out, weights = ours(q, kv, v)
    expected_out, expected_weights = reference(ref, q, kv, v)
    torch.testing.assert_close(weights, expected_weights, **TOL)
    torch.testing.assert_close(out, expected_out, **TOL)
    # The first seed's bug (k, v projected with the query's slice) would not depend on k's own weights.
    with torch.no_grad():
        ours.in_proj.weight[32:64].add_(1.0)
    assert not torch.allclose(ours(q, kv, v)[1], weights, **TOL)


def test_kdim_vdim_and_no_bias() -> None:
    ours, ref = pair_of_modules(24, 3, kdim=10, vdim=14, bias=False)
    assert not ours.fused and all(p.ndim == 2 for p in ours.parameters())
    q = torch.randn(2, 4, 24, dtype=torch.float64)
    k, v = torch.randn(2, 9, 10, dtype=torch.float64), torch.randn(2, 9, 14, dtype=torch.float64)
    out, weights = ours(q, k, v)
    expected_out, expected_weights = reference(ref, q, k, v)
    torch.testing.assert_close(weights, expected_weights, **TOL)
    torch.testing.assert_close(out, expected_out, **TOL)


B, H, T, S, E = 3, 4, 5, 6, 32


def _keep(*shape: int, seed: int = 1) -> torch.Tensor:
    keep = torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) > 0.4
    keep[..., 0] = True  # every row keeps a key, so torch gives no NaN to compare against
    return keep


def _torch_mask(keep4: torch.Tensor) -> torch.Tensor:
    """Our (B|1, H|1, T, S) keep-mask -> torch's (B*H, T, S) disallow-mask."""
    return (~keep4.expand(B, H, T, S)).reshape(B * H, T, S)


@pytest.mark.parametrize(
    ("name", "keep"),
    [
        ("(S)", _keep(S)),
        ("(T, S)", _keep(T, S)),
        ("(B, T, S)", _keep(B, T, S)),
        ("(B, 1, T, S)", _keep(B, 1, T, S)),
        ("(B, H, T, S)", _keep(B, H, T, S)),
    ],
)
def test_keep_masks_match_torch(name: str, keep: torch.Tensor) -> None:
    ours, ref = pair_of_modules(E, H)
    q, kv = torch.randn(B, T, E, dtype=torch.float64), torch.randn(B, S, E, dtype=torch.float64)
    keep4 = keep.view(*(1,) * (4 - keep.ndim), *keep.shape) if keep.ndim < 3 else keep
    keep4 = keep4.unsqueeze(1) if keep.ndim == 3 else keep4
    expected_out, expected_weights = reference(ref, q, kv, kv, attn_mask=_torch_mask(keep4))
    for form in (keep, keep.double(), keep.long()):  # bool and 0/1 masks mean the same
        out, weights = ours(q, kv, mask=form)
        torch.testing.assert_close(weights, expected_weights, **TOL)
        torch.testing.assert_close(out, expected_out, **TOL)


def test_valid_lens_match_key_padding() -> None:
    ours, ref = pair_of_modules(E, H)
    q, kv = torch.randn(B, T, E, dtype=torch.float64), torch.randn(B, S, E, dtype=torch.float64)
    lens = torch.tensor([6, 2, 4])
    padding = torch.arange(S) >= lens[:, None]  # (B, S) True = ignore
    expected_out, expected_weights = reference(ref, q, kv, kv, key_padding_mask=padding)
    out, weights = ours(q, kv, valid_lens=lens)
    torch.testing.assert_close(weights, expected_weights, **TOL)
    torch.testing.assert_close(out, expected_out, **TOL)
    # (B, T) lengths: one per query.
    per_query = torch.randint(1, S + 1, (B, T), generator=torch.Generator().manual_seed(3))
    keep = (torch.arange(S) < per_query[..., None]).unsqueeze(1)  # (B, 1, T, S)
    expected_out, expected_weights = reference(ref, q, kv, kv, attn_mask=_torch_mask(keep))
    out, weights = ours(q, kv, valid_lens=per_query)
    torch.testing.assert_close(weights, expected_weights, **TOL)
    torch.testing.assert_close(out, expected_out, **TOL)


def test_causal_combined_with_mask_and_valid_lens() -> None:
    ours, ref = pair_of_modules(E, H)
    x = torch.randn(B, T, E, dtype=torch.float64)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    expected_out, expected_weights = reference(ref, x, x, x, attn_mask=~causal)
    out, weights = ours(x, causal=True)
    torch.testing.assert_close(weights, expected_weights, **TOL)
    torch.testing.assert_close(out, expected_out, **TOL)
    assert weights is not None and not weights.triu(1).any()

    keep = _keep(B, T, T)
    lens = torch.tensor([5, 3, 4])
    combined = (keep & causal & (torch.arange(T) < lens[:, None, None])).unsqueeze(1)  # (B, 1, T, T)
    rows_alive = combined.any(-1)
    out, weights = ours(x, mask=keep, valid_lens=lens, causal=True)
    expected_out, expected_weights = reference(ref, x, x, x, attn_mask=_torch_mask_square(combined))
    alive = rows_alive.expand(B, H, T)
    assert weights is not None
    torch.testing.assert_close(weights[alive], expected_weights[alive], **TOL)


def _torch_mask_square(keep4: torch.Tensor) -> torch.Tensor:
    return (~keep4.expand(B, H, T, T)).reshape(B * H, T, T)


def test_fully_masked_rows_give_zeros_not_nan() -> None:
    ours, _ = pair_of_modules(E, H)
    ours.train()  # the gradient path too
    x = torch.randn(B, T, E, dtype=torch.float64, requires_grad=True)
    keep = torch.ones(B, T, T, dtype=torch.bool)
    keep[1, 2] = False  # batch 1, query 2 sees nothing
    ours.dropout = 0.0
    out, weights = ours(x, mask=keep)
    assert weights is not None and torch.isfinite(weights).all() and torch.isfinite(out).all()
    assert (weights[1, :, 2] == 0).all()
    out.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    ours.eval()
    with torch.no_grad():
        fast, none = ours(x, mask=keep, need_weights=False)
        slow, _ = ours(x, mask=keep)
    assert none is None and torch.isfinite(fast).all()
    torch.testing.assert_close(fast, slow, **TOL)


def test_without_weights_uses_fused_path_with_same_output() -> None:
    ours, _ = pair_of_modules(E, H)
    x = torch.randn(B, T, E, dtype=torch.float64)
    for kwargs in ({}, {"causal": True}, {"valid_lens": torch.tensor([5, 1, 3])}):
        fast, none = ours(x, need_weights=False, **kwargs)
        slow, weights = ours(x, **kwargs)
        assert none is None and weights is not None
        torch.testing.assert_close(fast, slow, **TOL)


def test_dropout_applies_to_weights_only_in_training() -> None:
    ours, ref = pair_of_modules(E, H)
    ours.dropout = ref.dropout = 0.5
    x = torch.randn(B, T, E, dtype=torch.float64)
    ours.train()
    ref.train()
    torch.manual_seed(7)
    out, weights = ours(x)
    torch.manual_seed(7)
    expected_out, expected_weights = reference(ref, x, x, x)
    torch.testing.assert_close(weights, expected_weights, **TOL)  # the same dropped weights as torch
    torch.testing.assert_close(out, expected_out, **TOL)
    assert weights is not None and (weights == 0).float().mean() > 0.3
    ours.eval()
    _, clean = ours(x)
    assert clean is not None and (clean > 0).all()


def test_init_is_xavier_uniform_with_zero_biases() -> None:
    torch.manual_seed(0)
    module = MultiHeadAttention(256, 8)
    bound = math.sqrt(6 / (256 + 256))
    for part in module.in_proj.weight.chunk(3):
        assert part.abs().max() <= bound and part.abs().max() > 0.9 * bound
        assert abs(part.std().item() - bound / math.sqrt(3)) < 0.05 * bound
    assert (module.in_proj.bias == 0).all() and (module.out_proj.bias == 0).all()


def test_bad_arguments_raise_value_errors_quoting_the_values() -> None:
    with pytest.raises(ValueError, match=r"embed_dim \(512\) is not divisible by num_heads \(7\)"):
        MultiHeadAttention(512, 7)
    module = MultiHeadAttention(E, H)
    x = torch.randn(B, T, E)
    with pytest.raises(ValueError, match=r"does not broadcast"):
        module(x, mask=torch.ones(T + 1, T, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"0/1 or boolean keep-mask, got the value 0\.5"):
        module(x, mask=torch.full((T, T), 0.5))
    with pytest.raises(ValueError, match=r"valid_lens must have shape"):
        module(x, valid_lens=torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"query must have shape \(B, T, 32\), got \(3, 5, 31\)"):
        module(torch.randn(B, T, E - 1))


def test_sdpa_function_scale_and_shapes() -> None:
    q, k, v = (torch.randn(2, 3, 4, 8, dtype=torch.float64) for _ in range(3))
    out, weights = scaled_dot_product_attention(q, k, v, scale=0.5)
    expected = torch.softmax(q @ k.transpose(-1, -2) * 0.5, dim=-1)
    assert weights is not None
    torch.testing.assert_close(weights, expected, **TOL)
    torch.testing.assert_close(out, expected @ v, **TOL)


@pytest.mark.parametrize("masking", ["none", "causal", "mask", "valid_lens"])
def test_single_sequence_inference_path_matches_torch(masking: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """B = 1 under no_grad takes the copy-free path `attend` uses: it must give the same numbers."""
    taken: list[bool] = []
    fast = MultiHeadAttention._single_self_attention
    monkeypatch.setattr(
        MultiHeadAttention, "_single_self_attention", lambda self, *a: taken.append(True) or fast(self, *a)
    )
    ours, ref = pair_of_modules(64, 8)
    x = torch.randn(1, 9, 64, dtype=torch.float64)
    keep = _keep(9, 9, seed=5)
    kwargs: dict[str, object] = {
        "none": {},
        "causal": {"causal": True},
        "mask": {"mask": keep},
        "valid_lens": {"valid_lens": torch.tensor([6])},
    }[masking]
    disallow = {
        "none": None,
        "causal": ~torch.ones(9, 9, dtype=torch.bool).tril(),
        "mask": ~keep,
        "valid_lens": (torch.arange(9) >= 6).expand(9, 9),
    }[masking]
    with torch.no_grad():
        out, weights = ours(x, **kwargs)  # type: ignore[arg-type]
        expected_out, expected_weights = reference(ref, x, x, x, attn_mask=disallow)
    assert taken == [True], "the single-sequence path was not taken"
    assert weights is not None and weights.shape == (1, 8, 9, 9)
    torch.testing.assert_close(weights, expected_weights, **TOL)
    torch.testing.assert_close(out, expected_out, **TOL)


@pytest.mark.parametrize("batch", [1, 3])
def test_attention_weights_alone_match_torch(batch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The weights-only call (a model's last layer when only attention is asked) projects q and k alone
    on one sequence, and falls back to the full forward on a batch: the same weights either way."""
    projected: list[int] = []
    addmm = torch.addmm
    monkeypatch.setattr(torch, "addmm", lambda *a, **k: projected.append(a[1].shape[0]) or addmm(*a, **k))
    ours, ref = pair_of_modules(64, 8)
    x = torch.randn(batch, 9, 64, dtype=torch.float64)
    keep = _keep(9, 9, seed=7)
    with torch.no_grad():
        weights = ours.attention_weights(x, mask=keep)
        _, expected = reference(ref, x, x, x, attn_mask=~keep)
    assert weights.shape == (batch, 8, 9, 9)
    torch.testing.assert_close(weights, expected, **TOL)
    if batch == 1:
        assert projected == [128], "q and k only: the leading 2E rows of the fused projection"
