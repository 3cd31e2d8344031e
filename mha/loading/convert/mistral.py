"""Mistral checkpoints -> our rotary decoder; `sliding_window`, when set, windows every layer."""

from __future__ import annotations

from typing import Any

from mha.loading.convert.decoder import decoder_config, decoder_converter
from mha.networks.model import TransformerConfig

__all__ = ["MISTRAL"]


def config_from_hf(cfg: Any) -> TransformerConfig:
    return decoder_config(cfg, family="mistral")


MISTRAL = decoder_converter("mistral", config_from_hf)
