"""Qwen3 checkpoints -> our rotary decoder: a per-head RMSNorm of q and k before the rotation, head_dim
apart from hidden / heads."""

from __future__ import annotations

from typing import Any

from mha.loading.convert.decoder import (
    decoder_config,
    decoder_converter,
    layer_types_windows,
)
from mha.networks.model import TransformerConfig

__all__ = ["QWEN3"]


def config_from_hf(cfg: Any) -> TransformerConfig:
    return decoder_config(
        cfg,
        family="qwen3",
        window_layers=layer_types_windows(cfg),
        attention_bias=bool(getattr(cfg, "attention_bias", False)),
        qk_norm=True,
    )


QWEN3 = decoder_converter("qwen3", config_from_hf)
