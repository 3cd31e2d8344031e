"""Llama checkpoints (Llama 2 and 3.x, SmolLM2, TinyLlama, ...) -> our rotary decoder."""

from __future__ import annotations

from typing import Any

from mha.loading.convert.base import Converter
from mha.loading.convert.decoder import decoder_config, decoder_key_map, decoder_signature
from mha.networks.model import TransformerConfig

__all__ = ["LLAMA"]


def config_from_hf(cfg: Any) -> TransformerConfig:
    bias = bool(getattr(cfg, "attention_bias", False))
    return decoder_config(
        cfg, family="llama", attention_bias=bias, mlp_bias=bool(getattr(cfg, "mlp_bias", False))
    )


LLAMA = Converter(
    family="llama", config_from_hf=config_from_hf, key_map=decoder_key_map, signature=decoder_signature()
)
