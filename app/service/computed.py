"""`Computed`: what the service keeps of an `mha.AttentionResult`, token-level or merged to words."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

import mha
from app.errors import InvalidInputError
from mha import analysis

KINDS = ("encoder", "decoder", "cross")  # a request's `kind`: the encoder's is every model's attention


@dataclass(frozen=True, eq=False)
class Seq2Seq:
    """What an encoder-decoder adds: the target (the decoder start token first) and two attentions."""

    target_tokens: list[str]
    target_special: list[bool]
    target_unknown: list[bool]
    target_truncated: bool
    decoder_attentions: torch.Tensor  # float32 CPU [L_dec, H_dec, m, m]
    cross_attentions: torch.Tensor  # float32 CPU [L_dec, H_dec, m, n]
    # As Computed's norms and row_norms, for the decoder's self-attention (keys: m) and cross (keys: n)
    decoder_norms: torch.Tensor | None = None
    cross_norms: torch.Tensor | None = None
    decoder_row_norms: torch.Tensor | None = None
    cross_row_norms: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        held = (self.decoder_attentions, self.cross_attentions, self.decoder_norms, self.cross_norms)
        totals = (self.decoder_row_norms, self.cross_row_norms)
        return sum(a.numel() * a.element_size() for a in (*held, *totals) if a is not None)


@dataclass(frozen=True, eq=False)
class Computed:
    """The header fields of every answer and the attention, float32 [L, H, n, n] (cross attention's view:
    [L, H, m, n], its keys `key_tokens`): `maps` where the model computed it (a CUDA model's stays on its
    device, where the compact answers are quantized), `attentions` the same on the CPU, copied on first use.

    `word_ids` and `offsets` are the tokenizer's, kept to merge pieces into words; empty for a view that is
    already word-level."""

    model: str
    tokens: list[str]
    segments: list[int]
    special: list[bool]  # control tokens (mha's rule): what the `special` statistic weighs
    unknown: list[bool]  # the tokenizer's [UNK], a word it cannot spell: styled apart, not special
    truncated: bool
    causal: bool
    kv_heads: int
    maps: torch.Tensor
    generated: int = 0  # the last `generated` tokens were written by the model (a continuation)
    byte_level: bool = False  # `tokens` are a byte-level BPE's ("Ġ" = a space byte); False for words
    # the strings `offsets` index into: (text, pair), or the rendered chat template
    texts: tuple[str, str | None] = ("", None)
    word_ids: tuple[int | None, ...] = ()
    offsets: tuple[tuple[int, int], ...] = ()
    # An encoder-decoder's (None for the others): `tokens` and `attentions` are the source and the
    # encoder's, `generated` counts the target's tokens the model wrote.
    seq2seq: Seq2Seq | None = None
    kind: str = "encoder"  # which of KINDS `attentions` is (of_kind)
    key_tokens: list[str] | None = None  # cross attention's keys (the source); None: the keys are `tokens`
    key_special: list[bool] | None = None
    # ‖f_h(x_j)‖ [L, H, keys], float32 CPU (mha.analysis.norms): the size of what each head moves from each
    # key per unit of weight; None at word level.
    norms: torch.Tensor | None = None
    # "weight": `attentions` are the model's weights; "norm" (`weigh_by_norm`): each row of α_ij ‖f_h(x_j)‖
    # divided by its total, which `row_norms` [L, H, n] keeps (None at word level).
    weighting: str = "weight"
    row_norms: torch.Tensor | None = None

    @property
    def attentions(self) -> torch.Tensor:
        """`maps` on the CPU: the same tensor for a CPU model; a device's copied once, when an answer
        needs the float32 values on the host (the first view's compact answer does not). Two threads
        asking at once may both copy; either copy is the same values."""
        host: torch.Tensor | None = self.__dict__.get("_host")
        if host is None:
            host = self.maps.to("cpu")
            object.__setattr__(self, "_host", host)  # a cache, not a field: frozen stays true of the fields
        return host

    def head(self, layer: int, head: int) -> torch.Tensor:
        """One head's [rows, cols] on the CPU, without copying the others from a device."""
        if "_host" in self.__dict__ or self.maps.device.type == "cpu":
            return self.attentions[layer, head]
        return self.maps[layer, head].to("cpu")

    @property
    def layers(self) -> int:
        return int(self.maps.shape[0])

    @property
    def heads(self) -> int:
        return int(self.maps.shape[1])

    @property
    def n(self) -> int:
        return int(self.maps.shape[2])

    @property
    def cols(self) -> int:
        """Keys per query row: n, or the source's length for cross attention."""
        return int(self.maps.shape[3])

    @property
    def nbytes(self) -> int:
        """What the cache counts: the maps once, whether on the CPU or on a device with their host copy
        made (the cache's byte budget bounds each memory), and the small tensors beside them."""
        extra = self.seq2seq.nbytes if self.seq2seq is not None else 0
        for small in (self.norms, self.row_norms):
            extra += 0 if small is None else small.numel() * small.element_size()
        return self.maps.numel() * self.maps.element_size() + extra

    def header(self) -> dict[str, Any]:
        """The fields every attention answer starts with, in the documented order (AttentionHeader); an
        encoder-decoder's add the architecture and the target."""
        header = {
            "model": self.model,
            "tokens": self.tokens,
            "segments": self.segments,
            "special": self.special,
            "unknown": self.unknown,
            "layers": self.layers,
            "heads": self.heads,
            "kv_heads": self.kv_heads,
            "n": self.n,
            "truncated": self.truncated,
            "causal": self.causal,
            "generated": self.generated,
            "byte_level": self.byte_level,
        }
        if self.weighting != "weight":  # absent: the weights, as every answer before the switch
            header["weighting"] = self.weighting
        if self.seq2seq is not None:
            header.update(
                architecture="encoder-decoder",
                target_tokens=self.seq2seq.target_tokens,
                target_special=self.seq2seq.target_special,
                target_unknown=self.seq2seq.target_unknown,
                target_truncated=self.seq2seq.target_truncated,
            )
        return header

    def sections(self) -> list[tuple[str, torch.Tensor]]:
        """An encoder-decoder's (kind, [L, H, rows, cols]) for each of KINDS, in that order."""
        if self.seq2seq is None:
            raise ValueError(f"{self.model!r} is not an encoder-decoder: it has one attention")
        s = self.seq2seq
        return list(zip(KINDS, (self.maps, s.decoder_attentions, s.cross_attentions), strict=True))

    def of_kind(self, kind: str) -> Computed:
        """The view whose `attentions` are `kind`'s ("encoder": this one). The decoder's queries and keys
        are the target's tokens; cross attention's `tokens` are the target's (its queries) and `key_tokens`
        the source's. InvalidInputError (422) for decoder or cross of a model without them."""
        if kind == self.kind:  # a model's own view is its encoder's (KINDS[0])
            return self
        if self.seq2seq is None:
            raise InvalidInputError(
                f'kind "{kind}" needs an encoder-decoder model: {self.model!r} is '
                f'{article(self.architecture)} model, whose only attention is kind "encoder"'
            )
        s = self.seq2seq
        attentions = s.decoder_attentions if kind == "decoder" else s.cross_attentions
        norms = s.decoder_norms if kind == "decoder" else s.cross_norms
        row_norms = s.decoder_row_norms if kind == "decoder" else s.cross_row_norms
        return replace(
            self,
            tokens=s.target_tokens,
            segments=[0] * len(s.target_tokens),
            special=s.target_special,
            unknown=s.target_unknown,
            truncated=s.target_truncated,
            causal=kind == "decoder",
            kv_heads=int(attentions.shape[1]),
            maps=attentions,
            texts=("", None),
            word_ids=(),
            offsets=(),
            seq2seq=None,
            kind=kind,
            key_tokens=self.tokens if kind == "cross" else None,
            key_special=self.special if kind == "cross" else None,
            norms=norms,
            row_norms=row_norms,
        )

    @property
    def architecture(self) -> str:
        if self.seq2seq is not None:
            return "encoder-decoder"
        return "decoder" if self.causal else "encoder"

    def check_head(self, layer: int, head: int) -> None:
        what = f"{self.model!r}" + ("" if self.kind == "encoder" else f" ({self.kind} attention)")
        if layer >= self.layers:
            raise InvalidInputError(f"layer {layer} is out of range: {what} has layers 0..{self.layers - 1}")
        if head >= self.heads:
            raise InvalidInputError(f"head {head} is out of range: {what} has heads 0..{self.heads - 1}")


def from_result(name: str, info: mha.ModelInfo, result: mha.AttentionResult) -> Computed:
    """The result of a model of `info` as the service (and a snapshot) keeps it: its maps where they are (a
    CUDA model's on its device, attend_batch(on_device=True)), every smaller tensor on the CPU."""
    attentions = result.attentions.to(dtype=torch.float32)
    if not attentions.is_contiguous() or attentions.untyped_storage().nbytes() > 4 * attentions.numel():
        # A row of a padded batch: copy it, so the cache never keeps a whole batch's buffer alive.
        attentions = attentions.clone(memory_format=torch.contiguous_format)
    seq2seq = None
    if isinstance(result, mha.Seq2SeqResult):
        seq2seq = Seq2Seq(
            target_tokens=list(result.target_tokens),
            target_special=[bool(s) for s in result.target_special],
            target_unknown=[bool(s) for s in result.target_unknown],
            target_truncated=bool(result.target_truncated),
            decoder_attentions=result.decoder_attentions,  # mha's own: float32, CPU, owned
            cross_attentions=result.cross_attentions,
            decoder_norms=result.decoder_norms,
            cross_norms=result.cross_norms,
        )
    return Computed(
        model=name,
        tokens=list(result.tokens),
        segments=list(result.segments),
        special=[bool(s) for s in result.special],
        unknown=[bool(s) for s in result.unknown],
        truncated=bool(result.truncated),
        causal=bool(info.causal),
        kv_heads=int(info.kv_heads),
        generated=int(result.generated),
        byte_level=bool(info.byte_level),
        texts=result.texts,
        maps=attentions,
        word_ids=tuple(result.word_ids),
        offsets=tuple((int(start), int(end)) for start, end in result.offsets),
        seq2seq=seq2seq,
        # mha's own: float32, owned; [L, H, n], small beside the maps (None unless attended with norms=True)
        norms=None if result.norms is None else result.norms.to("cpu"),
    )


def weigh_by_norm(computed: Computed) -> Computed:
    """The "norm" view: every head's α_ij ‖f_h(x_j)‖ (what it moves from key j into query i, Kobayashi
    et al. 2020), each row divided by its total so that rows sum to 1 as weights do and every statistic,
    map and page reads it as they read weights; the totals go to `row_norms`. An encoder-decoder's three
    attentions (encoder, decoder, cross: its keys are the source's) each so."""
    shares, totals = _by_norm(computed.attentions, computed.norms)
    seq2seq = computed.seq2seq
    if seq2seq is not None:
        decoder, decoder_totals = _by_norm(seq2seq.decoder_attentions, seq2seq.decoder_norms)
        cross, cross_totals = _by_norm(seq2seq.cross_attentions, seq2seq.cross_norms)
        seq2seq = replace(
            seq2seq,
            decoder_attentions=decoder,
            cross_attentions=cross,
            decoder_row_norms=decoder_totals,
            cross_row_norms=cross_totals,
        )
    return replace(computed, maps=shares, weighting="norm", row_norms=totals, seq2seq=seq2seq)


def _by_norm(attentions: torch.Tensor, norms: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    if norms is None:  # the service attends with norms=True: a view without them is a bug, not input
        raise RuntimeError("this view has no value norms: was it attended with norms=True?")
    shares, totals = analysis.row_shares(analysis.weight_norm_map(attentions, norms))
    return shares.contiguous(), totals.contiguous()


def merge_words(computed: Computed) -> Computed:
    """Word-level view: pieces grouped by the tokenizer's word ids, labels sliced from the text by offsets."""
    if computed.seq2seq is not None or computed.kind != "encoder":
        # The target has no word ids of its own when the model wrote it, and cross attention's keys would
        # need merging apart from its queries: token-level only.
        raise InvalidInputError(
            f"words: true is not available for an encoder-decoder ({computed.model!r}): its answers are "
            "token-level; send words: false"
        )
    groups = analysis.word_groups_from(computed.word_ids, computed.segments, computed.special).groups
    labels = analysis.word_labels(
        computed.tokens, groups, offsets=computed.offsets, segments=computed.segments, texts=computed.texts
    )
    return replace(
        computed,
        tokens=labels,
        # A group never mixes segments, and special tokens are groups of their own.
        segments=[computed.segments[group[0]] for group in groups],
        special=[computed.special[group[0]] for group in groups],
        unknown=[any(computed.unknown[i] for i in group) for group in groups],  # a word spelled [UNK]
        maps=analysis.merge_to_words(computed.attentions, groups).contiguous(),
        byte_level=False,  # words are sliced from the text, not spelled by the tokenizer
        word_ids=(),
        offsets=(),
        norms=None,  # per token: a word's would need its pieces' vectors summed, not their norms
        row_norms=None,
    )


def article(word: str) -> str:
    """A word with its indefinite article: "an encoder", "a decoder"."""
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"
