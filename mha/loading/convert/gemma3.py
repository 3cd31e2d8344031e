"""Gemma 3 checkpoints -> our rotary decoder: Gemma 2's layer (embeddings scaled by sqrt(hidden), RMSNorm by
(1 + w), a norm before and after both sub-layers, logits scaled by query_pre_attn_scalar^-1/2, GeGLU) with
Gemma 3's changes: a per-head q and k norm (also by 1 + w), local sliding-window layers interleaved with
global ones (`layer_types`: five local to one global by default), and a rope of each kind's own
(`rope_parameters["sliding_attention"]`, the local base, and `["full_attention"]`, the global base with its
scaling), as transformers' Gemma3TextModel computes one table per layer type.

model_type "gemma3_text" is the text model (Gemma3ForCausalLM: the 1B, and what transformers' GGUF loader
reads a `gemma3` file as); "gemma3" is the image-and-text model (Gemma3ForConditionalGeneration), whose
text model is its `text_config` and whose weights sit under `model.language_model.` (transformers 5) or
`language_model.model.` (earlier); its vision tower is skipped: headscope reads text."""

from __future__ import annotations

import dataclasses
from typing import Any

from mha.core.rope import Rope
from mha.loading.convert.base import Converter, KeyMap
from mha.loading.convert.decoder import DecoderLayout, decoder_config, decoder_key_map, layer_types_windows
from mha.loading.convert.gemma2 import LAYOUT, gemma_fields
from mha.networks.model import TransformerConfig

__all__ = ["GEMMA3", "MODEL_TYPES"]

# config.json's model_type -> this converter (both the text model and the image-and-text one)
MODEL_TYPES = ("gemma3", "gemma3_text")
_TEXT_PREFIXES = ("model.language_model.", "language_model.model.", "model.")
_VISION = (r"^(model\.)?vision_tower\.", r"^(model\.)?multi_modal_projector\.")


def _text(cfg: Any) -> Any:
    """The text model's config: the image-and-text model's `text_config`, else the config itself."""
    return getattr(cfg, "text_config", None) or cfg


def _rope(cfg: Any, layer_type: str, head_dim: int) -> Rope:
    """The rope of one layer type: its entry of `rope_parameters` (keyed by layer type in Gemma 3), read as
    any rope is."""
    config = cfg.to_dict()
    params = (config.get("rope_parameters") or {}).get(layer_type)
    if params is None:  # a flat rope_parameters (or none): one rope for every layer
        return Rope.from_config(config, head_dim=head_dim)
    return Rope.from_config({**config, "rope_parameters": params}, head_dim=head_dim)


def config_from_hf(cfg: Any) -> TransformerConfig:
    text = _text(cfg)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    windows = layer_types_windows(text)
    main = _rope(text, "full_attention", head_dim)
    local = _rope(text, "sliding_attention", head_dim)
    return decoder_config(
        text,
        family="gemma3",
        window_layers=windows,
        rope=main,
        # The local table only where it differs and some layer reads it (a config of global layers only)
        local_rope=local if windows and local != main else None,
        qk_norm=True,
        **gemma_fields(text),
    )


def key_map(config: TransformerConfig) -> KeyMap:
    base = decoder_key_map(config, DecoderLayout(norms=LAYOUT.norms))
    return dataclasses.replace(base, prefixes=_TEXT_PREFIXES, ignored=(*base.ignored, *_VISION))


GEMMA3 = Converter(
    family="gemma3",
    config_from_hf=config_from_hf,
    key_map=key_map,
    # the first layer's query, bare, under the text model's prefix, or under the image-and-text model's
    signature=r"^(model\.)?(language_model\.(model\.)?)?layers\.0\.self_attn\.q_proj\.weight$",
)
