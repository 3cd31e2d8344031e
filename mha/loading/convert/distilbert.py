"""DistilBERT checkpoints -> our post-LN encoder (no segment embeddings, LayerNorm eps fixed at 1e-12)."""

from __future__ import annotations

from typing import Any

from mha.loading.convert.base import Converter, KeyMap, activation_from_hf, base_config, layer_sources
from mha.networks.model import TransformerConfig

__all__ = ["DISTILBERT", "config_from_hf", "key_map"]

# our module -> theirs, relative to transformer.layer.{i}.; q_lin, k_lin and v_lin fuse into our in_proj
LAYER = {
    "attn.in_proj": ("attention.q_lin", "attention.k_lin", "attention.v_lin"),
    "attn.out_proj": ("attention.out_lin",),
    "attn_norm": ("sa_layer_norm",),
    "ffn.fc_in": ("ffn.lin1",),
    "ffn.fc_out": ("ffn.lin2",),
    "ffn_norm": ("output_layer_norm",),
}


def config_from_hf(cfg: Any) -> TransformerConfig:
    return base_config(
        cfg,
        type_vocab_size=0,
        ffn_dim=cfg.hidden_dim,
        activation=activation_from_hf(cfg.activation, family="distilbert"),
        layer_norm_eps=1e-12,  # hard-coded in transformers' DistilBERT, not in its config
        architecture="encoder",
        embedding_norm=True,
        pad_token_id=cfg.pad_token_id,
        dropout=cfg.dropout,
        attention_dropout=cfg.attention_dropout,
    )


def key_map(config: TransformerConfig) -> KeyMap:
    sources: dict[str, tuple[str, ...]] = {
        "embeddings.token.weight": ("embeddings.word_embeddings.weight",),
        # Sinusoidal checkpoints store their table here too, so one mapping covers both kinds.
        "embeddings.position.weight": ("embeddings.position_embeddings.weight",),
        "embeddings.norm.weight": ("embeddings.LayerNorm.weight",),
        "embeddings.norm.bias": ("embeddings.LayerNorm.bias",),
    }
    sources.update(layer_sources(config.num_layers, "transformer.layer.{i}.", LAYER))
    return KeyMap(sources=sources, ignored=(r"^embeddings\.position_ids$",), prefixes=("distilbert.",))


DISTILBERT = Converter(
    family="distilbert",
    config_from_hf=config_from_hf,
    key_map=key_map,
    signature=r"^(distilbert\.)?transformer\.layer\.0\.attention\.q_lin\.weight$",
)
