"""TransformerConfig: every choice a Transformer is built from (mha.networks.model), BERT's and GPT-2's by
default, and the fields today's rotary decoders set (mha.loading.convert.decoder)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from mha.core.rope import Rope

__all__ = ["ACTIVATIONS", "ARCHITECTURES", "POSITIONS", "TransformerConfig"]

# The activations mha.core.layers implements ("gelu_tanh" is GPT-2's gelu_new, "silu" Llama's)
ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "silu")
ARCHITECTURES = ("encoder", "decoder")
# "learned": a position table; "rotary": q and k rotated (mha.core.rope); "relative": T5's bucketed bias on
# the logits (mha.core.relative); "sinusoidal": Marian's fixed sin/cos table, computed, never loaded
POSITIONS = ("learned", "rotary", "relative", "sinusoidal")


@dataclass(frozen=True)
class TransformerConfig:
    vocab_size: int = 30522  # BERT's uncased WordPiece vocabulary
    max_positions: int = 512  # rows of the position embedding table
    type_vocab_size: int = 2  # segment embeddings; 0 means the model has none (DistilBERT, GPT-2)
    embed_dim: int = 384  # E
    num_heads: int = 12  # H
    num_layers: int = 6  # L
    ffn_dim: int = 1536  # F, the feed-forward hidden width
    activation: str = "gelu"  # "gelu" (erf, BERT), "gelu_tanh" (GPT-2's gelu_new) or "relu"
    layer_norm_eps: float = 1e-12  # BERT's; GPT-2 uses 1e-5
    architecture: str = "encoder"  # "encoder": post-LN, bidirectional; "decoder": pre-LN, causal, final LN
    embedding_norm: bool = True  # LayerNorm right after the embeddings (BERT family)
    position_offset: int = 0  # RoBERTa counts positions from padding_idx + 1
    pad_token_id: int | None = 0  # RoBERTa derives position ids from where the padding is
    dropout: float = 0.1  # on hidden states (training only)
    attention_dropout: float = 0.1  # on attention weights (training only)
    # -- what today's decoders change (the defaults are BERT's and GPT-2's) --
    num_kv_heads: int | None = None  # grouped-query heads: H_kv dividing H (None: H)
    head_dim: int | None = None  # None: E // H
    positions: str = "learned"  # one of POSITIONS
    rope: Rope | None = None
    local_rope: Rope | None = None  # the window layers' own rope, where it differs (Gemma 3's local base)
    norm: str = "layer"  # "layer" (LayerNorm) or "rms" (RMSNorm)
    norm_offset: float = 0.0  # Gemma's RMSNorm scales by (1 + w)
    mlp: str = "plain"  # "plain" fc_out(act(fc_in x)) or "gated" down(act(gate x) · up x)
    mlp_bias: bool = True
    attention_bias: bool = True  # on the q, k and v projections
    out_bias: bool | None = None  # on the attention's output projection (None: attention_bias)
    qk_norm: bool = False  # Qwen3's per-head RMSNorm of q and k
    attention_scale: float | None = None  # None: 1 / sqrt(head_dim)
    attention_softcap: float | None = None  # Gemma 2: cap · tanh(logits / cap)
    # Gemma 2's output logits, capped the same way: no argmax changes, but a distribution does
    # (mha.analysis.ablation)
    final_softcap: float | None = None
    embed_scale: float | None = None  # Gemma multiplies the token embeddings by sqrt(E)
    sandwich_norm: bool = False  # Gemma 2's norms after the attention and the feed-forward too
    sliding_window: int | None = None  # keys j > i - W, on the layers `window_layers` names
    window_layers: tuple[int, ...] = ()
    # -- what the encoder-decoder families change (mha.networks.seq2seq) --
    pre_norm: bool | None = None  # None: the architecture's (pre-norm decoder, post-norm encoder); T5 and
    # BART set it against that. A pre-norm stack ends in a final norm.
    relative_buckets: int = 32  # T5's relative_attention_num_buckets
    relative_max_distance: int = 128  # T5's relative_attention_max_distance
    # T5: a float16 residual stream is clamped short of ±inf after each sub-layer's residual add where any
    # value overflowed (transformers' T5Block), so one overflow does not make the rest of the stack NaN
    clamp_float16: bool = False
    # T5: in a float16 model the feed-forward's output projection stays float32 (transformers keeps its
    # `wo` so, _keep_in_fp32_modules), its input cast up to it: the residual stream is float32 after it
    float32_ffn_out: bool = False

    def __post_init__(self) -> None:
        for field in ("vocab_size", "max_positions", "embed_dim", "num_heads", "num_layers", "ffn_dim"):
            if getattr(self, field) <= 0:
                raise ValueError(f"{field} ({getattr(self, field)}) must be positive")
        if self.head_dim is None and self.embed_dim % self.num_heads:
            raise ValueError(f"embed_dim ({self.embed_dim}) is not divisible by num_heads ({self.num_heads})")
        if self.num_kv_heads is not None and (self.num_kv_heads <= 0 or self.num_heads % self.num_kv_heads):
            raise ValueError(
                f"num_heads ({self.num_heads}) is not divisible by num_kv_heads ({self.num_kv_heads})"
            )
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation ({self.activation!r}) must be one of {ACTIVATIONS}")
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"architecture ({self.architecture!r}) must be one of {ARCHITECTURES}")
        for field, allowed in (
            ("positions", POSITIONS),
            ("norm", ("layer", "rms")),
            ("mlp", ("plain", "gated")),
        ):
            if getattr(self, field) not in allowed:
                raise ValueError(f"{field} ({getattr(self, field)!r}) must be one of {allowed}")
        if not math.isfinite(self.layer_norm_eps) or self.layer_norm_eps < 0:
            raise ValueError(f"layer_norm_eps ({self.layer_norm_eps}) must be a finite number >= 0")
        if (self.positions == "rotary") != (self.rope is not None):
            raise ValueError("rotary positions need a rope, and a rope needs positions='rotary'")
        if self.local_rope is not None and not (self.rope is not None and self.window_layers):
            raise ValueError("a local rope is the window layers' own: it needs a rope and window_layers")
        if self.relative_buckets <= 0 or self.relative_max_distance <= 0:
            raise ValueError(
                f"relative_buckets ({self.relative_buckets}) and relative_max_distance "
                f"({self.relative_max_distance}) must be positive"
            )
        if self.window_layers and self.sliding_window is None:
            raise ValueError("window_layers name layers but sliding_window is None")
        if any(not 0 <= i < self.num_layers for i in self.window_layers):
            raise ValueError(f"window_layers {self.window_layers} must lie in 0..{self.num_layers - 1}")
        if self.position_offset < 0 or self.position_offset >= self.max_positions:
            raise ValueError(
                f"position_offset ({self.position_offset}) must be below max_positions ({self.max_positions})"
            )

    @property
    def causal(self) -> bool:
        return self.architecture == "decoder"

    @property
    def is_pre_norm(self) -> bool:
        """Each sub-layer reads norm(x) and the stack ends in a final norm (GPT-2, Llama, T5), rather than
        norm(x + sub-layer(x)) (BERT, BART, Marian)."""
        return self.causal if self.pre_norm is None else self.pre_norm

    @property
    def max_tokens(self) -> int:
        """The longest input the position table can address."""
        return self.max_positions - self.position_offset
