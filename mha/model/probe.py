"""The head probe: every head's detection scores (mha.analysis.detection) on the field's own input,
``AttentionModel.probe_heads`` -> ``HeadProbe``.

The input (Olsson et al. 2022; TransformerLens's induction demos): a start token, then ``length`` tokens
drawn at random from the vocabulary, the same ``length`` tokens again. A head that copies attends, from
each token of the second half, to the token after its first occurrence (induction) or to that occurrence
(duplicate); the first half has nothing to copy, so the probe's measure reads only the second.

- The start token: the tokenizer's BOS, else its CLS, else none (then each sequence is 2·length tokens);
  an encoder-decoder's decoder starts with its decoder start token, as every target it reads does.
- The vocabulary drawn from (``probe_vocabulary``): the ids below both the tokenizer's size and the
  embeddings', except its control tokens (``mha.text.tokenize.control_ids``) and [UNK], every added token,
  byte-fallback pieces (``<0x0A>``) and reserved ones (``[unused3]``, ``<unused3>``, ``<extra_id_3>``).
  The rule reads the tokenizer only, so every machine with the same files has the same list.
- The draw: ``torch.randint`` into that list from a CPU ``torch.Generator`` seeded ``seed``, [sequences,
  length] at once: the same seed gives the same ids on every machine and device.
- An encoder-decoder: the repeated sequence is the decoder's target, read by forced decoding as
  ``attend(target=...)`` reads one, and the source is the empty text as its tokenizer writes it (T5:
  ``</s>``; BART: ``<s></s>``): nothing in the source to copy from, so the decoder's self-attention does
  the copying it is scored for. ``HeadProbe.kind`` is then "decoder" (else "self").

One batched forward of all the sequences, in as few chunks as keep one layer's maps of a chunk within
``PROBE_MAPS_BYTES``: the maps are taken a layer at a time (``Transformer.forward``'s ``on_layers``) and
scored on the model's device, so a probe holds one layer's weights, not L (an encoder-decoder's decoder
hands all its layers at once: its chunk counts L layers). ``cancel`` is checked before every layer, as
``attend``'s, and ``progress(done, total)`` is called after each chunk.

Scores: the probe's measure, averaged over the sequences; ``spread`` their sample standard deviation
(ddof 1; NaN for one sequence). ``chance``: uniform attention over the keys the model's own masks leave
each query (its causal triangle, its sliding windows on their layers), on the same ids, averaged alike.
A head is labelled with a kind when its score is at least ``DETECTION_THRESHOLD`` and at least
``DETECTION_MARGIN`` above its chance (mha.analysis.detection states the reasons).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
from torch import Tensor

from mha._finite import refuse_non_finite, refuse_non_finite_answer, softmax_rows
from mha.analysis.detection import (
    DETECTION_MARGIN,
    DETECTION_THRESHOLD,
    KINDS,
    chance_scores,
    model_scores,
)
from mha.errors import Cancelled, ProbeSizeError
from mha.networks.result import AttentionResult
from mha.networks.seq2seq import EncoderDecoder
from mha.networks.translate import Translator, attend_seq2seq_ids
from mha.text.tokenize import Encoded, control_ids, unknown_id

if TYPE_CHECKING:
    from mha.loading.convert.base import NetworkConfig
    from mha.networks.result import ModelInfo
    from mha.text.tokenize import TextEncoder


class Probed(Protocol):
    """What a probe reads of the model, and no more (AttentionModel has it): a Protocol, so this module, which
    AttentionModel imports, need not import it back (no circle, annotations included)."""

    network: Any
    tokenizer: Any
    info: ModelInfo
    device: torch.device
    encoder: TextEncoder

    @property
    def config(self) -> NetworkConfig: ...

    # as attend_ids calls it; AttentionModel's own takes more options
    def forward_padded(
        self, encoded: Sequence[Encoded], *, cancel: Callable[[], bool] | None = None
    ) -> tuple[Tensor, Tensor | None]: ...


__all__ = ["MAX_SEQUENCES", "PROBE_MAPS_BYTES", "HeadProbe", "attend_ids", "attend_probe", "probe_heads"]
__all__ += ["probe_ids"]
__all__ += ["max_length", "probe_vocabulary"]

MAX_SEQUENCES = 32  # sequences a probe runs at most: the mean's standard error is already spread / 5.7
# One layer's float32 maps of one chunk of sequences, at most (the scoring adds one temporary of the same
# size): 8 sequences of 101 tokens over 32 heads are 10 MiB, so the default probe is one chunk.
PROBE_MAPS_BYTES = 256 * 2**20
RESERVED = re.compile(r"<0x[0-9A-Fa-f]{2}>|\[unused\d+\]|<unused\d+>|<extra_id_\d+>")


@dataclass(frozen=True)
class HeadProbe:
    """What ``AttentionModel.probe_heads`` measured (module docstring): each dict is {kind: [L, H]}, float32
    on the CPU, keyed by mha.analysis.KINDS."""

    scores: dict[str, Tensor]  # the probe's measure, mean over the sequences
    chance: dict[str, Tensor]  # uniform attention over each layer's visible keys (windows differ)
    spread: dict[str, Tensor]  # standard deviation over the sequences, ddof 1 (NaN for one sequence)
    token_ids: Tensor  # [sequences, 2 * length + 1] int64 (2 * length without a start token)
    tokens: list[str]  # the first sequence as the tokenizer spells it
    labels: list[
        list[list[str]]
    ]  # [layer][head] -> the kinds whose score clears threshold and chance + margin
    threshold: float  # DETECTION_THRESHOLD
    margin: float  # DETECTION_MARGIN
    kind: str  # "self", or "decoder" (an encoder-decoder's decoder self-attention)


def start_token(tokenizer: Any) -> int | None:
    """The probe's first token: BOS, else CLS, else None."""
    for name in ("bos_token_id", "cls_token_id"):
        value = getattr(tokenizer, name, None)
        if value is not None:
            return int(value)
    return None


