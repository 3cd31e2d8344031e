"""An encoder-decoder's attention for one source: forced decoding of a given target, or greedy generation.

The decoder's input is the decoder start token followed by the target's tokens, as transformers builds
decoder_input_ids from labels (tokenizer(text_target=target), shifted right). Without a target the model
writes one first, as transformers' generate(do_sample=False, num_beams=1): the encoder runs once, then
each step runs the decoder over the start token and what it wrote so far without attention weights (the
fused kernel) and appends the argmax of the LM head (plus BART's and Marian's logits bias), honouring the
checkpoint's forced first and last tokens and its banned ones, stopping after an end-of-sequence token,
after max_new_tokens, or at the decoder's length limit. A final forward returns all three kinds of
attention over the source and the whole target: target token i was chosen from decoder position i − 1,
so decoder and cross attention row i − 1 are what the model looked at while writing it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

import torch

from mha.errors import Cancelled
from mha.networks.result import ModelInfo, Seq2SeqResult, marks_of, owned
from mha.networks.seq2seq import EncoderDecoder
from mha.text.tokenize import Encoded, TextEncoder

__all__ = [
    "DEFAULT_NEW_TOKENS",
    "Translator",
    "attend_seq2seq",
    "attend_seq2seq_ids",
    "greedy_target",
    "spell",
]

DEFAULT_NEW_TOKENS = 20  # what attend() writes when given neither a target nor max_new_tokens


class Translator(Protocol):
    """What an encoder-decoder's attend needs of a loaded model
    (mha.model.attention_model.AttentionModel)."""

    info: ModelInfo
    network: Any  # an EncoderDecoder
    encoder: TextEncoder
    tokenizer: Any
    device: torch.device
    eos_ids: frozenset[int]

    def lm_head(self) -> torch.Tensor: ...

    def logits_bias(self) -> torch.Tensor | None: ...


def greedy_target(
    model: Translator,
    memory: torch.Tensor,
    max_new_tokens: int,
    cancel: Callable[[], bool] | None = None,
) -> list[int]:
    """The token ids greedy decoding writes after the start token, reading the encoder's states `memory`
    (1, S, E): at most max_new_tokens, the decoder's input never beyond its limit."""
    network: EncoderDecoder = model.network
    config = network.config
    limit = network.decoder.config.max_tokens
    weight, bias = model.lm_head(), model.logits_bias()  # [V, E], [V] or None
    # generate's max_length: the start token and max_new_tokens; its forced EOS takes the last slot.
    max_length = min(1 + max_new_tokens, limit)
    ids = [config.decoder_start_token_id]
    while len(ids) < max_length:
        if cancel is not None and cancel():
            raise Cancelled(f"generation cancelled after {len(ids) - 1} of {max_new_tokens} tokens")
        batch = torch.tensor([ids], device=model.device)
        hidden, _, _ = network.decoder.decode(batch, memory, need_weights=False)
        logits = hidden[0, -1] @ weight.T  # (V,)
        if bias is not None:
            logits = logits + bias
        if config.banned_token_ids:
            logits = logits.index_fill(
                0, torch.tensor(config.banned_token_ids, device=logits.device), -torch.inf
            )
        token = int(torch.argmax(logits))
        if len(ids) == 1 and config.forced_bos_token_id is not None:
            token = config.forced_bos_token_id
        elif len(ids) == max_length - 1 and config.forced_eos_token_id is not None:
            token = config.forced_eos_token_id
        ids.append(token)
        if token in model.eos_ids:
            break
    return ids[1:]


def attend_seq2seq(
    model: Translator,
    text: str,
    text_pair: str | None,
    *,
    target: str | None,
    max_new_tokens: int | None,
    limit: int,
    hidden_state: bool,
    cancel: Callable[[], bool] | None,
    chat: bool = False,
    norms: bool = False,
) -> Seq2SeqResult:
    """model.attend(text, target=...) for an encoder-decoder: see the module's docstring. norms: the
    value products of all three attentions, from the same forwards (the encoder's, the decoder's)."""
    if max_new_tokens is not None and max_new_tokens < 0:
        raise ValueError(f"max_new_tokens ({max_new_tokens}) must be at least 0")
    network: EncoderDecoder = model.network
    source = model.encoder.encode_batch([(text, text_pair)], limit, chat=chat)[0]
    given = None
    if target is not None:
        # Room for the start token: the target's own tokens are cut to the decoder's limit minus one.
        given = model.encoder.encode_target(target, network.decoder.config.max_tokens - 1)
    return _decoded(
        model,
        source,
        given,
        target or "",
        max_new_tokens,
        hidden_state=hidden_state,
        cancel=cancel,
        norms=norms,
    )


