"""Phi-3 checkpoints -> our rotary decoder: q, k and v already fused (qkv_proj), gate and up too
(gate_up_proj); LongRoPE for the 128k models; `sliding_window`, when set, windows every layer."""

from __future__ import annotations

from typing import Any

from mha.loading.convert.base import Converter, KeyMap
from mha.loading.convert.decoder import DecoderLayout, decoder_config, decoder_key_map, decoder_signature
from mha.networks.model import TransformerConfig

__all__ = ["PHI3"]

LAYOUT = DecoderLayout(fused_qkv="self_attn.qkv_proj", fused_gate_up="mlp.gate_up_proj")


def config_from_hf(cfg: Any) -> TransformerConfig:
    return decoder_config(cfg, family="phi3")


def key_map(config: TransformerConfig) -> KeyMap:
    return decoder_key_map(config, LAYOUT)


PHI3 = Converter(
    family="phi3", config_from_hf=config_from_hf, key_map=key_map, signature=decoder_signature(LAYOUT)
)