def probe_vocabulary(tokenizer: Any, vocab_size: int) -> Tensor:
    """The ids a probe draws from, ascending (rule: module docstring)."""
    size = min(len(tokenizer), vocab_size)
    banned = set(control_ids(tokenizer)) | {int(i) for i in tokenizer.get_added_vocab().values()}
    unknown = unknown_id(tokenizer)
    if unknown is not None:
        banned.add(unknown)
    spelled = tokenizer.convert_ids_to_tokens(list(range(size)))
    kept = [
        i for i, token in enumerate(spelled) if i not in banned and token and not RESERVED.fullmatch(token)
    ]
    return torch.tensor(kept, dtype=torch.long)


def probe_ids(vocabulary: Tensor, start: int | None, *, seed: int, sequences: int, length: int) -> Tensor:
    """[sequences, 2 * length (+ 1)]: the start token, `length` ids drawn from `vocabulary`, repeated."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    drawn = vocabulary[torch.randint(len(vocabulary), (sequences, length), generator=generator)]
    parts = [drawn, drawn] if start is None else [torch.full((sequences, 1), start), drawn, drawn]
    return torch.cat(parts, dim=1)


def probe_limit(model: Probed) -> int:
    """The tokens a probe sequence may hold: the model's limit (an encoder-decoder's decoder's)."""
    if isinstance(model.network, EncoderDecoder):
        return int(model.info.decoder_max_tokens or model.network.decoder.config.max_tokens)
    return model.info.max_tokens


def max_length(model: Probed) -> int:
    """The longest ``length`` a probe of ``model`` takes: twice it plus the start token fit its limit."""
    return (probe_limit(model) - 1) // 2


def _check_size(model: Probed, sequences: int, length: int) -> None:
    most_length = max_length(model)
    if not (1 <= sequences <= MAX_SEQUENCES and 1 <= length <= most_length):
        raise ProbeSizeError(sequences, length, MAX_SEQUENCES, most_length, probe_limit(model))


