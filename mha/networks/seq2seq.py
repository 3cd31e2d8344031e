"""Encoder–decoder transformers (T5, BART, Marian) from our layers: an encoder stack (mha.networks.model's
Transformer), and a decoder stack whose blocks add cross-attention to the encoder's output through
MultiHeadAttention(kdim=, vdim=), the seeds' reason for those arguments.

Shape legend: B batch, S source tokens, T target tokens, E embed dim, H heads, L layers.

Each stack is a TransformerConfig, so every family difference stays a flag there: T5's pre-norm RMSNorm
without bias, no 1/sqrt(D) scaling and relative position bias (mha.core.relative: bidirectional in the
encoder, unidirectional in the decoder, none in cross-attention); BART's post-norm with learned positions
offset by 2 and a LayerNorm on the embeddings; Marian's post-norm with sinusoidal positions and scaled
embeddings. A decoder block is a Block (self-attention, feed-forward, the norm wiring) with a
cross-attention sub-layer between the two, wired by the same `Block.residual`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import cast

import torch
from torch import nn

from mha.core.config import TransformerConfig
from mha.core.layers import Block, block_attention, make_norm
from mha.core.taps import NO_TAPS, Taps
from mha.errors import Cancelled
from mha.networks.model import Transformer

__all__ = ["DecoderBlock", "EncoderDecoder", "Seq2SeqConfig", "Seq2SeqDecoder", "Seq2SeqOutput"]


@dataclass(frozen=True)
class Seq2SeqConfig:
    encoder: TransformerConfig  # architecture "encoder": bidirectional
    decoder: TransformerConfig  # architecture "decoder": causal, its blocks with cross-attention
    decoder_start_token_id: int  # the decoder's first input (T5 and Marian: the pad token; BART: </s>)
    # What generate() forces, from the checkpoint's generation settings: this token first (mBART's
    # language codes), and this one last when the length limit is reached (BART, Marian); None: nothing.
    forced_bos_token_id: int | None = None
    forced_eos_token_id: int | None = None
    shared_embeddings: bool = True  # one token embedding for both stacks in the checkpoint (its key map)
    # generate's one-token bad_words_ids (Marian's opus-mt bans its pad token): never written
    banned_token_ids: tuple[int, ...] = ()
    # What the decoder's last state is multiplied by before the LM head: T5's d_model ** -0.5 (its
    # scale_decoder_outputs: the tied embedding read back at the embedding's scale). An argmax ignores it;
    # a distribution (mha.analysis.ablation's KL) does not.
    logits_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.encoder.causal or not self.decoder.causal:
            raise ValueError(
                f"an encoder-decoder needs a bidirectional encoder and a causal decoder, got "
                f"{self.encoder.architecture!r} and {self.decoder.architecture!r}"
            )
        if not 0 <= self.decoder_start_token_id < self.decoder.vocab_size:
            raise ValueError(
                f"decoder_start_token_id ({self.decoder_start_token_id}) is outside the decoder's "
                f"vocabulary ({self.decoder.vocab_size})"
            )

    @property
    def vocab_size(self) -> int:
        return self.encoder.vocab_size

    @property
    def type_vocab_size(self) -> int:
        return 0  # none of the families has segment embeddings


@dataclass
class Seq2SeqOutput:
    hidden_state: torch.Tensor  # (B, T, E), the decoder's last layer (after its final norm, if any)
    encoder_hidden: torch.Tensor  # (B, S, E), what cross-attention reads
    encoder_attentions: torch.Tensor | None  # (L_enc, B, H, S, S)
    decoder_attentions: torch.Tensor | None  # (L_dec, B, H, T, T), causal
    cross_attentions: torch.Tensor | None  # (L_dec, B, H, T, S)


class DecoderBlock(Block):
    """A Block with cross-attention to the encoder's output between its self-attention and feed-forward."""

    def __init__(self, config: TransformerConfig, source_dim: int) -> None:
        super().__init__(config)
        # keys and values come from the encoder's states
        self.cross_attn = block_attention(config, kdim=source_dim, vdim=source_dim)
        self.cross_norm = make_norm(config)

    def decode(
        self,
        x: torch.Tensor,
        keep: torch.Tensor | None,
        memory: torch.Tensor,
        memory_keep: torch.Tensor | None,
        *,
        bias: torch.Tensor | None,
        need_weights: bool,
        taps: Taps = NO_TAPS,
        cross_taps: Taps = NO_TAPS,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """x (B, T, E), memory (B, S, source dim) -> (x, self weights (B, H, T, T), cross (B, H, T, S)).
        taps and cross_taps go to the self- and the cross-attention (mha.core.taps): their products_out
        are (B, T, H, H) and (B, S, H, H) (cross-attention's values are the encoder's output, its keys),
        their head masks (B|1, H) (mha.analysis.ablation)."""
        x, own = self.residual(
            x,
            lambda h: self.attn(h, keep=keep, bias=bias, need_weights=need_weights, taps=taps),
            self.attn_norm,
            self.attn_post_norm,
        )
        x, cross = self.residual(
            x,
            lambda h: self.cross_attn(
                h, memory, memory, keep=memory_keep, need_weights=need_weights, taps=cross_taps
            ),
            self.cross_norm,
        )
        x, _ = self.residual(x, lambda h: (self.ffn(h), None), self.ffn_norm, self.ffn_post_norm)
        return x, own, cross


class Seq2SeqDecoder(Transformer):
    """The decoder stack: embeddings, DecoderBlocks, the final norm of a pre-norm stack."""

    def __init__(self, config: TransformerConfig, *, source_dim: int) -> None:
        super().__init__(config, block=partial(DecoderBlock, config, source_dim))

    def decode(
        self,
        input_ids: torch.Tensor,
        memory: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        cancel: Callable[[], bool] | None = None,
        products_out: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """input_ids (B, T), memory (B, S, source dim), masks 1 for real tokens -> (hidden (B, T, E),
        self-attentions (L, B, H, T, T), cross-attentions (L, B, H, T, S)), weights None without
        need_weights. products_out, (L, B, T, H, H) and (L, B, S, H, H), receive every layer's value
        products of its self- and cross-attention (MultiHeadAttention.value_products)."""
        length = input_ids.shape[1]
        if length > self.config.max_tokens:
            limit = self.config.max_tokens
            raise ValueError(f"target length ({length}) exceeds the decoder's maximum ({limit})")
        x = self.embeddings(input_ids, self.position_ids(input_ids), None)  # (B, T, E)
        keep = self._keep_mask(input_ids, attention_mask)
        memory_keep = None
        if memory_mask is not None and not bool(memory_mask.all()):
            memory_keep = memory_mask.bool().view(memory.shape[0], 1, 1, memory.shape[1])  # (B, 1, 1, S)
        bias = self.position_bias(length)
        own: list[torch.Tensor] = []
        cross: list[torch.Tensor] = []
        for i, layer in enumerate(cast("list[DecoderBlock]", self.layers)):
            if cancel is not None and cancel():
                raise Cancelled(f"decoder cancelled before layer {i} of {len(self.layers)}")
            taps = cross_taps = NO_TAPS
            if products_out is not None:
                taps, cross_taps = (
                    Taps(products_out=products_out[0][i]),
                    Taps(products_out=products_out[1][i]),
                )
            x, w_own, w_cross = layer.decode(
                x,
                keep,
                memory,
                memory_keep,
                bias=bias,
                need_weights=need_weights,
                taps=taps,
                cross_taps=cross_taps,
            )
            if w_own is not None and w_cross is not None:
                own.append(w_own)
                cross.append(w_cross)
        if self.final_norm is not None:
            x = self.final_norm(x)
        if not need_weights:
            return x, None, None
        return x, torch.stack(own), torch.stack(cross)


class EncoderDecoder(nn.Module):
    """The encoder's Transformer and the decoder's stack; `forward` runs both (forced decoding)."""

    def __init__(self, config: Seq2SeqConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = Transformer(config.encoder)
        self.decoder = Seq2SeqDecoder(config.decoder, source_dim=config.encoder.embed_dim)

    def encode(
        self,
        input_ids: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        cancel: Callable[[], bool] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(the encoder's last hidden state (B, S, E), its attentions (L, B, H, S, S) or None)."""
        out = self.encoder(input_ids, attention_mask=attention_mask, need_weights=need_weights, cancel=cancel)
        assert out.hidden_state is not None  # need_hidden defaults to True
        return out.hidden_state, out.attentions

    def forward(
        self,
        input_ids: torch.Tensor,
        decoder_input_ids: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        cancel: Callable[[], bool] | None = None,
    ) -> Seq2SeqOutput:
        """input_ids (B, S) and decoder_input_ids (B, T), right-padded, masks 1 for real tokens."""
        memory, encoder_attentions = self.encode(
            input_ids, attention_mask=attention_mask, need_weights=need_weights, cancel=cancel
        )
        hidden, own, cross = self.decoder.decode(
            decoder_input_ids,
            memory,
            attention_mask=decoder_attention_mask,
            memory_mask=attention_mask,
            need_weights=need_weights,
            cancel=cancel,
        )
        return Seq2SeqOutput(hidden, memory, encoder_attentions, own, cross)
