"""Phi-3 checkpoints -> our rotary decoder: q, k and v already fused (qkv_proj), gate and up too
(gate_up_proj); LongRoPE for the 128k models; `sliding_window`, when set, windows every layer."""

from __future__ import annotations

from typing import Any

from mha.loading.convert.decoder import DecoderLayout, decoder_config, decoder_converter
from mha.networks.model import TransformerConfig

__all__ = ["PHI3"]

LAYOUT = DecoderLayout(fused_qkv="self_attn.qkv_proj", fused_gate_up="mlp.gate_up_proj")


def config_from_hf(cfg: Any) -> TransformerConfig:
    return decoder_config(cfg, family="phi3")


PHI3 = decoder_converter("phi3", config_from_hf, LAYOUT)
