"""The pieces a Transformer is built from, each chosen by its TransformerConfig (mha.networks.model).

- Embeddings: token, plus learned positions (BERT, GPT-2, BART), Marian's sinusoidal table, or none
  (rotary families rotate q and k instead, T5 biases the logits), token types where the family has them,
  a sqrt(E) scale (Gemma, Marian, some BART), a LayerNorm (BERT, BART).
- FeedForward: fc_out(act(fc_in(x))) (BERT, GPT-2), or gated, down(act(gate(x)) · up(x)) (Llama's SwiGLU,
  Gemma's GeGLU), gate and up in one fused matmul as Phi-3 stores them.
- Block: post-norm (BERT, BART), pre-norm (GPT-2, Llama, T5) or Gemma 2's sandwich (pre- and post-norm
  around both the attention and the feed-forward); LayerNorm or RMSNorm. `Block.residual` is the wiring
  alone, which mha.networks.seq2seq's decoder block reuses for its cross-attention; T5's float16 clamp
  (`clamp_overflow`) is applied there.

Shape legend: B batch, T tokens, E embed dim, F feed-forward width.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from mha.core.config import ACTIVATIONS, TransformerConfig
from mha.core.multihead import MultiHeadAttention
from mha.core.norm import RMSNorm
from mha.core.taps import NO_TAPS, Taps

__all__ = [
    "ACTIVATIONS",
    "Block",
    "Embedding",
    "Embeddings",
    "FeedForward",
    "block_attention",
    "cast_network",
    "clamp_overflow",
    "make_norm",
    "sinusoidal_positions",
]

# name -> function, for each name mha.core.config.ACTIVATIONS lets a config name
_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_tanh": partial(F.gelu, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}
assert tuple(_ACTIVATIONS) == ACTIVATIONS  # one list of names, checked where the functions are

Rotary = tuple[torch.Tensor, torch.Tensor]
M = TypeVar("M", bound=nn.Module)


def block_attention(config: TransformerConfig, **options: Any) -> MultiHeadAttention:
    """A MultiHeadAttention of `config`'s width and heads with the options every attention of a block takes
    from it alike (dropout, biases, head_dim, scale); `options` are the attention's own: a self-attention's
    kv heads, soft-cap and q/k norm, a decoder's cross attention's kdim and vdim (mha.networks.seq2seq)."""
    return MultiHeadAttention(
        config.embed_dim,
        config.num_heads,
        dropout=config.attention_dropout,
        bias=config.attention_bias,
        out_bias=config.out_bias,
        head_dim=config.head_dim,
        scale=config.attention_scale,
        **options,
    )


def make_norm(config: TransformerConfig) -> nn.Module:
    if config.norm == "rms":
        return RMSNorm(config.embed_dim, eps=config.layer_norm_eps, offset=config.norm_offset)
    return nn.LayerNorm(config.embed_dim, eps=config.layer_norm_eps)


def sinusoidal_positions(position_ids: torch.Tensor, dim: int) -> torch.Tensor:
    """(..., dim) float32 rows of Marian's table: sin(p / 10000^(2i/dim)) in the first half, the cosines
    in the second (not interleaved), in float64 then rounded once, as transformers builds its table."""
    exponents = torch.arange(0, dim, 2, dtype=torch.float64, device=position_ids.device) / dim  # 2i / dim
    # (..., ceil(dim / 2)): position / 10000^(2i / dim), divided as transformers' numpy table does
    angles = position_ids.to(torch.float64).unsqueeze(-1) / torch.pow(10000.0, exponents)
    return torch.cat([angles.sin(), angles[..., : dim // 2].cos()], dim=-1).float()


def clamp_overflow(x: torch.Tensor) -> torch.Tensor:
    """transformers' T5Block guard, op for op: where any value of x is ±inf, every value is clamped to
    ±(the dtype's largest - 1000), else to ±the largest, which leaves finite values as they are. The
    choice is made on the device (torch.where), without a wait for it."""
    finfo = torch.finfo(x.dtype)
    limit = torch.where(torch.isinf(x).any(), finfo.max - 1000, finfo.max)
    return torch.clamp(x, min=-limit, max=limit)


class Embedding(nn.Embedding):
    """nn.Embedding that leaves a weight on the meta device uninitialised: a meta weight is only a shape
    (checkpoints are loaded onto meta-built networks), and normal_ on meta goes through torch._refs, whose
    first use imports torch._dynamo, 1.2 s of every process's first model load."""

    def reset_parameters(self) -> None:
        if not self.weight.is_meta:
            super().reset_parameters()


class Embeddings(nn.Module):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.token = Embedding(config.vocab_size, config.embed_dim)
        self.position = (
            Embedding(config.max_positions, config.embed_dim) if config.positions == "learned" else None
        )
        self.segment = Embedding(config.type_vocab_size, config.embed_dim) if config.type_vocab_size else None
        self.norm = (
            nn.LayerNorm(config.embed_dim, eps=config.layer_norm_eps) if config.embedding_norm else None
        )
        self.sinusoidal = config.positions == "sinusoidal"
        self.scale = config.embed_scale
        self.dropout = nn.Dropout(config.dropout)

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, segment_ids: torch.Tensor | None
    ) -> torch.Tensor:
        x = self.token(input_ids)  # (B, T, E)
        if self.scale is not None:
            # Gemma rounds the scale to the model's dtype first, as its reference code does.
            x = x * torch.tensor(self.scale, dtype=x.dtype)
        if self.position is not None:
            x = x + self.position(position_ids)
        elif self.sinusoidal:
            x = x + sinusoidal_positions(position_ids, x.shape[-1]).to(x.dtype)
        if self.segment is not None:
            # Absent segment ids mean segment 0, as in Hugging Face's BERT and RoBERTa.
            x = x + (self.segment(segment_ids) if segment_ids is not None else self.segment.weight[0])
        if self.norm is not None:
            x = self.norm(x)
        return self.dropout(x)


