"""A small transformer built from our MultiHeadAttention: BERT-style encoder and GPT-2-style decoder.

Shape legend: B batch, T tokens, E embed dim, H heads, L layers, F feed-forward width.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from mha._memory import empty_buffer
from mha.attention import build_keep_mask
from mha.errors import Cancelled
from mha.multihead import MultiHeadAttention

__all__ = ["ACTIVATIONS", "ARCHITECTURES", "Transformer", "TransformerConfig", "TransformerOutput"]

# name -> function; the config names one of them ("gelu_tanh" is GPT-2's gelu_new)
_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_tanh": partial(F.gelu, approximate="tanh"),
    "relu": F.relu,
}
ACTIVATIONS = tuple(_ACTIVATIONS)
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

    def __post_init__(self) -> None:
        for field in ("vocab_size", "max_positions", "embed_dim", "num_heads", "num_layers", "ffn_dim"):
            if getattr(self, field) <= 0:
                raise ValueError(f"{field} ({getattr(self, field)}) must be positive")
        if self.embed_dim % self.num_heads:
            raise ValueError(f"embed_dim ({self.embed_dim}) is not divisible by num_heads ({self.num_heads})")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation ({self.activation!r}) must be one of {ACTIVATIONS}")
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"architecture ({self.architecture!r}) must be one of {ARCHITECTURES}")
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


class Embeddings(nn.Module):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.token = nn.Embedding(config.vocab_size, config.embed_dim)
        self.position = nn.Embedding(config.max_positions, config.embed_dim)
        self.segment = (
            nn.Embedding(config.type_vocab_size, config.embed_dim) if config.type_vocab_size else None
        )
        self.norm = (
            nn.LayerNorm(config.embed_dim, eps=config.layer_norm_eps) if config.embedding_norm else None
        )
        self.dropout = nn.Dropout(config.dropout)

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, segment_ids: torch.Tensor | None
    ) -> torch.Tensor:
        x = self.token(input_ids) + self.position(position_ids)  # (B, T, E)
        if self.segment is not None:
            # Absent segment ids mean segment 0, as in Hugging Face's BERT and RoBERTa.
            x = x + (self.segment(segment_ids) if segment_ids is not None else self.segment.weight[0])
        if self.norm is not None:
            x = self.norm(x)
        return self.dropout(x)


class FeedForward(nn.Module):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.fc_in = nn.Linear(config.embed_dim, config.ffn_dim)
        self.fc_out = nn.Linear(config.ffn_dim, config.embed_dim)
        self.activation = _ACTIVATIONS[config.activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(self.activation(self.fc_in(x)))


class Block(nn.Module):
    """One transformer layer: post-LN (encoder, BERT) or pre-LN (decoder, GPT-2)."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.pre_norm = config.architecture == "decoder"
        self.attn = MultiHeadAttention(config.embed_dim, config.num_heads, dropout=config.attention_dropout)
        self.attn_norm = nn.LayerNorm(config.embed_dim, eps=config.layer_norm_eps)
        self.ffn = FeedForward(config)
        self.ffn_norm = nn.LayerNorm(config.embed_dim, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)

    def forward(
        self,
        x: torch.Tensor,
        keep: torch.Tensor | None,
        *,
        need_weights: bool,
        weights_out: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.pre_norm:
            attn, weights = self.attn(
                self.attn_norm(x), keep=keep, need_weights=need_weights, weights_out=weights_out
            )
            x = x + self.dropout(attn)
            x = x + self.dropout(self.ffn(self.ffn_norm(x)))
        else:
            attn, weights = self.attn(x, keep=keep, need_weights=need_weights, weights_out=weights_out)
            x = self.attn_norm(x + self.dropout(attn))
            x = self.ffn_norm(x + self.dropout(self.ffn(x)))
        return x, weights

    def attention_weights(
        self, x: torch.Tensor, keep: torch.Tensor | None, *, weights_out: torch.Tensor | None
    ) -> torch.Tensor:
        """This layer's attention weights alone: no value path, no feed-forward."""
        return self.attn.attention_weights(
            self.attn_norm(x) if self.pre_norm else x, keep=keep, weights_out=weights_out
        )


class Transformer(nn.Module):
    """Embeddings, L blocks and (decoder only) a final LayerNorm -> hidden states and all attentions."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.final_norm = nn.LayerNorm(config.embed_dim, eps=config.layer_norm_eps) if config.causal else None

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

    def _keep_mask(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor | None:
        """One bool keep-mask (B|1, 1, T, T) for every layer: padded keys (attention_mask 0) and, in a
        decoder, the causal triangle; None when nothing is masked (the common single-text case)."""
        batch, length = input_ids.shape
        padding = None
        if attention_mask is not None and not bool(attention_mask.all()):
            padding = attention_mask.bool().view(batch, 1, 1, length)  # any nonzero marks a real token
        return build_keep_mask(
            mask=padding,
            causal=self.config.causal,
            batch=batch,
            heads=1,
            tgt_len=length,
            src_len=length,
            device=input_ids.device,
        )

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
            if i == last and not need_hidden:
                layer_weights.append(layer.attention_weights(x, keep, weights_out=out))
                break
            x, weights = layer(x, keep, need_weights=need_weights, weights_out=out)
            if weights is not None:
                layer_weights.append(weights)
        attentions = buffer if buffer is not None else torch.stack(layer_weights) if layer_weights else None
        if not need_hidden:
            return TransformerOutput(hidden_state=None, attentions=attentions)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return TransformerOutput(hidden_state=x, attentions=attentions)
