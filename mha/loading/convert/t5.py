"""T5 (v1.0 and v1.1, Flan-T5) and mT5 checkpoints -> our encoder-decoder (mha.networks.seq2seq).

Both stacks are pre-norm with T5's RMSNorm (a weight, no bias), no biases anywhere, no 1/sqrt(D) scaling of
the logits, and relative position bias read from each stack's first layer. Its feed-forward is ReLU
(v1.0) or gated GELU (v1.1, mT5: wi_0 the gate, wi_1 the up projection, fused into our fc_in). mT5's
config and weights are T5's, under its own model_type.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from mha.loading.convert.base import Converter, KeyMap, activation_from_hf, forced_tokens, layer_sources
from mha.networks.model import TransformerConfig
from mha.networks.seq2seq import Seq2SeqConfig

__all__ = ["MT5", "T5", "config_from_hf", "key_map"]

# T5 checkpoints have no position limit (relative positions); n_positions, where a config names it, is
# the length the model was trained on, and the tokenizers' model_max_length is 512.
DEFAULT_MAX_TOKENS = 512

# our module -> theirs, relative to {stack}.block.{i}.layer.; q, k and v fuse into our in_proj
ATTENTION = ("SelfAttention.q", "SelfAttention.k", "SelfAttention.v")
CROSS = ("EncDecAttention.q", "EncDecAttention.k", "EncDecAttention.v")


def config_from_hf(cfg: Any) -> Seq2SeqConfig:
    gated = bool(getattr(cfg, "is_gated_act", False))
    encoder = TransformerConfig(
        vocab_size=cfg.vocab_size,
        max_positions=getattr(cfg, "n_positions", None) or DEFAULT_MAX_TOKENS,
        type_vocab_size=0,
        embed_dim=cfg.d_model,
        num_heads=cfg.num_heads,
        head_dim=cfg.d_kv,
        num_layers=cfg.num_layers,
        ffn_dim=cfg.d_ff,
        activation=activation_from_hf(cfg.dense_act_fn, family=cfg.model_type),
        layer_norm_eps=cfg.layer_norm_epsilon,
        architecture="encoder",
        pre_norm=True,
        embedding_norm=False,
        pad_token_id=None,  # positions are relative: nothing counts them from the padding
        dropout=0.0,
        attention_dropout=0.0,
        positions="relative",
        relative_buckets=cfg.relative_attention_num_buckets,
        relative_max_distance=cfg.relative_attention_max_distance,
        norm="rms",
        mlp="gated" if gated else "plain",
        mlp_bias=False,
        attention_bias=False,
        attention_scale=1.0,  # T5 folds 1/sqrt(d) into its initialisation instead
        clamp_float16=True,  # as transformers' T5Block, after each sub-layer
        float32_ffn_out=True,  # as transformers keeps its `wo` in a float16 model
    )
    decoder = replace(encoder, architecture="decoder", num_layers=cfg.num_decoder_layers)
    start = cfg.decoder_start_token_id
    return Seq2SeqConfig(
        encoder=encoder,
        decoder=decoder,
        decoder_start_token_id=cfg.pad_token_id if start is None else start,
        **forced_tokens(cfg),
        # transformers' T5 scales where scale_decoder_outputs (its tied head); mT5's never does
        logits_scale=cfg.d_model**-0.5 if getattr(cfg, "scale_decoder_outputs", False) else 1.0,
    )


def key_map(config: Seq2SeqConfig) -> KeyMap:
    sources: dict[str, tuple[str, ...]] = {
        "encoder.embeddings.token.weight": ("shared.weight",),
        "decoder.embeddings.token.weight": ("shared.weight",),
        "encoder.final_norm.weight": ("encoder.final_layer_norm.weight",),
        "decoder.final_norm.weight": ("decoder.final_layer_norm.weight",),
    }
    for stack, stack_config in (("encoder", config.encoder), ("decoder", config.decoder)):
        bias = f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
        sources[f"{stack}.relative_bias.embedding.weight"] = (bias,)
        ffn_layer = 1 if stack == "encoder" else 2  # the decoder's cross-attention is its layer 1
        dense = f"{ffn_layer}.DenseReluDense"
        gated = stack_config.mlp == "gated"
        table: dict[str, tuple[str, ...]] = {
            "attn.in_proj": tuple(f"0.{m}" for m in ATTENTION),
            "attn.out_proj": ("0.SelfAttention.o",),
            "attn_norm": ("0.layer_norm",),
            "ffn.fc_in": (f"{dense}.wi_0", f"{dense}.wi_1") if gated else (f"{dense}.wi",),
            "ffn.fc_out": (f"{dense}.wo",),
            "ffn_norm": (f"{ffn_layer}.layer_norm",),
        }
        if stack == "decoder":
            table.update(
                {
                    "cross_attn.in_proj": tuple(f"1.{m}" for m in CROSS),
                    "cross_attn.out_proj": ("1.EncDecAttention.o",),
                    "cross_norm": ("1.layer_norm",),
                }
            )
        sources.update(
            layer_sources(
                stack_config.num_layers,
                f"{stack}.block.{{i}}.layer.",
                table,
                ours=f"{stack}.layers",
                params=("weight",),
            )
        )
    return KeyMap(
        sources=sources,
        # Tied copies of `shared` (older checkpoints save them), the LM head (read only to generate) and
        # the cross-attention table transformers never uses.
        ignored=(
            r"^(encoder|decoder)\.embed_tokens\.weight$",
            r"^lm_head\.",
            r"EncDecAttention\.relative_attention_bias\.weight$",
        ),
    )


# the encoder's first query; mT5's keys are T5's
SIGNATURE = r"^encoder\.block\.0\.layer\.0\.SelfAttention\.q\.weight$"
T5 = Converter(family="t5", config_from_hf=config_from_hf, key_map=key_map, signature=SIGNATURE)
MT5 = Converter(family="mt5", config_from_hf=config_from_hf, key_map=key_map, signature=SIGNATURE)
