"""GPT-2 checkpoints -> our pre-LN causal decoder.

GPT-2 stores its projections as Conv1D, (in, out): every such weight is named in TRANSPOSED and turned
into Linear's (out, in) here, as nanoGPT's from_pretrained does.
"""

from __future__ import annotations

from typing import Any

from mha.convert import Converter, KeyMap, activation_from_hf
from mha.errors import UnsupportedCheckpointError
from mha.model import TransformerConfig

__all__ = ["GPT2", "TRANSPOSED", "config_from_hf", "key_map"]

# Conv1D weights, per layer, relative to h.{i}.
TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def config_from_hf(cfg: Any) -> TransformerConfig:
    if not getattr(cfg, "scale_attn_weights", True) or getattr(cfg, "scale_attn_by_inverse_layer_idx", False):
        raise UnsupportedCheckpointError(
            "gpt2 checkpoint scales attention differently (scale_attn_weights=False or "
            "scale_attn_by_inverse_layer_idx=True); only the standard 1/sqrt(head_dim) is supported"
        )
    if getattr(cfg, "add_cross_attention", False):
        raise UnsupportedCheckpointError("gpt2 checkpoint has cross-attention layers; not supported")
    return TransformerConfig(
        vocab_size=cfg.vocab_size,
        max_positions=cfg.n_positions,
        type_vocab_size=0,
        embed_dim=cfg.n_embd,
        num_heads=cfg.n_head,
        num_layers=cfg.n_layer,
        ffn_dim=cfg.n_inner if cfg.n_inner is not None else 4 * cfg.n_embd,
        activation=activation_from_hf(cfg.activation_function, family="gpt2"),
        layer_norm_eps=cfg.layer_norm_epsilon,
        architecture="decoder",
        embedding_norm=False,
        pad_token_id=None,
        dropout=cfg.resid_pdrop,
        attention_dropout=cfg.attn_pdrop,
    )


def key_map(config: TransformerConfig) -> KeyMap:
    sources: dict[str, tuple[str, ...]] = {
        "embeddings.token.weight": ("wte.weight",),
        "embeddings.position.weight": ("wpe.weight",),
        "final_norm.weight": ("ln_f.weight",),
        "final_norm.bias": ("ln_f.bias",),
    }
    transposed = []
    for i in range(config.num_layers):
        ours, theirs = f"layers.{i}.", f"h.{i}."
        for p in ("weight", "bias"):
            sources[f"{ours}attn_norm.{p}"] = (f"{theirs}ln_1.{p}",)
            sources[f"{ours}attn.in_proj.{p}"] = (f"{theirs}attn.c_attn.{p}",)  # already q, k, v in order
            sources[f"{ours}attn.out_proj.{p}"] = (f"{theirs}attn.c_proj.{p}",)
            sources[f"{ours}ffn_norm.{p}"] = (f"{theirs}ln_2.{p}",)
            sources[f"{ours}ffn.fc_in.{p}"] = (f"{theirs}mlp.c_fc.{p}",)
            sources[f"{ours}ffn.fc_out.{p}"] = (f"{theirs}mlp.c_proj.{p}",)
        transposed += [theirs + name for name in TRANSPOSED]
    return KeyMap(
        sources=sources,
        transposed=frozenset(transposed),
        # The causal-mask buffers of older checkpoints; we build the mask ourselves.
        ignored=(r"^h\.\d+\.attn\.(bias|masked_bias)$",),
        prefixes=("transformer.",),
    )


GPT2 = Converter(family="gpt2", config_from_hf=config_from_hf, key_map=key_map, pair_template=False)
