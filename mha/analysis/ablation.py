"""Head ablation: which heads the output needs. Each head's output (its slice of the attention's output,
before the output projection W_O) is set to zero, one head at a time, and the change downstream measured:

- a decoder: KL(p_full ‖ p_ablated) of the next-token distribution, natural log, at the last position;
  with a continuation (max_new_tokens), also at each step that chose a written token;
- an encoder: 1 − cosine similarity of the final hidden state, at the first token ([CLS]) and mean-pooled
  over the tokens (as sentence-transformers pool);
- an encoder-decoder: the decoder's next-token KL at its last position, and at each position of the target
  (given, or written greedily first as attend writes it), for the heads of all three attentions: the
  encoder's self-attention (every decoder position reads the ablated encoder's output), the decoder's
  self-attention and its cross-attention (zeroed in the cross-attention sub-layer of its layer only).

Zeroing head h of layer l changes nothing below l, so the residual stream entering each layer is kept from
one plain forward, and layer l's H ablations run as one batch of H copies (copy b without head b) from
there to the top: Σ_l H·(L − l) layer passes, about half of L·H whole forwards, in batches of H.

The output projection's bias stays: it belongs to no head (mha.analysis.norms). A pre-norm model's final
norm and its LM head (Gemma 2's final soft-cap included) read the ablated stream as they read the plain one.
An encoder-decoder's distribution is the one greedy generation reads (mha.networks.translate): BART's and
Marian's logits bias added, its banned tokens at probability 0 (they add nothing to a KL); an encoder layer's
H ablations run the encoder from that layer and then the whole decoder, as a batch of H.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, cast

import torch
import torch.nn.functional as F

from mha.core.layers import Block
from mha.core.taps import Taps
from mha.errors import Cancelled, NotCausalError
from mha.networks import continuation, translate
from mha.networks.model import Prepared, Transformer
from mha.networks.seq2seq import DecoderBlock, EncoderDecoder
from mha.text.tokenize import Encoded

__all__ = ["Ablated", "HeadEffects", "Section", "head_effects"]

# progress(layers done, layers): called after each layer's H ablations, as a trace reports its layers (an
# encoder-decoder counts its L_enc + 2·L_dec attention layers: encoder, decoder, cross).
Progress = Callable[[int, int], None]

SECTIONS = ("encoder", "decoder", "cross")  # an encoder-decoder's attentions, as its attend names them


class Ablated(translate.Translator, Protocol):
    """What head ablation needs of a loaded model (mha.model.attention_model.AttentionModel), and no
    more: its network, tokenizer and encoder, its device, and the LM head and logits bias a decoder's or
    an encoder-decoder's next token is read through; what writing a continuation first
    (continuation.Writer) or a target (translate.Translator) needs, which is the same. A protocol, so
    that analysis never imports the loader that imports it."""


@dataclass(frozen=True)
class Section:
    """One attention of an encoder-decoder: `effects` [L, H] at the last decoder position, `steps` [L, H,
    positions] at each of HeadEffects.positions."""

    effects: torch.Tensor
    steps: torch.Tensor


@dataclass(frozen=True)
class HeadEffects:
    """What zeroing each head changes. Tensors float32 on the CPU.

    Decoder ("kl"): `effects` [L, H] is KL(p_full ‖ p_ablated) at the last position; `steps` [L, H, k + 1]
    the same at positions prompt_n − 1 .. n − 1 (the steps that chose each of the k written tokens, then
    the next one); `positions` names them; `top_tokens` and `top_probs` the output each KL refers to:
    p_full's most likely token at each of those positions (a written token, then the predicted next one)
    and its probability.
    Encoder ("cosine"): `effects` [L, H] is 1 − cos of the first token's final hidden state; `pooled` [L, H]
    of the mean over the tokens.
    Encoder-decoder ("kl"): `sections` {"encoder", "decoder", "cross"}, each attention's heads; `effects`
    and `steps` are the encoder's (as an encoder-decoder's attend answers its encoder first); `tokens` the
    decoder's input (the start token and the target), `positions` every one of them (position i predicts
    target token i, the last one the next token), `source_tokens` the source's.
    `truncated`: the input was cut to the token limit."""

    tokens: list[str]
    measure: str  # "kl" or "cosine"
    effects: torch.Tensor
    steps: torch.Tensor | None = None
    positions: list[int] | None = None
    pooled: torch.Tensor | None = None
    generated: int = 0
    top_tokens: list[str] | None = None
    top_probs: list[float] | None = None
    truncated: bool = False
    sections: dict[str, Section] | None = None
    source_tokens: list[str] | None = None

    @property
    def layers(self) -> int:
        return int(self.effects.shape[0])

    @property
    def heads(self) -> int:
        return int(self.effects.shape[1])


def head_effects(
    model: Ablated,
    encoded: Encoded,
    *,
    limit: int,
    max_new_tokens: int | None = None,
    target: str | None = None,
    cancel: Callable[[], bool] | None = None,
    progress: Progress | None = None,
) -> HeadEffects:
    """Every head's effect on the output (module docstring) for one encoded input (AttentionModel.
    head_effects encodes it); `cancel` is asked before each layer's ablations (Cancelled when it answers
    True), `progress` told after each. An encoder-decoder reads `target` (its tokens forced, as attend's
    target), or writes up to max_new_tokens first (attend's default without either)."""
    if model.info.seq2seq:
        return _seq2seq_effects(
            model, encoded, target=target, max_new_tokens=max_new_tokens, cancel=cancel, progress=progress
        )
    if target is not None:
        raise ValueError("a target is an encoder-decoder's: a decoder continues its prompt (max_new_tokens)")
    if max_new_tokens and not model.info.causal:  # as attend: only a decoder continues a prompt
        raise NotCausalError(model.info.name)
    generated = 0
    if max_new_tokens and model.info.causal:
        new = continuation.greedy_ids(model, encoded.ids, max_new_tokens, limit, cancel)
        encoded = encoded.extended(new, model.encoder)
        generated = len(new)
    network = cast(Transformer, model.network)
    device = model.device
    ids = torch.tensor([encoded.ids], device=device)
    has_segments = network.embeddings.segment is not None
    segments = torch.tensor([encoded.type_ids], device=device) if has_segments else None
    n = len(encoded.ids)
    reader: Reader = (
        _NextToken(model, network, list(range(n - 1 - generated, n))) if model.info.causal else _FinalStates()
    )
    with torch.no_grad():
        prepared = network.prepare(ids, segment_ids=segments)
        layers = cast("list[Block]", list(network.layers))
        states, x = _plain(layers, prepared)
        full = reader.read(x)
        heads = network.config.num_heads
        # Copy b of the batch zeroes head b: a (H, H) mask, ones but the diagonal.
        mask = 1 - torch.eye(heads, device=device, dtype=x.dtype)
        per_layer = []
        for start in range(len(layers)):
            if cancel is not None and cancel():
                raise Cancelled(f"head effects cancelled before layer {start} of {len(layers)}")
            x = states[start].expand(heads, *states[start].shape[1:])
            for i in range(start, len(layers)):
                x = _layer(layers[i], x, prepared, i, mask if i == start else None)
            per_layer.append(reader.compare(full, reader.read(x)))  # [H, sides]
            if progress is not None:
                progress(start + 1, len(layers))
    table = torch.stack(per_layer).float().cpu()  # [L, H, sides]
    tokens = model.tokenizer.convert_ids_to_tokens(encoded.ids)
    cut = encoded.truncated
    if isinstance(reader, _NextToken):
        last = table[..., -1].contiguous()
        top = full[0].max(dim=-1)  # p_full's most likely token at each position, as log-probabilities
        return HeadEffects(
            tokens,
            "kl",
            last,
            table,
            reader.positions,
            generated=generated,
            top_tokens=model.tokenizer.convert_ids_to_tokens(top.indices.tolist()),
            top_probs=top.values.exp().tolist(),
            truncated=cut,
        )
    first, pooled = table[..., 0].contiguous(), table[..., 1].contiguous()
    return HeadEffects(tokens, "cosine", first, pooled=pooled, truncated=cut)


def _plain(layers: list[Block], prepared: Prepared) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The plain forward through `layers`: the residual stream entering each, and the last one's output."""
    states = []
    x = prepared.x
    for i, layer in enumerate(layers):
        states.append(x)
        x = _layer(layer, x, prepared, i, None)
    return states, x


def _layer(
    layer: Block, x: torch.Tensor, prepared: Prepared, index: int, head_mask: torch.Tensor | None
) -> torch.Tensor:
    out, _ = layer(
        x,
        prepared.keeps[index],
        rotary=prepared.rotaries[index],
        bias=prepared.bias,
        need_weights=False,
        taps=Taps(head_mask=head_mask),
    )
    return out


class Reader(Protocol):
    def read(self, x: torch.Tensor) -> torch.Tensor: ...

    def compare(self, full: torch.Tensor, ablated: torch.Tensor) -> torch.Tensor: ...


class _NextToken:
    """x (B, n, E) -> log-probabilities (B, positions, V) of the next token at `positions`, in float64
    (a KL of nearly equal distributions sums differences of nearly equal numbers); compared as
    KL(p_full ‖ p_ablated), natural log, (B, positions)."""

    def __init__(self, model: Ablated, network: Transformer, positions: list[int]) -> None:
        self.positions = positions
        self.norm = network.final_norm
        self.weight = model.lm_head()
        self.bias = model.logits_bias()
        self.softcap = network.config.final_softcap

    def read(self, x: torch.Tensor) -> torch.Tensor:
        h = x[:, self.positions]
        if self.norm is not None:
            h = self.norm(h)
        logits = h @ self.weight.T
        if self.bias is not None:
            logits = logits + self.bias
        if self.softcap is not None:
            logits = self.softcap * torch.tanh(logits / self.softcap)
        return F.log_softmax(logits.double(), dim=-1)

    def compare(self, full: torch.Tensor, ablated: torch.Tensor) -> torch.Tensor:
        return (full.exp() * (full - ablated)).sum(-1)


class _FinalStates:
    """An encoder's output (B, 2, E): the first token's final state and the mean over the tokens, in
    float64; compared as 1 − cosine, (B, 2)."""

    def read(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([x[:, 0], x.mean(dim=1)], dim=1).double()

    def compare(self, full: torch.Tensor, ablated: torch.Tensor) -> torch.Tensor:
        return 1 - F.cosine_similarity(full, ablated, dim=-1)


def _seq2seq_effects(
    model: Ablated,
    source: Encoded,
    *,
    target: str | None,
    max_new_tokens: int | None,
    cancel: Callable[[], bool] | None,
    progress: Progress | None,
) -> HeadEffects:
    """head_effects of an encoder-decoder (module docstring): each attention's layers ablated in turn,
    the encoder's, then the decoder's self- and cross-attention's."""
    if max_new_tokens is not None and max_new_tokens < 0:
        raise ValueError(f"max_new_tokens ({max_new_tokens}) must be at least 0")
    network = cast(EncoderDecoder, model.network)
    encoder, device = network.encoder, model.device
    with torch.no_grad():
        below = encoder.prepare(torch.tensor([source.ids], device=device))
        encoder_states, x = _plain(cast("list[Block]", list(encoder.layers)), below)
        memory = x if encoder.final_norm is None else encoder.final_norm(x)  # (1, S, E)
        generated = 0
        if target is None:
            budget = translate.DEFAULT_NEW_TOKENS if max_new_tokens is None else max_new_tokens
            written = translate.greedy_target(model, memory, budget, cancel)
            ids, generated = written, len(written)
        else:
            ids = model.encoder.encode_target(target, network.decoder.config.max_tokens - 1).ids
        ids = [network.config.decoder_start_token_id, *ids]
        above = network.decoder.prepare(torch.tensor([ids], device=device))
        reader = _Seq2SeqNext(model, network, list(range(len(ids))))
        ablation = _Seq2SeqAblation(network, below, encoder_states, memory, above, reader)
        tables = ablation.tables(cancel, progress)
    sections = {}
    for kind in SECTIONS:
        steps = torch.stack(tables[kind]).float().cpu()  # [L, H, positions]
        sections[kind] = Section(steps[..., -1].contiguous(), steps)
    top = ablation.full[0].max(dim=-1)
    return HeadEffects(
        translate.spell(model.tokenizer, ids),
        "kl",
        sections["encoder"].effects,
        sections["encoder"].steps,
        reader.positions,
        generated=generated,
        top_tokens=translate.spell(model.tokenizer, top.indices.tolist()),
        top_probs=top.values.exp().tolist(),
        truncated=source.truncated,
        sections=sections,
        source_tokens=translate.spell(model.tokenizer, source.ids),
    )


class _Seq2SeqAblation:
    """An encoder-decoder's plain forward on one source and target, kept for its ablations: the stream
    entering each layer of both stacks and the decoder's distribution; `effects` runs one layer's H
    ablations of one attention (copy b without head b) from its kept stream to the top, as a batch."""

    def __init__(
        self,
        network: EncoderDecoder,
        below: Prepared,
        encoder_states: list[torch.Tensor],
        memory: torch.Tensor,
        above: Prepared,
        reader: _Seq2SeqNext,
    ) -> None:
        self.encoder, self.decoder = network.encoder, network.decoder
        self.encoder_layers = cast("list[Block]", list(self.encoder.layers))
        self.decoder_layers = cast("list[DecoderBlock]", list(self.decoder.layers))
        self.below, self.above, self.reader = below, above, reader
        self.encoder_states, self.memory = encoder_states, memory
        self.decoder_states = []  # the stream entering each decoder layer, from the plain forward
        x = above.x
        for i in range(len(self.decoder_layers)):
            self.decoder_states.append(x)
            x = self._decode_layer(x, memory, i, {})
        self.full = reader.read(x)
        # Copy b of a batch zeroes head b; the two stacks may have different numbers of heads.
        self.masks = {
            kind: 1 - torch.eye(stack.config.num_heads, device=x.device, dtype=x.dtype)
            for kind, stack in (("encoder", self.encoder), ("decoder", self.decoder), ("cross", self.decoder))
        }

    def tables(
        self, cancel: Callable[[], bool] | None, progress: Progress | None
    ) -> dict[str, list[torch.Tensor]]:
        """{attention: each layer's effects [H, positions]}, the encoder's layers first, then the decoder's
        self- and cross-attention's; cancel checked and progress told between two layers."""
        counts = {"encoder": len(self.encoder_layers), "decoder": len(self.decoder_layers)}
        counts["cross"] = counts["decoder"]
        total, done = sum(counts.values()), 0
        tables: dict[str, list[torch.Tensor]] = {kind: [] for kind in SECTIONS}
        for kind, count in counts.items():
            for start in range(count):
                if cancel is not None and cancel():
                    raise Cancelled(
                        f"head effects cancelled before {kind} layer {start} ({done} of {total} done)"
                    )
                tables[kind].append(self.effects(kind, start))
                done += 1
                if progress is not None:
                    progress(done, total)
        return tables

    def effects(self, kind: str, start: int) -> torch.Tensor:
        """[H, positions]: the decoder's KL with each head of attention `kind` in layer `start` zeroed."""
        mask = self.masks[kind]
        heads = mask.shape[0]
        if kind == "encoder":  # the rest of the encoder, then every decoder layer reads its output
            h = self.encoder_states[start].expand(heads, -1, -1)
            for i in range(start, len(self.encoder_layers)):
                h = _layer(self.encoder_layers[i], h, self.below, i, mask if i == start else None)
            ablated = h if self.encoder.final_norm is None else self.encoder.final_norm(h)
            out = self._decode(self.above.x.expand(heads, -1, -1), ablated, 0, {})
        else:
            state = self.decoder_states[start].expand(heads, -1, -1)
            out = self._decode(state, self.memory.expand(heads, -1, -1), start, {kind: mask})
        return self.reader.compare(self.full, self.reader.read(out))

    def _decode(
        self, x: torch.Tensor, memory: torch.Tensor, start: int, masks: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """Decoder layers start.. on x (B, T, E) reading memory (B, S, E), `masks` in layer `start`."""
        for i in range(start, len(self.decoder_layers)):
            x = self._decode_layer(x, memory, i, masks if i == start else {})
        return x

    def _decode_layer(
        self, x: torch.Tensor, memory: torch.Tensor, i: int, masks: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        x, _, _ = self.decoder_layers[i].decode(
            x,
            self.above.keeps[i],
            memory,
            None,
            bias=self.above.bias,
            need_weights=False,
            taps=Taps(head_mask=masks.get("decoder")),
            cross_taps=Taps(head_mask=masks.get("cross")),
        )
        return x


class _Seq2SeqNext:
    """An encoder-decoder's decoder stream x (B, T, E) -> log-probabilities (B, positions, V) of the next
    token, float64, as transformers' model gives them and greedy generation reads them (the final norm,
    T5's logits scale, the LM head, the logits bias, the banned tokens at -inf); compared as
    KL(p_full ‖ p_ablated), (B, positions), where a banned token, at probability 0 on both sides, adds 0."""

    def __init__(self, model: Ablated, network: EncoderDecoder, positions: list[int]) -> None:
        self.positions = positions
        self.norm = network.decoder.final_norm
        self.weight = model.lm_head()
        self.bias = model.logits_bias()
        self.banned = list(network.config.banned_token_ids)
        self.scale = network.config.logits_scale

    def read(self, x: torch.Tensor) -> torch.Tensor:
        h = x[:, self.positions]
        if self.norm is not None:
            h = self.norm(h)
        if self.scale != 1.0:
            h = h * self.scale
        logits = (h @ self.weight.T).double()
        if self.bias is not None:
            logits = logits + self.bias
        if self.banned:
            logits[..., self.banned] = -torch.inf
        return F.log_softmax(logits, dim=-1)

    def compare(self, full: torch.Tensor, ablated: torch.Tensor) -> torch.Tensor:
        terms = full.exp() * (full - ablated)
        return torch.where(torch.isneginf(full), 0.0, terms).sum(-1)
