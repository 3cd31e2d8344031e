"""BART checkpoints -> our encoder-decoder (mha.networks.seq2seq), and what Marian shares with it.

Both stacks are post-norm (LayerNorm after each residual, as BERT), with biases everywhere. BART adds
learned positions counted from 2 (its table has max_position_embeddings + 2 rows), a LayerNorm on the
embeddings of each stack and, where scale_embedding is set, sqrt(d_model) on the token embeddings;
generation adds `final_logits_bias` to the logits. Marian (mha.loading.convert.marian) is the same layer with
sinusoidal positions and no embedding norm, so both key maps are `seq2seq_key_map`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from mha.loading.convert.base import Converter, KeyMap, activation_from_hf, forced_tokens, layer_sources
from mha.networks.model import TransformerConfig
from mha.networks.seq2seq import Seq2SeqConfig

__all__ = ["BART", "config_from_hf", "seq2seq_config", "seq2seq_converter", "seq2seq_key_map"]

# BART's positions start at 2: rows 0 and 1 of its table are never read (fairseq's padding offset).
POSITION_OFFSET = 2

# our module -> theirs, relative to model.{stack}.layers.{i}.; q, k and v fuse into our in_proj
LAYER = {
    "attn.in_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "attn.out_proj": ("self_attn.out_proj",),
    "attn_norm": ("self_attn_layer_norm",),
    "ffn.fc_in": ("fc1",),
    "ffn.fc_out": ("fc2",),
    "ffn_norm": ("final_layer_norm",),
}
CROSS = {
    "cross_attn.in_proj": ("encoder_attn.q_proj", "encoder_attn.k_proj", "encoder_attn.v_proj"),
    "cross_attn.out_proj": ("encoder_attn.out_proj",),
    "cross_norm": ("encoder_attn_layer_norm",),
}


def seq2seq_config(
    cfg: Any, *, positions: str, shared_embeddings: bool = True, **fields: Any
) -> Seq2SeqConfig:
    """BART's and Marian's config: their post-norm stacks, positions and `fields` as the family says."""
    encoder = TransformerConfig(
        vocab_size=cfg.vocab_size,
        type_vocab_size=0,
        embed_dim=cfg.d_model,
        num_heads=cfg.encoder_attention_heads,
        num_layers=cfg.encoder_layers,
        ffn_dim=cfg.encoder_ffn_dim,
        activation=activation_from_hf(cfg.activation_function, family=cfg.model_type),
        layer_norm_eps=1e-5,  # torch's LayerNorm default, which both families build with
        architecture="encoder",
        pad_token_id=None,  # positions count 0..T-1 whatever the padding
        dropout=0.0,
        attention_dropout=0.0,
        positions=positions,
        embed_scale=math.sqrt(cfg.d_model) if cfg.scale_embedding else None,
        **fields,
    )
    decoder = replace(
        encoder,
        vocab_size=getattr(cfg, "decoder_vocab_size", None) or cfg.vocab_size,
        num_heads=cfg.decoder_attention_heads,
        num_layers=cfg.decoder_layers,
        ffn_dim=cfg.decoder_ffn_dim,
        architecture="decoder",
        pre_norm=False,  # causal, yet post-norm like its encoder
    )
    return Seq2SeqConfig(
        encoder=encoder,
        decoder=decoder,
        decoder_start_token_id=cfg.decoder_start_token_id,
        shared_embeddings=shared_embeddings,
        **forced_tokens(cfg),
    )


def config_from_hf(cfg: Any) -> Seq2SeqConfig:
    return seq2seq_config(
        cfg,
        positions="learned",
        max_positions=cfg.max_position_embeddings + POSITION_OFFSET,
        position_offset=POSITION_OFFSET,
        embedding_norm=True,
    )


def seq2seq_key_map(config: Seq2SeqConfig, *, embeddings: dict[str, tuple[str, ...]]) -> KeyMap:
    """BART's and Marian's key map: `embeddings` (our embedding weights -> theirs), then each stack's
    layers; their LM head and logits bias are read only to generate (mha.model.attention_model)."""
    sources = dict(embeddings)
    for stack, stack_config in (("encoder", config.encoder), ("decoder", config.decoder)):
        table = {**LAYER, **(CROSS if stack == "decoder" else {})}
        sources.update(
            layer_sources(stack_config.num_layers, f"{stack}.layers.{{i}}.", table, ours=f"{stack}.layers")
        )
    return KeyMap(
        sources=sources,
        ignored=(
            r"^(model\.)?(encoder|decoder)\.version$",
            r"^(model\.)?(encoder|decoder)\.embed_tokens\.weight$",  # tied copies of `shared`
            r"^(model\.)?(encoder|decoder)\.embed_positions\.weight$",  # Marian's: recomputed
            r"^lm_head\.",
            r"^final_logits_bias$",
        ),
        prefixes=("model.",),
    )


def key_map(config: Seq2SeqConfig) -> KeyMap:
    embeddings: dict[str, tuple[str, ...]] = {}
    for stack in ("encoder", "decoder"):
        embeddings[f"{stack}.embeddings.token.weight"] = ("shared.weight",)
        embeddings[f"{stack}.embeddings.position.weight"] = (f"{stack}.embed_positions.weight",)
        for p in ("weight", "bias"):
            embeddings[f"{stack}.embeddings.norm.{p}"] = (f"{stack}.layernorm_embedding.{p}",)
    return seq2seq_key_map(config, embeddings=embeddings)


# the encoder's first query, bare (BartModel) or under the task model's prefix; Marian's keys are BART's
SIGNATURE = r"^(model\.)?encoder\.layers\.0\.self_attn\.q_proj\.weight$"


def seq2seq_converter(
    family: str,
    config_from_hf: Callable[[Any], Seq2SeqConfig],
    key_map: Callable[[Seq2SeqConfig], KeyMap],
    *,
    slow_tokenizer: bool = False,
) -> Converter:
    """A converter of BART's layer (BART's own, Marian's): their keys' SIGNATURE, and the logits bias
    generation adds (`final_logits_bias`); slow_tokenizer as Converter's."""
    return Converter(
        family=family,
        config_from_hf=config_from_hf,
        key_map=key_map,
        signature=SIGNATURE,
        logits_bias="final_logits_bias",
        slow_tokenizer=slow_tokenizer,
    )


BART = seq2seq_converter("bart", config_from_hf, key_map)
