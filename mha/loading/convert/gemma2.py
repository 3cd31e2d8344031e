"""Gemma 2 checkpoints -> our rotary decoder: embeddings scaled by sqrt(hidden), RMSNorm by (1 + w), a norm
before and after both the attention and the feed-forward, logits scaled by query_pre_attn_scalar^-1/2 and
soft-capped, a sliding window on every other layer (`layer_types`), GeGLU."""

from __future__ import annotations

from typing import Any

from mha.loading.convert.decoder import (
    DecoderLayout,
    decoder_config,
    decoder_converter,
    layer_types_windows,
)
from mha.networks.model import TransformerConfig

__all__ = ["GEMMA2", "LAYOUT", "gemma_fields"]

# Gemma 2's post_attention_layernorm normalises the attention's output; pre_feedforward_layernorm is the
# feed-forward's input norm (Llama's post_attention_layernorm).
LAYOUT = DecoderLayout(
    norms={
        "attn_norm": "input_layernorm",
        "attn_post_norm": "post_attention_layernorm",
        "ffn_norm": "pre_feedforward_layernorm",
        "ffn_post_norm": "post_feedforward_layernorm",
    }
)


def gemma_fields(cfg: Any) -> dict[str, Any]:
    """The TransformerConfig fields Gemma 2 and Gemma 3 set alike: biases, the query_pre_attn_scalar
    scale, the soft-caps (None in Gemma 3), the sqrt(hidden) embedding scale, norms by 1 + w and the norms
    after each sub-layer."""
    return {
        "attention_bias": bool(getattr(cfg, "attention_bias", False)),
        "attention_scale": cfg.query_pre_attn_scalar**-0.5,
        "attention_softcap": getattr(cfg, "attn_logit_softcapping", None),
        "final_softcap": getattr(cfg, "final_logit_softcapping", None),
        "embed_scale": cfg.hidden_size**0.5,
        "norm_offset": 1.0,
        "sandwich_norm": True,
    }


def config_from_hf(cfg: Any) -> TransformerConfig:
    return decoder_config(cfg, family="gemma2", window_layers=layer_types_windows(cfg), **gemma_fields(cfg))


GEMMA2 = decoder_converter("gemma2", config_from_hf, LAYOUT)
