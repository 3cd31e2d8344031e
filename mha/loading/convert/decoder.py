"""What the rotary decoder families (Llama, Mistral, Qwen2, Qwen3, Gemma 2 and 3, Phi-3) share: the config
fields they name alike, and one key map written as each family's differences.

Their checkpoints name a layer's parts `self_attn.{q,k,v,o}_proj`, `mlp.{gate,up,down}_proj` and the norms
around them; q, k and v fuse into our in_proj (rows q, then k, then v), gate and up into our fc_in (rows
gate, then up). A family module only says what differs (biases, q/k norms, Gemma 2's four norms, Phi-3's
already-fused projections, sliding windows, scaling).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from mha.core.rope import Rope
from mha.loading.convert.base import Converter, KeyMap, activation_from_hf
from mha.networks.model import TransformerConfig

__all__ = ["DecoderLayout", "decoder_config", "decoder_converter", "decoder_key_map", "decoder_signature"]

# our norm -> theirs, relative to layers.{i}. (Llama's names; Gemma 2 overrides them)
NORMS = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}


@dataclass(frozen=True)
class DecoderLayout:
    """How a family stores a layer, where it differs from Llama."""

    norms: Mapping[str, str] = field(default_factory=lambda: dict(NORMS))  # our norm -> their module
    fused_qkv: str | None = None  # their single q/k/v module (Phi-3's qkv_proj)
    fused_gate_up: str | None = None  # their single gate/up module (Phi-3's gate_up_proj)


def decoder_config(
    cfg: Any,
    *,
    family: str,
    window_layers: tuple[int, ...] | None = None,
    rope: Rope | None = None,
    **fields: Any,
) -> TransformerConfig:
    """A TransformerConfig for a rotary decoder from what its config answers to; `fields` are the
    family's own (biases, scale, soft-cap, ...). `window_layers` None: every layer windowed when the
    config names a sliding window (Mistral, Phi-3). `rope` None: the config's one rope."""
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    window = getattr(cfg, "sliding_window", None)
    if window_layers is None:
        window_layers = tuple(range(cfg.num_hidden_layers)) if window is not None else ()
    activation = getattr(cfg, "hidden_activation", None) or cfg.hidden_act
    return TransformerConfig(
        vocab_size=cfg.vocab_size,
        max_positions=cfg.max_position_embeddings,
        type_vocab_size=0,
        embed_dim=cfg.hidden_size,
        num_heads=heads,
        num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        num_layers=cfg.num_hidden_layers,
        ffn_dim=cfg.intermediate_size,
        activation=activation_from_hf(activation, family=family),
        layer_norm_eps=cfg.rms_norm_eps,
        architecture="decoder",
        embedding_norm=False,
        pad_token_id=None,
        dropout=0.0,
        attention_dropout=float(getattr(cfg, "attention_dropout", 0.0) or 0.0),
        positions="rotary",
        rope=rope or Rope.from_config(cfg.to_dict(), head_dim=head_dim),
        norm="rms",
        mlp="gated",
        sliding_window=window if window_layers else None,
        window_layers=window_layers,
        **{"mlp_bias": False, "attention_bias": False, **fields},
    )


def layer_types_windows(cfg: Any) -> tuple[int, ...]:
    """The layers a config's `layer_types` marks "sliding_attention" (Qwen2, Qwen3, Gemma 2)."""
    types = getattr(cfg, "layer_types", None) or ()
    return tuple(i for i, kind in enumerate(types) if kind == "sliding_attention")


def decoder_signature(layout: DecoderLayout = DecoderLayout()) -> str:
    """The first layer's query (Phi-3's fused q/k/v), bare (LlamaModel) or under the task model's prefix."""
    query = re.escape(layout.fused_qkv or "self_attn.q_proj")
    return rf"^(model\.)?layers\.0\.{query}\.weight$"


def decoder_key_map(config: TransformerConfig, layout: DecoderLayout = DecoderLayout()) -> KeyMap:
    sources: dict[str, tuple[str, ...]] = {
        "embeddings.token.weight": ("embed_tokens.weight",),
        "final_norm.weight": ("norm.weight",),
    }
    qkv: tuple[str, ...] = (
        (layout.fused_qkv,)
        if layout.fused_qkv
        else ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
    )
    gate_up: tuple[str, ...] = (
        (layout.fused_gate_up,) if layout.fused_gate_up else ("mlp.gate_proj", "mlp.up_proj")
    )
    out_bias = config.attention_bias if config.out_bias is None else config.out_bias
    for i in range(config.num_layers):
        layer: dict[str, tuple[tuple[str, ...], bool]] = {
            "attn.in_proj": (qkv, config.attention_bias),
            "attn.out_proj": (("self_attn.o_proj",), out_bias),
            "ffn.fc_in": (gate_up, config.mlp_bias),
            "ffn.fc_out": (("mlp.down_proj",), config.mlp_bias),
        }
        for ours, (theirs, bias) in layer.items():
            for p in ("weight", "bias") if bias else ("weight",):
                sources[f"layers.{i}.{ours}.{p}"] = tuple(f"layers.{i}.{t}.{p}" for t in theirs)
        norms = dict(layout.norms)
        if config.qk_norm:
            norms.update({"attn.q_norm": "self_attn.q_norm", "attn.k_norm": "self_attn.k_norm"})
        for our_norm, their_norm in norms.items():
            sources[f"layers.{i}.{our_norm}.weight"] = (f"layers.{i}.{their_norm}.weight",)
    return KeyMap(
        sources=sources,
        # The LM head is read only to continue a prompt; rotary tables are recomputed, never loaded.
        ignored=(r"^lm_head\.", r"rotary_emb\.inv_freq$"),
        prefixes=("model.",),
    )


def decoder_converter(
    family: str, config_from_hf: Callable[[Any], TransformerConfig], layout: DecoderLayout = DecoderLayout()
) -> Converter:
    """The Converter of a family whose checkpoints store a layer as `layout` says: decoder_key_map's keys
    and decoder_signature's query for that layout, `config_from_hf` the family's own."""
    return Converter(
        family=family,
        config_from_hf=config_from_hf,
        key_map=partial(decoder_key_map, layout=layout),
        signature=decoder_signature(layout),
    )
