"""The attention core: one masked softmax for every path, the keep-mask built once per model, soft-capping."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import mha.core.attention as core
from mha import MultiHeadAttention, Transformer, TransformerConfig
from mha.core.attention import attention_weights, build_keep_mask, empty_rows, scaled_dot_product_attention
from mha.core.layers import ACTIVATIONS, FeedForward

# float64, head dim D = 8, entries ~ N(0, 1): a score is a D-term dot product of size <= ~30, and two
# summation orders (bmm against 4-D matmul) move it by at most D·2**-53·30 ≈ 3e-14; softmax's slope is
# <= 1/2, so a weight moves by less. 1e-12 is that with margin and far below any wrong weight (~1e-1).
TOL = {"atol": 1e-12, "rtol": 0}

B, H, T, S, D = 2, 3, 5, 6, 8


def _qk(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, H, T, D, generator=g, dtype=torch.float64), torch.randn(
        B, H, S, D, generator=g, dtype=torch.float64
    )


def _keep_with_empty_row() -> torch.Tensor:
    keep = torch.rand(B, 1, T, S, generator=torch.Generator().manual_seed(9)) > 0.3
    keep[..., 0] = True
    keep[1, 0, 2] = False  # batch 1, query 2 keeps no key
    return keep


def _reference(q: torch.Tensor, k: torch.Tensor, keep: torch.Tensor | None, softcap: float | None = None):
    """The textbook formula, written out: scores, Gemma 2's cap, -inf where masked, softmax, empty rows 0."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if keep is None:
        return torch.softmax(scores, dim=-1)
    weights = torch.softmax(scores.masked_fill(~keep, -math.inf), dim=-1)
    return weights.nan_to_num(0.0)  # an all -inf row is NaN in the formula; the core gives zeros


@pytest.mark.parametrize("softcap", [None, 2.0])
def test_attention_weights_follow_the_formula(softcap: float | None) -> None:
    q, k = _qk()
    keep = _keep_with_empty_row()
    weights = attention_weights(q, k, keep, scale=D**-0.5, softcap=softcap)
    torch.testing.assert_close(weights, _reference(q, k, keep, softcap), **TOL)
    assert (weights[1, :, 2] == 0).all()
    alive = keep.any(-1).expand(B, H, T)
    torch.testing.assert_close(
        weights.sum(-1)[alive], torch.ones(int(alive.sum()), dtype=torch.float64), **TOL
    )


def test_one_sequence_three_dims_equals_the_batched_form() -> None:
    """(H, T, D) is the single-sequence path's layout (BLAS alpha, written in place): the same weights."""
    q, k = _qk(1)
    keep = _keep_with_empty_row()
    batched = attention_weights(q, k, keep, scale=D**-0.5)
    out = torch.empty(H, T, S, dtype=torch.float64)
    with torch.no_grad():
        single = attention_weights(q[1], k[1], keep[1], scale=D**-0.5, out=out)
    assert single.data_ptr() == out.data_ptr(), "the weights land in the buffer given"
    torch.testing.assert_close(single, batched[1], **TOL)


def test_gradients_flow_in_both_layouts_and_masked_rows_stay_finite() -> None:
    q, k = _qk(2)
    keep = _keep_with_empty_row()
    grads = []
    for layout in (lambda t: t, lambda t: t[1]):  # (B, H, ·, D) and one sequence (H, ·, D)
        q_, k_ = q.clone().requires_grad_(), k.clone().requires_grad_()
        weights = attention_weights(layout(q_), layout(k_), layout(keep), scale=D**-0.5, softcap=3.0)
        (weights * torch.arange(S, dtype=torch.float64)).sum().backward()
        assert q_.grad is not None and torch.isfinite(q_.grad).all()
        grads.append(q_.grad[1])
    torch.testing.assert_close(grads[0], grads[1], **TOL)


def test_softcap_bounds_the_logits_and_in_place_equals_autograd() -> None:
    q, k = _qk(3)
    q = q * 50  # logits of size ~100: uncapped, softmax would put all weight on one key
    cap = 1.0
    with torch.no_grad():
        in_place = attention_weights(q, k, None, scale=D**-0.5, softcap=cap)
    # Capped logits lie in [-cap, cap] (tanh saturates to exactly ±1 here), so two weights of a row differ
    # by a factor of at most e^(2·cap); exp and the division add a few float64 roundings (~1e-16 each).
    assert (in_place.amax(-1) / in_place.amin(-1) <= math.exp(2 * cap) * (1 + 1e-12)).all()
    # So no key takes more than e^(2·cap) / (e^(2·cap) + S - 1) of a row; uncapped, one key nearly all of it.
    bound = math.exp(2 * cap) / (math.exp(2 * cap) + S - 1) * (1 + 1e-12)
    assert (in_place.amax(-1) <= bound).all()
    assert (attention_weights(q, k, None, scale=D**-0.5).amax(-1) > bound).any()
    tracked = attention_weights(q.requires_grad_(), k, None, scale=D**-0.5, softcap=cap)
    # The same elementwise operations in the same order, in place or not: equal to the bit.
    assert torch.equal(tracked.detach(), in_place)


