"""mha.core.rope against transformers' rotary embeddings (modeling_rope_utils and the models'
RotaryEmbedding)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tolerances import U32
from transformers import LlamaConfig, Phi3Config
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding
from transformers.models.phi3.modeling_phi3 import apply_rotary_pos_emb as phi3_apply

from mha.core.rope import Rope, apply_rotary
from mha.errors import UnsupportedCheckpointError

HEADS, HEAD_DIM, MAX_POS = 4, 16, 32

CASES: dict[str, dict[str, Any]] = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 3.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    "yarn-mscale": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 16,
        "mscale": 0.707,
        "mscale_all_dim": 1.0,
        "beta_fast": 16,
        "beta_slow": 2,
    },
}


def angle_atol(n: int) -> float:
    """cos and sin of angles up to n radians (θ <= 1): a few float32 roundings of θ and of p·θ move an angle
    by up to ~4·n·U32, and cos, sin move by at most as much."""
    return 4 * n * U32


def llama_config(rope: dict[str, Any]) -> LlamaConfig:
    return LlamaConfig(
        hidden_size=HEADS * HEAD_DIM,
        num_attention_heads=HEADS,
        max_position_embeddings=MAX_POS,
        rope_parameters={"rope_theta": 500.0, **rope},
    )


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("n", [12, 48])  # within and beyond max_position_embeddings (and the original 16)
def test_cos_sin_equal_transformers(name: str, n: int) -> None:
    config = llama_config(dict(CASES[name]))
    reference = LlamaRotaryEmbedding(config)  # fresh: transformers' dynamic RoPE keeps state across calls
    positions = torch.arange(n)[None]
    cos_ref, sin_ref = reference(torch.zeros(1, dtype=torch.float32), positions)
    ours = Rope.from_config(config.to_dict(), head_dim=HEAD_DIM)
    assert ours.rope_type == CASES[name]["rope_type"]
    cos, sin = ours.cos_sin(positions)
    torch.testing.assert_close(cos, cos_ref, atol=angle_atol(n), rtol=0)
    torch.testing.assert_close(sin, sin_ref, atol=angle_atol(n), rtol=0)


def test_dynamic_changes_nothing_up_to_max_positions_and_stretches_beyond() -> None:
    rope = Rope.from_config(llama_config(dict(CASES["dynamic"])).to_dict(), head_dim=HEAD_DIM)
    plain = Rope.from_config(llama_config({"rope_type": "default"}).to_dict(), head_dim=HEAD_DIM)
    assert torch.equal(rope.inverse_frequencies(MAX_POS)[0], plain.inverse_frequencies(MAX_POS)[0])
    assert (rope.inverse_frequencies(4 * MAX_POS)[0][1:] < plain.inverse_frequencies(0)[0][1:]).all()


@pytest.mark.parametrize("n", [12, 48])  # short factors within the original 16 positions, long beyond
@pytest.mark.parametrize("partial", [1.0, 0.5])
def test_longrope_and_partial_rotary_equal_phi3(n: int, partial: float) -> None:
    half = int(HEAD_DIM * partial) // 2
    config = Phi3Config(
        hidden_size=HEADS * HEAD_DIM,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=MAX_POS,
        original_max_position_embeddings=16,
        partial_rotary_factor=partial,
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "short_factor": [1.0 + 0.1 * i for i in range(half)],
            "long_factor": [2.0 + 0.5 * i for i in range(half)],
        },
    )
    reference = Phi3RotaryEmbedding(config)
    positions = torch.arange(n)[None]
    cos_ref, sin_ref = reference(torch.zeros(1), positions)
    ours = Rope.from_config(config.to_dict(), head_dim=HEAD_DIM)
    assert ours.rotary_dim == int(HEAD_DIM * partial)
    cos, sin = ours.cos_sin(positions)
    torch.testing.assert_close(cos, cos_ref, atol=angle_atol(n), rtol=0)
    torch.testing.assert_close(sin, sin_ref, atol=angle_atol(n), rtol=0)

    generator = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 1, HEADS, n, HEAD_DIM, generator=generator)
    q_ref, k_ref = phi3_apply(q, k, cos_ref, sin_ref)
    # Same products and sums of float32 values of magnitude ~3 (|q| <= ~4, |cos|, |sin| <= ~1.2).
    torch.testing.assert_close(apply_rotary(q, cos, sin), q_ref, atol=16 * angle_atol(n), rtol=0)
    torch.testing.assert_close(apply_rotary(k, cos, sin), k_ref, atol=16 * angle_atol(n), rtol=0)
    if partial < 1:  # the dimensions past rotary_dim pass untouched
        assert torch.equal(apply_rotary(q, cos, sin)[..., ours.rotary_dim :], q[..., ours.rotary_dim :])


def test_old_rope_scaling_reads_like_rope_parameters() -> None:
    scaling = {"type": "linear", "factor": 2.0}
    old = {"rope_theta": 500.0, "max_position_embeddings": MAX_POS, "rope_scaling": scaling}
    new = llama_config({"rope_type": "linear", "factor": 2.0}).to_dict()
    a, b = Rope.from_config(old, head_dim=HEAD_DIM), Rope.from_config(new, head_dim=HEAD_DIM)
    assert (a.rope_type, a.theta, a.params["factor"]) == (b.rope_type, b.theta, b.params["factor"])
    assert torch.equal(a.inverse_frequencies(8)[0], b.inverse_frequencies(8)[0])


def test_rotation_keeps_norms_and_depends_on_offsets_only() -> None:
    rope = Rope(head_dim=HEAD_DIM, theta=10000.0)
    generator = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 1, 1, 1, HEAD_DIM, generator=generator, dtype=torch.float64)
    scores = []
    for shift in (0, 5, 11):
        positions = torch.tensor([[3 + shift, 7 + shift]])
        cos, sin = (t.double() for t in rope.cos_sin(positions))
        rq = apply_rotary(q.expand(1, 1, 2, HEAD_DIM), cos, sin)
        rk = apply_rotary(k.expand(1, 1, 2, HEAD_DIM), cos, sin)
        # A rotation: norms kept, up to cos² + sin² = 1 ± 2·U32 from their float32 rounding.
        torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1).expand(1, 1, 2), atol=0, rtol=2 * U32)
        scores.append(float(rq[0, 0, 1] @ rk[0, 0, 0]))  # query at the later position, key 4 back
    # Relative: the score depends on the offset (4) alone, up to float32 angles (<= 18 rad, each off by
    # <= 2·18·U32) and cos/sin roundings, in each of the two rotated vectors.
    assert max(scores) - min(scores) <= 2 * (2 * 18 + 2) * U32 * float(q.norm() * k.norm())


def test_unknown_rope_type_names_it_and_the_supported_ones() -> None:
    with pytest.raises(UnsupportedCheckpointError, match=r"'su'.*default, linear, dynamic, llama3, yarn"):
        Rope.from_config({"rope_scaling": {"type": "su", "factor": 2.0}}, head_dim=HEAD_DIM)
