"""Llama checkpoints (Llama 2 and 3.x, SmolLM2, TinyLlama, ...) -> our rotary decoder."""

from __future__ import annotations

from typing import Any

from mha.loading.convert.decoder import decoder_config, decoder_converter
from mha.networks.model import TransformerConfig

__all__ = ["LLAMA"]


def config_from_hf(cfg: Any) -> TransformerConfig:
    bias = bool(getattr(cfg, "attention_bias", False))
    return decoder_config(
        cfg, family="llama", attention_bias=bias, mlp_bias=bool(getattr(cfg, "mlp_bias", False))
    )


LLAMA = decoder_converter("llama", config_from_hf)
