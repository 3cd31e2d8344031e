"""`Computed`: what the service keeps of an `mha.AttentionResult`, token-level or merged to words."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

import mha
from app.errors import InvalidInputError
from mha import analysis


@dataclass(frozen=True, eq=False)
class Computed:
    """The header fields of every answer and the attention, float32 CPU [L, H, n, n].

    `word_ids` and `offsets` are the tokenizer's, kept to merge pieces into words; empty for a view that is
    already word-level."""

    model: str
    tokens: list[str]
    segments: list[int]
    special: list[bool]
    truncated: bool
    causal: bool
    kv_heads: int
    attentions: torch.Tensor
    generated: int = 0  # the last `generated` tokens were written by the model (a continuation)
    byte_level: bool = False  # `tokens` are a byte-level BPE's ("Ġ" = a space byte); False for words
    # the strings `offsets` index into: (text, pair), or the rendered chat template
    texts: tuple[str, str | None] = ("", None)
    word_ids: tuple[int | None, ...] = ()
    offsets: tuple[tuple[int, int], ...] = ()

    @property
    def layers(self) -> int:
        return int(self.attentions.shape[0])

    @property
    def heads(self) -> int:
        return int(self.attentions.shape[1])

    @property
    def n(self) -> int:
        return int(self.attentions.shape[2])

    @property
    def nbytes(self) -> int:
        return self.attentions.numel() * self.attentions.element_size()

    def header(self) -> dict[str, Any]:
        """The fields every attention answer starts with, in the documented order (AttentionHeader)."""
        return {
            "model": self.model,
            "tokens": self.tokens,
            "segments": self.segments,
            "special": self.special,
            "layers": self.layers,
            "heads": self.heads,
            "kv_heads": self.kv_heads,
            "n": self.n,
            "truncated": self.truncated,
            "causal": self.causal,
            "generated": self.generated,
            "byte_level": self.byte_level,
        }

    def check_head(self, layer: int, head: int) -> None:
        if layer >= self.layers:
            raise InvalidInputError(
                f"layer {layer} is out of range: {self.model!r} has layers 0..{self.layers - 1}"
            )
        if head >= self.heads:
            raise InvalidInputError(
                f"head {head} is out of range: {self.model!r} has heads 0..{self.heads - 1}"
            )


def from_result(name: str, model: mha.AttentionModel, result: mha.AttentionResult) -> Computed:
    attentions = result.attentions.to(device="cpu", dtype=torch.float32)
    if not attentions.is_contiguous() or attentions.untyped_storage().nbytes() > 4 * attentions.numel():
        # A row of a padded batch: copy it, so the cache never keeps a whole batch's buffer alive.
        attentions = attentions.clone(memory_format=torch.contiguous_format)
    return Computed(
        model=name,
        tokens=list(result.tokens),
        segments=list(result.segments),
        special=[bool(s) for s in result.special],
        truncated=bool(result.truncated),
        causal=bool(model.info.causal),
        kv_heads=int(model.info.kv_heads),
        generated=int(result.generated),
        byte_level=bool(model.info.byte_level),
        texts=result.texts,
        attentions=attentions,
        word_ids=tuple(result.word_ids),
        offsets=tuple((int(start), int(end)) for start, end in result.offsets),
    )


def merge_words(computed: Computed) -> Computed:
    """Word-level view: pieces grouped by the tokenizer's word ids, labels sliced from the text by offsets."""
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
        attentions=analysis.merge_to_words(computed.attentions, groups).contiguous(),
        byte_level=False,  # words are sliced from the text, not spelled by the tokenizer
        word_ids=(),
        offsets=(),
    )
