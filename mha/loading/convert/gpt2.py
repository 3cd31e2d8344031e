"""GPT-2 checkpoints -> our pre-LN causal decoder.

GPT-2 stores its projections as Conv1D, (in, out): every such weight is named in TRANSPOSED and turned
into Linear's (out, in) here, as nanoGPT's from_pretrained does.
"""

from __future__ import annotations

from typing import Any

from mha.errors import UnsupportedCheckpointError
from mha.loading.convert.base import Converter, KeyMap, activation_from_hf, base_config, layer_sources
from mha.networks.model import TransformerConfig

__all__ = ["GPT2", "TRANSPOSED", "config_from_hf", "key_map"]

# our module -> theirs, relative to h.{i}.; c_attn is already q, k, v in our in_proj's order
LAYER = {
    "attn_norm": ("ln_1",),
    "attn.in_proj": ("attn.c_attn",),
    "attn.out_proj": ("attn.c_proj",),
    "ffn_norm": ("ln_2",),
    "ffn.fc_in": ("mlp.c_fc",),
    "ffn.fc_out": ("mlp.c_proj",),
}
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
    return base_config(
        cfg,
        type_vocab_size=0,
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
    sources.update(layer_sources(config.num_layers, "h.{i}.", LAYER))
    return KeyMap(
        sources=sources,
        transposed=frozenset(f"h.{i}.{name}" for i in range(config.num_layers) for name in TRANSPOSED),
        # The causal-mask buffers of older checkpoints; we build the mask ourselves.
        ignored=(r"^h\.\d+\.attn\.(bias|masked_bias)$",),
        prefixes=("transformer.",),
    )


GPT2 = Converter(
    family="gpt2",
    config_from_hf=config_from_hf,
    key_map=key_map,
    signature=r"^(transformer\.)?h\.0\.attn\.c_attn\.weight$",
    pair_template=False,
)