def test_sdpa_without_weights_falls_back_to_the_core_when_capped() -> None:
    """torch's fused kernel has no soft-cap: the output without weights must still be the capped one."""
    q, k = _qk(4)
    v = torch.randn(B, H, S, D, dtype=torch.float64)
    keep = _keep_with_empty_row()
    out, none = scaled_dot_product_attention(q, k, v, keep_mask=keep, softcap=1.5, need_weights=False)
    expected, weights = scaled_dot_product_attention(q, k, v, keep_mask=keep, softcap=1.5)
    assert none is None and weights is not None
    torch.testing.assert_close(out, expected, **TOL)
    torch.testing.assert_close(out, _reference(q, k, keep, 1.5) @ v, **TOL)
    uncapped, _ = scaled_dot_product_attention(q, k, v, keep_mask=keep, need_weights=False)
    assert not torch.allclose(uncapped, out, **TOL)


def test_empty_rows() -> None:
    assert empty_rows(None) is None
    assert empty_rows(torch.ones(2, 1, 3, 4, dtype=torch.bool)) is None  # no row empty: nothing to zero
    keep = _keep_with_empty_row()
    empty = empty_rows(keep)
    assert empty is not None and empty.shape == (B, 1, T, 1)
    assert empty.flatten().tolist() == [i == T + 2 for i in range(B * T)]


