"""Transformers built from our MultiHeadAttention: BERT-style encoders, GPT-2-style decoders and today's
rotary decoders (Llama, Mistral, Qwen2, Qwen3, Gemma 2, Phi-3), each a TransformerConfig; the layers are
mha.layers'.

Shape legend: B batch, T tokens, E embed dim, H heads, L layers, F feed-forward width.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch
from torch import nn

from mha._memory import empty_buffer
from mha.attention import build_keep_mask
from mha.errors import Cancelled
from mha.layers import ACTIVATIONS, Block, Embeddings, make_norm
from mha.rope import Rope

__all__ = ["ACTIVATIONS", "ARCHITECTURES", "Transformer", "TransformerConfig", "TransformerOutput"]

ARCHITECTURES = ("encoder", "decoder")


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
    positions: str = "learned"  # "learned" (a position table) or "rotary" (q and k rotated by `rope`)
    rope: Rope | None = None
    norm: str = "layer"  # "layer" (LayerNorm) or "rms" (RMSNorm)
    norm_offset: float = 0.0  # Gemma's RMSNorm scales by (1 + w)
    mlp: str = "plain"  # "plain" fc_out(act(fc_in x)) or "gated" down(act(gate x) · up x)
    mlp_bias: bool = True
    attention_bias: bool = True  # on the q, k and v projections
    out_bias: bool | None = None  # on the attention's output projection (None: attention_bias)
    qk_norm: bool = False  # Qwen3's per-head RMSNorm of q and k
    attention_scale: float | None = None  # None: 1 / sqrt(head_dim)
    attention_softcap: float | None = None  # Gemma 2: cap · tanh(logits / cap)
    embed_scale: float | None = None  # Gemma multiplies the token embeddings by sqrt(E)
    sandwich_norm: bool = False  # Gemma 2's norms after the attention and the feed-forward too
    sliding_window: int | None = None  # keys j > i - W, on the layers `window_layers` names
    window_layers: tuple[int, ...] = ()

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
            ("positions", ("learned", "rotary")),
            ("norm", ("layer", "rms")),
            ("mlp", ("plain", "gated")),
        ):
            if getattr(self, field) not in allowed:
                raise ValueError(f"{field} ({getattr(self, field)!r}) must be one of {allowed}")
        if (self.positions == "rotary") != (self.rope is not None):
            raise ValueError("rotary positions need a rope, and a rope needs positions='rotary'")
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
    def max_tokens(self) -> int:
        """The longest input the position table can address."""
        return self.max_positions - self.position_offset


@dataclass
class TransformerOutput:
    hidden_state: torch.Tensor | None  # (B, T, E), the last layer's output; None when not asked for
    attentions: torch.Tensor | None  # (L, B, H, T, T), every layer's attention weights


class Transformer(nn.Module):
    """Embeddings, L blocks and (decoder only) a final norm -> hidden states and all attentions."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.final_norm = make_norm(config) if config.causal else None

    def position_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, T) positions: 0..T-1, or RoBERTa's count of non-pad tokens offset past padding_idx."""
        cfg = self.config
        if cfg.position_offset and cfg.pad_token_id is not None:
            # As HF's create_position_ids_from_input_ids: pads get padding_idx, others count from it + 1.
            real = input_ids.ne(cfg.pad_token_id).int()
            return (real.cumsum(1) * real + (cfg.position_offset - 1)).long()
        positions = torch.arange(
            cfg.position_offset, cfg.position_offset + input_ids.shape[1], device=input_ids.device
        )
        return positions.unsqueeze(0).expand_as(input_ids)

    def _keep_mask(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, *, window: int | None = None
    ) -> torch.Tensor | None:
        """One bool keep-mask (B|1, 1, T, T) for every layer (or every windowed layer): padded keys
        (attention_mask 0), in a decoder the causal triangle, and the sliding `window`; None when
        nothing is masked (the common single-text encoder case)."""
        batch, length = input_ids.shape
        padding = None
        if attention_mask is not None and not bool(attention_mask.all()):
            padding = attention_mask.bool().view(batch, 1, 1, length)  # any nonzero marks a real token
        return build_keep_mask(
            mask=padding,
            causal=self.config.causal,
            window=window,
            batch=batch,
            heads=1,
            tgt_len=length,
            src_len=length,
            device=input_ids.device,
        )

    def _rotary(
        self, position_ids: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """cos and sin (B|1, T, rotary dim) for every layer, or None without rotary positions."""
        rope = self.config.rope
        if rope is None:
            return None
        return rope.cos_sin(position_ids[:1] if position_ids.shape[0] > 1 else position_ids, dtype=dtype)

    def forward(
        self,
        input_ids: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        segment_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        need_weights: bool = True,
        need_hidden: bool = True,
        cancel: Callable[[], bool] | None = None,
    ) -> TransformerOutput:
        """input_ids (B, T); attention_mask (B, T) 1 for real tokens, 0 for padding; segment_ids (B, T).

        need_hidden=False (with need_weights) returns every attention but no hidden state, and skips the
        work no attention depends on: the last layer's value path, out_proj and feed-forward.
        cancel, called before each layer, stops the forward with `Cancelled` when it returns True.
        """
        if not (need_weights or need_hidden):
            raise ValueError("need_weights and need_hidden are both False: nothing to compute")
        cfg = self.config
        if input_ids.ndim != 2:
            raise ValueError(f"input_ids must have shape (B, T), got {tuple(input_ids.shape)}")
        batch, length = input_ids.shape
        if length > cfg.max_tokens:
            raise ValueError(f"input length ({length}) exceeds the model's maximum ({cfg.max_tokens})")
        if position_ids is None:
            position_ids = self.position_ids(input_ids)
        x = self.embeddings(input_ids, position_ids, segment_ids)  # (B, T, E)

        keep = self._keep_mask(input_ids, attention_mask)
        windowed = set(cfg.window_layers)
        window_keep = (
            self._keep_mask(input_ids, attention_mask, window=cfg.sliding_window) if windowed else None
        )
        rotary = self._rotary(position_ids, x.dtype)

        buffer = None
        if need_weights and not torch.is_grad_enabled():
            # Every layer's softmax writes straight into its slice: no stack copy at the end.
            buffer = empty_buffer(cfg.num_layers, batch, cfg.num_heads, length, length, like=x)
        layer_weights: list[torch.Tensor] = []
        last = len(self.layers) - 1
        for i, layer in enumerate(cast("list[Block]", self.layers)):  # a ModuleList types as Module
            if cancel is not None and cancel():
                raise Cancelled(f"forward cancelled before layer {i} of {len(self.layers)}")
            out = None if buffer is None else buffer[i]
            layer_keep = window_keep if i in windowed else keep
            if i == last and not need_hidden:
                layer_weights.append(layer.attention_weights(x, layer_keep, rotary=rotary, weights_out=out))
                break
            x, weights = layer(x, layer_keep, rotary=rotary, need_weights=need_weights, weights_out=out)
            if weights is not None:
                layer_weights.append(weights)
        attentions = buffer if buffer is not None else torch.stack(layer_weights) if layer_weights else None
        if not need_hidden:
            return TransformerOutput(hidden_state=None, attentions=attentions)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return TransformerOutput(hidden_state=x, attentions=attentions)
