"""DistilBERT checkpoints -> our post-LN encoder (no segment embeddings, LayerNorm eps fixed at 1e-12)."""

from __future__ import annotations

from typing import Any

from mha.convert import Converter, KeyMap, activation_from_hf
from mha.model import TransformerConfig

__all__ = ["DISTILBERT", "config_from_hf", "key_map"]


def config_from_hf(cfg: Any) -> TransformerConfig:
    return TransformerConfig(
        vocab_size=cfg.vocab_size,
        max_positions=cfg.max_position_embeddings,
        type_vocab_size=0,
        embed_dim=cfg.dim,
        num_heads=cfg.n_heads,
        num_layers=cfg.n_layers,
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
    for i in range(config.num_layers):
        ours, theirs = f"layers.{i}.", f"transformer.layer.{i}."
        for p in ("weight", "bias"):
            sources[f"{ours}attn.in_proj.{p}"] = tuple(
                f"{theirs}attention.{name}.{p}" for name in ("q_lin", "k_lin", "v_lin")
            )
            sources[f"{ours}attn.out_proj.{p}"] = (f"{theirs}attention.out_lin.{p}",)
            sources[f"{ours}attn_norm.{p}"] = (f"{theirs}sa_layer_norm.{p}",)
            sources[f"{ours}ffn.fc_in.{p}"] = (f"{theirs}ffn.lin1.{p}",)
            sources[f"{ours}ffn.fc_out.{p}"] = (f"{theirs}ffn.lin2.{p}",)
            sources[f"{ours}ffn_norm.{p}"] = (f"{theirs}output_layer_norm.{p}",)
    return KeyMap(sources=sources, ignored=(r"^embeddings\.position_ids$",), prefixes=("distilbert.",))


DISTILBERT = Converter(family="distilbert", config_from_hf=config_from_hf, key_map=key_map)