def attend_seq2seq_ids(
    model: Translator,
    source_ids: Sequence[int],
    target_ids: Sequence[int],
    *,
    cancel: Callable[[], bool] | None = None,
) -> Seq2SeqResult:
    """The attentions of ids as they are (a head probe's sequence, which decoding and tokenizing again
    need not give back): ``source_ids`` through the encoder, ``target_ids`` read by forced decoding after
    the decoder start token; no hidden states. Forced decoding reads neither the LM head nor the logits
    bias."""
    source, given = _written(list(source_ids), model.encoder), _written(list(target_ids), model.encoder)
    return _decoded(model, source, given, "", None, hidden_state=False, cancel=cancel, norms=False)


def _decoded(
    model: Translator,
    source: Encoded,
    given: Encoded | None,
    target: str,
    max_new_tokens: int | None,
    *,
    hidden_state: bool,
    cancel: Callable[[], bool] | None,
    norms: bool,
) -> Seq2SeqResult:
    """The encoder over `source`, then the decoder over `given` (None: what the model writes first)."""
    network: EncoderDecoder = model.network
    start = network.config.decoder_start_token_id
    with torch.no_grad():
        source_ids = torch.tensor([source.ids], device=model.device)
        encoded = network.encoder(source_ids, cancel=cancel, need_products=norms)
        memory, encoder_attentions = encoded.hidden_state, encoded.attentions
        assert memory is not None  # need_hidden defaults to True
        if given is None:
            budget = DEFAULT_NEW_TOKENS if max_new_tokens is None else max_new_tokens
            new = greedy_target(model, memory, budget, cancel)
            decoder_input = _written(new, model.encoder)
        else:
            new = []
            decoder_input = given
        decoder_input = _started(decoder_input, start, model.encoder)
        decoder_ids = torch.tensor([decoder_input.ids], device=model.device)
        products = None
        if norms:
            layers, heads = network.decoder.config.num_layers, network.decoder.config.num_heads
            products = (
                memory.new_empty(layers, 1, decoder_ids.shape[1], heads, heads),
                memory.new_empty(layers, 1, memory.shape[1], heads, heads),
            )
        hidden, own, cross = network.decoder.decode(decoder_ids, memory, cancel=cancel, products_out=products)
    assert encoder_attentions is not None and own is not None and cross is not None  # need_weights
    result = Seq2SeqResult.of(
        source,
        spell(model.tokenizer, source.ids),
        encoder_attentions[:, 0].to("cpu", torch.float32),
        memory[0].to("cpu", torch.float32) if hidden_state else None,
        value_products=None if encoded.products is None else encoded.products[:, 0].to("cpu", torch.float32),
    )
    return replace(
        result,
        generated=len(new),
        target_tokens=spell(model.tokenizer, decoder_input.ids),
        target_ids=decoder_input.ids,
        **marks_of(decoder_input, "target_"),
        target=target,
        decoder_attentions=owned(own[:, 0].to("cpu", torch.float32)),
        cross_attentions=owned(cross[:, 0].to("cpu", torch.float32)),
        decoder_hidden_state=owned(hidden[0].to("cpu", torch.float32)) if hidden_state else None,
        decoder_value_products=None if products is None else _kept(products[0]),
        cross_value_products=None if products is None else _kept(products[1]),
    )


def _kept(batch_of_one: torch.Tensor) -> torch.Tensor:
    """[L, 1, ...] on the model's device -> [L, ...] float32 on the CPU, owning its storage."""
    return owned(batch_of_one[:, 0].to("cpu", torch.float32))


def spell(tokenizer: Any, ids: list[int]) -> list[str]:
    """The tokenizer's spelling of each id; "<id N>" for an id past the tokenizer's vocabulary, which a
    model whose embedding is padded past it (T5's 32128 rows for 32100 tokens) can write."""
    tokens = tokenizer.convert_ids_to_tokens(ids)
    return [f"<id {i}>" if token is None else str(token) for i, token in zip(ids, tokens, strict=True)]


def _written(ids: list[int], encoder: TextEncoder) -> Encoded:
    """Tokens the model wrote: no span of any text, no word of it."""
    n = len(ids)
    special, unknown = encoder.marks(ids)
    return Encoded(
        ids, [None] * n, [0] * n, [0] * n, special, unknown, [(0, 0)] * n, [None] * n, False, ("", None)
    )


def _started(encoded: Encoded, start: int, encoder: TextEncoder) -> Encoded:
    """`encoded` after the decoder start token (a template token: no span, no word)."""
    head = _written([start], encoder)
    return Encoded(
        head.ids + encoded.ids,
        head.sources + encoded.sources,
        head.segments + encoded.segments,
        head.type_ids + encoded.type_ids,
        head.special + encoded.special,
        head.unknown + encoded.unknown,
        head.offsets + encoded.offsets,
        head.word_ids + encoded.word_ids,
        encoded.truncated,
        encoded.texts,
    )