class FeedForward(nn.Module):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.gated = config.mlp == "gated"
        width = 2 * config.ffn_dim if self.gated else config.ffn_dim  # gated: rows of gate, then up
        self.fc_in = nn.Linear(config.embed_dim, width, bias=config.mlp_bias)
        self.fc_out = nn.Linear(config.ffn_dim, config.embed_dim, bias=config.mlp_bias)
        self.activation = _ACTIVATIONS[config.activation]
        # T5: cast_network keeps fc_out float32 in a float16 network; its input is cast up to it.
        self.float32_out = config.float32_ffn_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            gate, up = self.fc_in(x).chunk(2, dim=-1)
            hidden = self.activation(gate)
            # In place where no gradient needs the activation's output (saves a [T, F] allocation).
            hidden = hidden * up if torch.is_grad_enabled() else hidden.mul_(up)
        else:
            hidden = self.activation(self.fc_in(x))
        if self.float32_out:
            hidden = hidden.to(self.fc_out.weight.dtype)
        return self.fc_out(hidden)


def cast_network(network: M, *, device: torch.device, dtype: torch.dtype) -> M:
    """network.to(device, dtype), as transformers' from_pretrained(dtype=) places a model: in float16, a
    feed-forward whose config says float32_ffn_out (T5) keeps its output projection in float32, moved to
    the device at the precision it has (the checkpoint's), never through float16."""
    kept = [m for m in network.modules() if isinstance(m, FeedForward) and m.float32_out]
    held = [(m, m.fc_out) for m in kept] if dtype == torch.float16 else []
    for ffn, _ in held:
        delattr(ffn, "fc_out")  # out of the way of the cast; put back below
    network.to(device=device, dtype=dtype)
    for ffn, fc_out in held:
        ffn.fc_out = fc_out.to(device=device, dtype=torch.float32)
    return network


