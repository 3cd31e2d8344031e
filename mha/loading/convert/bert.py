"""BERT (MiniLM included) and RoBERTa checkpoints -> our post-LN encoder.

RoBERTa is BERT with positions counted from padding_idx + 1 and a single segment type.
"""

from __future__ import annotations

from typing import Any

from mha.errors import UnsupportedCheckpointError
from mha.loading.convert.base import Converter, KeyMap, activation_from_hf, base_config, layer_sources
from mha.networks.model import TransformerConfig

__all__ = ["BERT", "ROBERTA", "config_from_hf", "key_map"]

# our module -> theirs, relative to encoder.layer.{i}.; query, key and value fuse into our in_proj
LAYER = {
    "attn.in_proj": ("attention.self.query", "attention.self.key", "attention.self.value"),
    "attn.out_proj": ("attention.output.dense",),
    "attn_norm": ("attention.output.LayerNorm",),
    "ffn.fc_in": ("intermediate.dense",),
    "ffn.fc_out": ("output.dense",),
    "ffn_norm": ("output.LayerNorm",),
}


def _check_options(cfg: Any, family: str) -> None:
    kind = getattr(cfg, "position_embedding_type", "absolute")
    if kind not in (None, "absolute"):
        raise UnsupportedCheckpointError(
            f"{family} checkpoint uses position_embedding_type {kind!r}; only 'absolute' is supported"
        )
    if getattr(cfg, "is_decoder", False):
        raise UnsupportedCheckpointError(f"{family} checkpoint is configured as a decoder (is_decoder=True)")


def config_from_hf(cfg: Any, *, roberta: bool = False) -> TransformerConfig:
    family = "roberta" if roberta else "bert"
    _check_options(cfg, family)
    pad = cfg.pad_token_id
    return base_config(
        cfg,
        type_vocab_size=cfg.type_vocab_size,
        ffn_dim=cfg.intermediate_size,
        activation=activation_from_hf(cfg.hidden_act, family=family),
        layer_norm_eps=cfg.layer_norm_eps,
        architecture="encoder",
        embedding_norm=True,
        position_offset=pad + 1 if roberta else 0,
        pad_token_id=pad,
        dropout=cfg.hidden_dropout_prob,
        attention_dropout=cfg.attention_probs_dropout_prob,
    )


def key_map(config: TransformerConfig, *, roberta: bool = False) -> KeyMap:
    sources: dict[str, tuple[str, ...]] = {
        "embeddings.token.weight": ("embeddings.word_embeddings.weight",),
        "embeddings.position.weight": ("embeddings.position_embeddings.weight",),
        "embeddings.norm.weight": ("embeddings.LayerNorm.weight",),
        "embeddings.norm.bias": ("embeddings.LayerNorm.bias",),
    }
    if config.type_vocab_size:
        sources["embeddings.segment.weight"] = ("embeddings.token_type_embeddings.weight",)
    sources.update(layer_sources(config.num_layers, "encoder.layer.{i}.", LAYER))
    return KeyMap(
        sources=sources,
        ignored=(r"^embeddings\.position_ids$", r"^embeddings\.token_type_ids$", r"^pooler\."),
        prefixes=("roberta.",) if roberta else ("bert.",),
    )


def _signature(prefix: str) -> str:
    """The first layer's query, bare (BertModel) or under the task model's prefix."""
    return rf"^({prefix}\.)?encoder\.layer\.0\.attention\.self\.query\.weight$"


BERT = Converter(family="bert", config_from_hf=config_from_hf, key_map=key_map, signature=_signature("bert"))
ROBERTA = Converter(
    family="roberta",
    config_from_hf=lambda cfg: config_from_hf(cfg, roberta=True),
    key_map=lambda config: key_map(config, roberta=True),
    signature=_signature("roberta"),
)