def probe_heads(
    model: Probed,
    seed: int = 0,
    sequences: int = 8,
    length: int = 50,
    *,
    cancel: Callable[[], bool] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> HeadProbe:
    """``model.probe_heads(...)``: see the module docstring."""
    seq2seq = isinstance(model.network, EncoderDecoder)
    network = model.network.decoder if seq2seq else model.network
    ids = _draw(model, seed=seed, sequences=sequences, length=length)
    layers, heads = network.config.num_layers, network.config.num_heads
    per_sequence = {kind: torch.empty(sequences, layers, heads) for kind in KINDS}
    n = ids.shape[1]
    held = layers if seq2seq else 1  # layers' maps alive at once
    chunk = max(1, min(sequences, PROBE_MAPS_BYTES // (held * heads * n * n * 4)))
    chunks = range(0, sequences, chunk)
    for done, first in enumerate(chunks, start=1):
        if cancel is not None and cancel():
            raise Cancelled(f"probe cancelled before chunk {done} of {len(chunks)}")
        rows = slice(first, first + chunk)
        _score_chunk(model, ids[rows], per_sequence, rows, cancel)
        if progress is not None:
            progress(done, len(chunks))
    chance = _chance(network, ids.to(model.device), heads)
    scores = {kind: values.nanmean(0) for kind, values in per_sequence.items()}
    spread = {
        kind: values.std(0, correction=1) if sequences > 1 else torch.full((layers, heads), torch.nan)
        for kind, values in per_sequence.items()
    }
    return HeadProbe(
        scores=scores,
        chance=chance,
        spread=spread,
        token_ids=ids,
        tokens=list(model.tokenizer.convert_ids_to_tokens(ids[0].tolist())),
        labels=_labels(scores, chance),
        threshold=DETECTION_THRESHOLD,
        margin=DETECTION_MARGIN,
        kind="decoder" if seq2seq else "self",
    )


def _draw(model: Probed, *, seed: int, sequences: int, length: int) -> Tensor:
    """The probe's ids [sequences, 2 * length (+ 1)], its size checked first (module docstring)."""
    _check_size(model, sequences, length)
    seq2seq = isinstance(model.network, EncoderDecoder)
    start = int(model.network.config.decoder_start_token_id) if seq2seq else start_token(model.tokenizer)
    vocabulary = probe_vocabulary(model.tokenizer, model.config.vocab_size)
    if len(vocabulary) == 0:
        raise ValueError(f"{model.info.name}'s tokenizer has no ordinary token to draw a probe from")
    return probe_ids(vocabulary, start, seed=seed, sequences=sequences, length=length)


def attend_probe(
    model: Probed, seed: int = 0, length: int = 50, *, cancel: Callable[[], bool] | None = None
) -> AttentionResult:
    """``model.attend_probe(seed, length)``: the AttentionResult of the probe's first sequence, the ids
    ``probe_heads(seed, sequences, length)`` scores in its row 0 whatever ``sequences`` (the draw is row by
    row from one seeded generator), so a head's score can be seen on its own input. An encoder-decoder's
    is a Seq2SeqResult: the empty source, the sequence read as the decoder's target after its start token
    (``attend(target=...)``'s forced decoding), the decoder's self-attention the one probed."""
    ids = _draw(model, seed=seed, sequences=1, length=length)[0].tolist()
    if isinstance(model.network, EncoderDecoder):
        # Forced decoding reads only what Probed has of a Translator (no LM head, no logits bias).
        source = _empty_source(model)[0].tolist()
        result = attend_seq2seq_ids(cast(Translator, model), source, ids[1:], cancel=cancel)
        maps = [result.attentions, result.decoder_attentions, result.cross_attentions]
        refuse_non_finite_answer(model.info.name, maps, [], [])  # as attend's answer: never a NaN map
        return result
    return attend_ids(model, ids, cancel=cancel)


def _score_chunk(
    model: Probed,
    ids: Tensor,
    into: dict[str, Tensor],
    rows: slice,
    cancel: Callable[[], bool] | None,
) -> None:
    """One forward of a chunk of sequences [B, n]; each layer's scores written into into[kind][rows]."""
    on_device = ids.to(model.device)

    def scored(first: int, weights: Tensor) -> None:  # weights [k, B, H, n, n]
        # As attend's answers: NaN or an infinity in a map is refused, never scored (a score of NaN would
        # read as "no pattern key"); one weight a row stands for its row (softmax_rows).
        refuse_non_finite(model.info.name, {"its attention": [softmax_rows(weights)]})
        maps = weights.transpose(0, 1).float()  # [B, k, H, n, n]
        for kind, score in model_scores(maps, on_device).items():
            into[kind][rows, first : first + weights.shape[0]] = score.cpu()

    with torch.no_grad():
        if isinstance(model.network, EncoderDecoder):
            source = _empty_source(model)
            memory, _ = model.network.encode(source, need_weights=False, cancel=cancel)
            _, own, _ = model.network.decoder.decode(
                on_device, memory.expand(len(ids), -1, -1), cancel=cancel
            )
            assert own is not None  # need_weights defaults to True
            scored(0, own)
        else:
            model.network(on_device, need_hidden=False, cancel=cancel, on_layers=scored, layers_at_once=1)


def _empty_source(model: Probed) -> Tensor:
    """[1, S]: the empty text as the tokenizer writes it (its special tokens), else its EOS alone."""
    written = list(model.tokenizer("")["input_ids"])
    if not written:
        eos = model.tokenizer.eos_token_id
        written = [int(eos if eos is not None else model.network.config.decoder_start_token_id)]
    return torch.tensor([written], device=model.device)


def _chance(network: Any, ids: Tensor, heads: int) -> dict[str, Tensor]:
    """{kind: [L, H]}: chance_scores of each layer's own keep-mask (Transformer.prepare), mean over the
    sequences; each distinct mask scored once, one sequence at a time (n² float64 each)."""
    with torch.no_grad():
        keeps = network.prepare(ids[:1]).keeps  # per layer (1, 1, n, n) bool, or None: every key
    n = ids.shape[1]
    out = {kind: torch.empty(len(keeps), heads) for kind in KINDS}
    done: dict[int, dict[str, Tensor]] = {}
    for layer, keep in enumerate(keeps):
        key = id(keep)
        if key not in done:
            visible = torch.ones(n, n, dtype=torch.bool, device=ids.device) if keep is None else keep[0, 0]
            each = [chance_scores(visible, row) for row in ids]  # {kind: [1, 1]} per sequence
            done[key] = {kind: torch.stack([c[kind] for c in each]).nanmean(0).cpu() for kind in KINDS}
        for kind in KINDS:
            out[kind][layer] = done[key][kind][0, 0]
    return out


def _labels(scores: dict[str, Tensor], chance: dict[str, Tensor]) -> list[list[list[str]]]:
    """[layer][head]: the kinds (in KINDS order) whose score clears the threshold and chance + margin."""
    clears = {
        kind: (scores[kind] >= DETECTION_THRESHOLD) & (scores[kind] - chance[kind] >= DETECTION_MARGIN)
        for kind in KINDS
    }
    layers, heads = scores[KINDS[0]].shape
    return [
        [[kind for kind in KINDS if clears[kind][layer, head]] for head in range(heads)]
        for layer in range(layers)
    ]


def attend_ids(
    model: Probed, ids: Tensor | list[int], *, cancel: Callable[[], bool] | None = None
) -> AttentionResult:
    """``model.attend_ids(probe.token_ids[0])``: the AttentionResult of token ids as they are (a probe's
    sequence, which decoding and tokenizing again need not give back), one segment, no offsets;
    ``texts[0]`` the ids decoded, for display. A decoder or encoder (an encoder-decoder's probe input is its
    decoder's target: NotImplementedError)."""
    if isinstance(model.network, EncoderDecoder):
        raise NotImplementedError(
            "an encoder-decoder's probe input is its decoder's target: use attend(target=)"
        )
    ids = [int(i) for i in (ids.tolist() if isinstance(ids, Tensor) else ids)]
    n = len(ids)
    if not 1 <= n <= model.info.max_tokens:
        raise ValueError(f"attend_ids takes 1 to {model.info.max_tokens} ids, got {n}")
    if min(ids) < 0 or max(ids) >= model.config.vocab_size:
        bad = [i for i in ids if not 0 <= i < model.config.vocab_size][:5]
        raise ValueError(f"token ids {bad} are past the model's {model.config.vocab_size} token embeddings")
    special, unknown = model.encoder.marks(ids)
    text = model.tokenizer.decode(ids, skip_special_tokens=False)
    encoded = Encoded(
        ids, [0] * n, [0] * n, [0] * n, special, unknown, [(0, 0)] * n, [None] * n, False, (text, None)
    )
    attentions, _ = model.forward_padded([encoded], cancel=cancel)  # [L, 1, H, n, n], float32 CPU
    refuse_non_finite_answer(model.info.name, [attentions[:, 0]], [], [])  # as attend_batch's
    tokens = list(model.tokenizer.convert_ids_to_tokens(ids))
    return AttentionResult.of(encoded, tokens, attentions[:, 0], None)
