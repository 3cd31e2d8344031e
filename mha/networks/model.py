"""Transformers built from our MultiHeadAttention: BERT-style encoders, GPT-2-style decoders and today's
rotary decoders (Llama, Mistral, Qwen2, Qwen3, Gemma 2, Phi-3), each a TransformerConfig; the layers are
mha.core.layers'. An encoder-decoder's two stacks are Transformers too (mha.networks.seq2seq).

Shape legend: B batch, T tokens, E embed dim, H heads, L layers, F feed-forward width.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import cast

import torch
from torch import nn

from mha._memory import empty_buffer
from mha.core.attention import build_keep_mask
from mha.core.config import ACTIVATIONS, ARCHITECTURES, TransformerConfig
from mha.core.layers import Block, Embeddings, make_norm
from mha.core.relative import RelativePositionBias
from mha.core.taps import Taps
from mha.errors import Cancelled

__all__ = ["ACTIVATIONS", "ARCHITECTURES", "Transformer", "TransformerConfig", "TransformerOutput"]


@dataclass
class TransformerOutput:
    hidden_state: torch.Tensor | None  # (B, T, E), the last layer's output; None when not asked for
    attentions: torch.Tensor | None  # (L, B, H, T, T), every layer's attention weights
    # (L, B, T, H, H), every layer's value products (MultiHeadAttention.value_products); need_products only
    products: torch.Tensor | None = None


@dataclass
class Prepared:
    """What every layer of one forward reads besides the residual stream (Transformer.prepare)."""

    x: torch.Tensor  # (B, T, E): the embeddings, the first layer's input
    keeps: list[torch.Tensor | None]  # each layer's keep-mask (the sliding window's on its layers)
    rotaries: list[tuple[torch.Tensor, torch.Tensor] | None]  # each layer's cos and sin (None: no rope)
    bias: torch.Tensor | None  # T5's relative position bias, every layer's


class Transformer(nn.Module):
    """Embeddings, L blocks and (decoder only) a final norm -> hidden states and all attentions."""

    def __init__(self, config: TransformerConfig, *, block: Callable[[], Block] | None = None) -> None:
        """`block` makes each layer (mha.networks.seq2seq's decoder blocks, with cross-attention):
        Block(config)."""
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList((block or partial(Block, config))() for _ in range(config.num_layers))
        self.final_norm = make_norm(config) if config.is_pre_norm else None
        # T5: the first layer's table, whose bias every layer adds (mha.core.relative).
        self.relative_bias = (
            RelativePositionBias(
                config.num_heads,
                num_buckets=config.relative_buckets,
                max_distance=config.relative_max_distance,
                bidirectional=not config.causal,
            )
            if config.positions == "relative"
            else None
        )

    def position_bias(self, length: int) -> torch.Tensor | None:
        """The logit bias (1, H, T, T) every layer adds (T5's relative positions), or None."""
        return None if self.relative_bias is None else self.relative_bias(length, length)

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
        # On an accelerator a given mask is applied as is (all ones masks nothing): checking it would wait
        # for the device once a forward.
        if attention_mask is not None and (
            attention_mask.device.type != "cpu" or not bool(attention_mask.all())
        ):
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

    def rotaries(
        self, position_ids: torch.Tensor, dtype: torch.dtype
    ) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
        """Each layer's cos and sin (1, T, rotary dim), or None without rotary positions: the window layers
        take the config's local rope where it has one (Gemma 3), the others its rope; each table computed
        once. A batch is right-padded, so every row's positions are 0..T-1, those of its first."""
        cfg = self.config
        if cfg.rope is None:
            return [None] * cfg.num_layers
        main = cfg.rope.cos_sin(position_ids[:1], dtype=dtype)
        local = main if cfg.local_rope is None else cfg.local_rope.cos_sin(position_ids[:1], dtype=dtype)
        windowed = set(cfg.window_layers)
        return [local if i in windowed else main for i in range(cfg.num_layers)]

    def prepare(
        self,
        input_ids: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        segment_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> Prepared:
        """The embeddings and what every layer reads with them: how `forward` starts, and how a caller that
        runs the layers itself (mha.analysis.ablation) starts the same way."""
        cfg = self.config
        if position_ids is None:
            position_ids = self.position_ids(input_ids)
        x = self.embeddings(input_ids, position_ids, segment_ids)  # (B, T, E)
        keep = self._keep_mask(input_ids, attention_mask)
        windowed = set(cfg.window_layers)
        window_keep = (
            self._keep_mask(input_ids, attention_mask, window=cfg.sliding_window) if windowed else None
        )
        keeps = [window_keep if i in windowed else keep for i in range(cfg.num_layers)]
        rotaries = self.rotaries(position_ids, x.dtype)
        return Prepared(x, keeps, rotaries, self.position_bias(input_ids.shape[1]))

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
        on_layers: Callable[..., None] | None = None,
        layers_at_once: int = 1,
        need_products: bool = False,
    ) -> TransformerOutput:
        """input_ids (B, T); attention_mask (B, T) 1 for real tokens, 0 for padding; segment_ids (B, T).

        need_hidden=False (with need_weights) returns every attention but no hidden state, and skips the
        work no attention depends on: the last layer's value path, out_proj and feed-forward.
        cancel, called before each layer, stops the forward with `Cancelled` when it returns True.
        on_layers(first, weights (k, B, H, T, T)), if given, is called with layers first..first + k - 1's
        weights as soon as k = layers_at_once of them (fewer at the end) have come out, and the output holds
        no attentions: layers_at_once layers' maps alive at a time, not L. Without grad the weights are one
        buffer of layers_at_once layers that the next ones write again: valid only during the call.
        need_products adds every layer's value products (L, B, T, H, H) to the output: what moves along
        each weight (mha.analysis.norms), from this forward's own values. With on_layers, each call gets
        its layers' products too: on_layers(first, weights, products[first : first + k]).
        """
        self._check_request(input_ids, need_weights, need_hidden, on_layers, layers_at_once)
        prepared = self.prepare(
            input_ids, attention_mask=attention_mask, segment_ids=segment_ids, position_ids=position_ids
        )
        x = prepared.x  # (B, T, E)
        rows = _real_rows(attention_mask, prepared.keeps[0] is not None)
        products = None  # (L, B, T, H, H): small, T·H² a layer against the weights' H·T²
        if need_products:
            heads = self.config.num_heads
            products = x.new_empty(self.config.num_layers, *input_ids.shape, heads, heads)
        attentions = _Attentions(self.config, x, need_weights, on_layers, layers_at_once, products)
        last = len(self.layers) - 1
        for i, layer in enumerate(cast("list[Block]", self.layers)):  # a ModuleList types as Module
            if cancel is not None and cancel():
                raise Cancelled(f"forward cancelled before layer {i} of {len(self.layers)}")
            keep, rotary = prepared.keeps[i], prepared.rotaries[i]
            taps = Taps(
                weights_out=attentions.slot(i),
                products_out=None if products is None else products[i],
                rows=rows,
            )
            weights: torch.Tensor | None
            if i == last and not need_hidden and prepared.bias is None:
                weights = _weights_alone(layer, x, keep, rotary, taps)  # nothing reads this layer's output
            else:
                x, weights = layer(
                    x, keep, rotary=rotary, bias=prepared.bias, need_weights=need_weights, taps=taps
                )
            attentions.add(i, weights, last=i == last)
        if not need_hidden:
            return TransformerOutput(hidden_state=None, attentions=attentions.result(), products=products)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return TransformerOutput(hidden_state=x, attentions=attentions.result(), products=products)

    def _check_request(
        self,
        input_ids: torch.Tensor,
        need_weights: bool,
        need_hidden: bool,
        on_layers: Callable[..., None] | None,
        layers_at_once: int,
    ) -> None:
        """forward's arguments, each bad one a ValueError that says why."""
        if not (need_weights or need_hidden):
            raise ValueError("need_weights and need_hidden are both False: nothing to compute")
        if on_layers is not None and not need_weights:
            raise ValueError("on_layers needs need_weights: there are no weights to hand it")
        if layers_at_once < 1:
            raise ValueError(f"layers_at_once ({layers_at_once}) must be at least 1")
        if input_ids.ndim != 2:
            raise ValueError(f"input_ids must have shape (B, T), got {tuple(input_ids.shape)}")
        length, limit = input_ids.shape[1], self.config.max_tokens
        if length > limit:
            raise ValueError(f"input length ({length}) exceeds the model's maximum ({limit})")


class _Attentions:
    """Where one forward's attention weights go: every layer's softmax writes straight into its slice of
    one buffer (L, B, H, T, T) without grad, so nothing is stacked at the end; with on_layers, a group of
    layers_at_once layers is handed over as soon as it has come out (with its layers' value products, if
    any), and the next group writes the same buffer again."""

    def __init__(
        self,
        config: TransformerConfig,
        x: torch.Tensor,
        need_weights: bool,
        on_layers: Callable[..., None] | None,
        layers_at_once: int,
        products: torch.Tensor | None,
    ) -> None:
        self.on_layers, self.products = on_layers, products
        self.group = min(layers_at_once, config.num_layers) if on_layers is not None else config.num_layers
        self.buffer = None
        if need_weights and not torch.is_grad_enabled():
            batch, length = x.shape[:2]
            self.buffer = empty_buffer(self.group, batch, config.num_heads, length, length, like=x)
        self.first = 0  # the first layer of the group in hand
        self.held: list[torch.Tensor] = []  # its layers' weights so far

    def slot(self, layer: int) -> torch.Tensor | None:
        """The buffer's slice layer `layer` writes its weights into, or None (with grad: no buffer)."""
        return None if self.buffer is None else self.buffer[layer - self.first]

    def add(self, layer: int, weights: torch.Tensor | None, *, last: bool) -> None:
        if weights is not None:
            self.held.append(weights)
        if self.on_layers is None or not self.held or (len(self.held) < self.group and not last):
            return
        count = len(self.held)
        handed = self.buffer[:count] if self.buffer is not None else torch.stack(self.held)
        if self.products is None:
            self.on_layers(self.first, handed)
        else:  # this group's layers' products, written by the same layers
            self.on_layers(self.first, handed, self.products[self.first : self.first + count])
        self.first, self.held = layer + 1, []

    def result(self) -> torch.Tensor | None:
        """(L, B, H, T, T), or None: no weights asked for, or every layer's went to on_layers."""
        if self.on_layers is not None:
            return None
        if self.buffer is not None:
            return self.buffer
        return torch.stack(self.held) if self.held else None


def _weights_alone(
    layer: Block,
    x: torch.Tensor,
    keep: torch.Tensor | None,
    rotary: tuple[torch.Tensor, torch.Tensor] | None,
    taps: Taps,
) -> torch.Tensor:
    """A layer's weights when nothing reads its output: no value path, out_proj or feed-forward (for
    value products the value projection alone)."""
    weights = layer.attention_weights(x, keep, rotary=rotary, weights_out=taps.weights_out)
    if taps.products_out is not None:
        layer.value_products(x, out=taps.products_out)
    return weights


def _real_rows(attention_mask: torch.Tensor | None, masked: bool) -> torch.Tensor | None:
    """The indices of a padded CPU batch's real tokens among its B·T rows, for the feed-forward to skip
    the padding (a corpus batch's groups pad ~10 % of their tokens); None without padding, and on an
    accelerator, where finding them would wait for the device."""
    if attention_mask is None or not masked or attention_mask.device.type != "cpu":
        return None
    if bool(attention_mask.all()):
        return None
    return attention_mask.reshape(-1).nonzero().squeeze(1)