class Block(nn.Module):
    """One transformer layer: post-norm (encoder), pre-norm (decoder) or sandwich (Gemma 2)."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.pre_norm = config.is_pre_norm
        self.attn = block_attention(
            config,
            num_kv_heads=config.num_kv_heads,
            softcap=config.attention_softcap,
            qk_norm_eps=config.layer_norm_eps if config.qk_norm else None,
            qk_norm_offset=config.norm_offset,
        )
        self.attn_norm = make_norm(config)
        self.ffn = FeedForward(config)
        self.ffn_norm = make_norm(config)
        # Gemma 2 normalises each sub-layer's output too, before it joins the residual stream.
        self.attn_post_norm = make_norm(config) if config.sandwich_norm else None
        self.ffn_post_norm = make_norm(config) if config.sandwich_norm else None
        self.dropout = nn.Dropout(config.dropout)
        self.clamp_float16 = config.clamp_float16

    def forward(
        self,
        x: torch.Tensor,
        keep: torch.Tensor | None,
        *,
        rotary: Rotary | None = None,
        bias: torch.Tensor | None = None,
        need_weights: bool,
        taps: Taps = NO_TAPS,
        attention: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`bias` is added to the logits (T5's relative positions). `taps` go to the attention
        (MultiHeadAttention): its products_out receives the value products of the sub-layer's input (the
        normed x in a pre-norm block, x in a post-norm one), and with `rows`, the indices of a padded
        batch's real tokens in its B·T rows, the feed-forward too runs on those alone (a padding row's
        output is read by nothing: it is no key, and its own row is dropped), and a padding row gets 0.
        `attention`, if given, stands in for self.attn on the sub-layer's input and returns its output
        (B, T, E), no weights: how mha.trace.blocked runs a long input's attention in row blocks through the
        same residual and norm wiring."""

        def attend(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
            if attention is not None:
                return attention(h), None
            return self.attn(h, keep=keep, rotary=rotary, bias=bias, need_weights=need_weights, taps=taps)

        def feed_forward(h: torch.Tensor) -> tuple[torch.Tensor, None]:
            if taps.rows is None:
                return self.ffn(h), None
            flat = h.reshape(-1, h.shape[-1])
            real = self.ffn(flat.index_select(0, taps.rows))
            out = real.new_zeros(flat.shape[0], real.shape[-1])
            return out.index_copy_(0, taps.rows, real).view(*h.shape[:-1], -1), None

        x, weights = self.residual(x, attend, self.attn_norm, self.attn_post_norm)
        x, _ = self.residual(x, feed_forward, self.ffn_norm, self.ffn_post_norm)
        return x, weights

    def residual(
        self,
        x: torch.Tensor,
        sublayer: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]],
        norm: nn.Module,
        post_norm: nn.Module | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One sub-layer with its residual: post-norm norm(x + f(x)), or pre-norm x + f(norm(x)) (Gemma 2:
        x + post_norm(f(norm(x)))); f's weights (or None) pass through. With clamp_float16 (T5), a float16
        pre-norm sum is clamp_overflow'ed, where transformers' T5Block clamps it: after each sub-layer."""
        if not self.pre_norm:
            out, weights = sublayer(x)
            return norm(x + self.dropout(out)), weights
        out, weights = sublayer(norm(x))
        if post_norm is not None:
            out = post_norm(out)
        x = x + self.dropout(out)
        if self.clamp_float16 and x.dtype == torch.float16:
            x = clamp_overflow(x)
        return x, weights

    def value_products(self, x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
        """The attention's value products (MultiHeadAttention.value_products) of this layer's input alone:
        its value projection, no weights, no feed-forward (a last layer only its attention is read of)."""
        h = self.attn_norm(x) if self.pre_norm else x
        return self.attn.value_products(self.attn.values(h), out=out)

    def attention_weights(
        self,
        x: torch.Tensor,
        keep: torch.Tensor | None,
        *,
        rotary: Rotary | None = None,
        weights_out: torch.Tensor | None,
    ) -> torch.Tensor:
        """This layer's attention weights alone: no value path, no feed-forward."""
        return self.attn.attention_weights(
            self.attn_norm(x) if self.pre_norm else x, keep=keep, rotary=rotary, weights_out=weights_out
        )
