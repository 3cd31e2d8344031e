"""Qwen2 and Qwen2.5 checkpoints -> our rotary decoder: biases on q, k and v (not on o), and a sliding
window on the layers `layer_types` marks (`use_sliding_window` from `max_window_layers` on)."""

from __future__ import annotations

from typing import Any

from mha.loading.convert.decoder import (
    decoder_config,
    decoder_converter,
    layer_types_windows,
)
from mha.networks.model import TransformerConfig

__all__ = ["QWEN2"]


def config_from_hf(cfg: Any) -> TransformerConfig:
    return decoder_config(
        cfg, family="qwen2", window_layers=layer_types_windows(cfg), attention_bias=True, out_bias=False
    )


QWEN2 = decoder_converter("qwen2", config_from_hf)