def _count(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Count the calls of mha.core.attention's `name`, looked up by the module's own code at call time."""
    calls: list[int] = []
    real = getattr(core, name)
    monkeypatch.setattr(core, name, lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def _module(seed: int = 0) -> MultiHeadAttention:
    torch.manual_seed(seed)
    return MultiHeadAttention(16, 4).double().eval()


@pytest.mark.parametrize(
    "path",
    ["batched", "one sequence", "weights alone", "weights alone, batched", "gradient", "model"],
)
def test_every_path_computes_weights_in_the_one_masked_softmax(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _count(monkeypatch, "masked_softmax")
    module = _module()
    x = torch.randn(1 if path in ("one sequence", "weights alone") else 3, 4, 16, dtype=torch.float64)
    keep = torch.ones(4, 4, dtype=torch.bool).tril()
    expected_calls = 1
    with torch.set_grad_enabled(path == "gradient"):
        if path in ("batched", "one sequence"):
            module(x, mask=keep)
        elif path.startswith("weights alone"):
            module.attention_weights(x, mask=keep)
        elif path == "gradient":
            module.train()(x.requires_grad_(), mask=keep)[0].sum().backward()
        else:
            config = TransformerConfig(vocab_size=50, embed_dim=16, num_heads=4, num_layers=3, ffn_dim=32)
            model = Transformer(config).eval()
            model(torch.randint(0, 50, (1, 4)), need_hidden=False)
            model(torch.randint(0, 50, (2, 4)), attention_mask=torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]))
            expected_calls = 2 * config.num_layers
    assert len(calls) == expected_calls


def test_fused_path_zeroes_empty_rows_through_the_same_helper(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count(monkeypatch, "empty_rows")
    module = _module()
    keep = torch.ones(2, 4, 4, dtype=torch.bool)
    keep[1, 3] = False
    out, none = module(torch.randn(2, 4, 16, dtype=torch.float64), mask=keep, need_weights=False)
    assert none is None and calls == [1] and (out[1, 3] == module.out_proj.bias).all()


def test_a_model_normalises_its_mask_once_not_in_every_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count(monkeypatch, "normalize_mask")
    config = TransformerConfig(vocab_size=50, embed_dim=16, num_heads=4, num_layers=3, ffn_dim=32)
    model = Transformer(config).eval()
    with torch.no_grad():
        model(torch.randint(0, 50, (2, 5)), attention_mask=torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]))
    assert calls == [1]


@pytest.mark.parametrize("architecture", ["encoder", "decoder"])
def test_model_keep_mask_is_padding_and_causal(architecture: str) -> None:
    model = Transformer(
        TransformerConfig(vocab_size=50, embed_dim=16, num_heads=4, architecture=architecture)
    )
    ids = torch.zeros(2, 4, dtype=torch.long)
    causal = architecture == "decoder"
    tri = torch.ones(4, 4, dtype=torch.bool).tril()
    unpadded = model._keep_mask(ids, torch.ones(2, 4, dtype=torch.long))
    if causal:
        assert unpadded is not None and torch.equal(unpadded, tri.view(1, 1, 4, 4))
    else:
        assert unpadded is None and model._keep_mask(ids, None) is None  # nothing masked: no mask at all
    padding = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    keep = model._keep_mask(ids, padding)
    expected = padding.bool().view(2, 1, 1, 4) & (tri if causal else True)
    assert keep is not None and keep.dtype == torch.bool and torch.equal(keep, expected.expand_as(keep))


def test_keep_is_the_normalised_form_of_mask_valid_lens_and_causal() -> None:
    module = _module()
    x = torch.randn(3, 5, 16, dtype=torch.float64)
    mask = torch.rand(5, 5, generator=torch.Generator().manual_seed(2)) > 0.3
    lens = torch.tensor([5, 2, 4])
    keep = build_keep_mask(
        mask=mask, valid_lens=lens, causal=True, batch=3, heads=4, tgt_len=5, src_len=5, device=x.device
    )
    assert keep is not None
    # The same mask reaches the same operations: equal to the bit.
    public = module(x, mask=mask.long(), valid_lens=lens, causal=True)
    ready = module(x, keep=keep)
    assert torch.equal(public[0], ready[0]) and torch.equal(public[1], ready[1])  # type: ignore[arg-type]
    assert torch.equal(module.attention_weights(x, keep=keep), ready[1])  # type: ignore[arg-type]


def test_keep_is_refused_beside_the_public_forms_or_when_not_normalised() -> None:
    module = _module()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    keep = torch.ones(1, 1, 5, 5, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"keep replaces mask, valid_lens and causal"):
        module(x, keep=keep, causal=True)
    with pytest.raises(ValueError, match=r"keep replaces"):
        module.attention_weights(x, keep=keep, mask=keep)
    with pytest.raises(
        ValueError, match=r"keep must be a 4-D bool mask .* got torch\.int64 of shape \(5, 5\)"
    ):
        module(x, keep=torch.ones(5, 5, dtype=torch.long))


def test_key_and_value_shapes_are_checked() -> None:
    module = _module()
    q = torch.randn(2, 3, 16, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"key must have shape \(2, S, 16\), got \(1, 4, 16\)"):
        module(q, torch.randn(1, 4, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"value must have shape \(2, 4, 16\), got \(2, 5, 16\)"):
        module(q, torch.randn(2, 4, 16, dtype=torch.float64), torch.randn(2, 5, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"query must have shape \(B, T, 16\), got \(3, 16\)"):
        module.attention_weights(torch.randn(3, 16, dtype=torch.float64))


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("one sequence in inference", True),
        ("training without dropout", True),
        ("batch of two", False),
        ("cross-attention", False),
        ("separate projections", False),
        ("training with dropout", False),
        ("gradient wanted", False),
    ],
)
def test_single_sequence_path_condition(case: str, expected: bool) -> None:
    module = (
        MultiHeadAttention(16, 4, kdim=8) if case == "separate projections" else MultiHeadAttention(16, 4)
    )
    module.dropout = 0.1 if case == "training with dropout" else 0.0
    module.train(case.startswith("training"))
    x = torch.randn(2 if case == "batch of two" else 1, 3, 16)
    with torch.set_grad_enabled(case == "gradient wanted"):
        assert module._single_sequence(x, self_attention=case != "cross-attention") is expected


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_feed_forward_applies_the_named_activation(name: str) -> None:
    torch.manual_seed(0)
    ffn = FeedForward(TransformerConfig(embed_dim=8, num_heads=2, ffn_dim=16, activation=name)).double()
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    hidden = ffn.fc_in(x)
    # The tanh form written out (GPT-2's gelu_new): float64 roundings of values ~1, summed over 16 hidden
    # units by fc_out, move the result by ~16·2**-53·10 ≈ 2e-14: within TOL.
    expected = {
        "gelu": F.gelu(hidden),
        "gelu_tanh": 0.5
        * hidden
        * (1 + torch.tanh(math.sqrt(2 / math.pi) * (hidden + 0.044715 * hidden**3))),
        "relu": hidden.clamp(min=0),
        "silu": hidden * torch.sigmoid(hidden),
    }[name]
    torch.testing.assert_close(ffn(x), ffn.fc_out(expected), **TOL)


@pytest.mark.parametrize("name", ["silu", "gelu_tanh"])
def test_gated_feed_forward_is_down_of_act_gate_times_up(name: str) -> None:
    # Llama's SwiGLU and Gemma's GeGLU: fc_in holds the gate rows, then the up rows.
    torch.manual_seed(0)
    config = TransformerConfig(
        embed_dim=8, num_heads=2, ffn_dim=16, activation=name, mlp="gated", mlp_bias=False
    )
    ffn = FeedForward(config).double()
    assert ffn.fc_in.weight.shape == (32, 8) and ffn.fc_in.bias is None
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    gate, up = x @ ffn.fc_in.weight[:16].T, x @ ffn.fc_in.weight[16:].T
    act = gate * torch.sigmoid(gate) if name == "silu" else F.gelu(gate, approximate="tanh")
    torch.testing.assert_close(ffn(x), (act * up) @ ffn.fc_out.weight.T, **TOL)
