"""Errors a caller can map to a response: all are ValueError subclasses except `Cancelled`.

Two families: a checkpoint that cannot be loaded (`CheckpointError`, the operator's problem) and an input
mha refuses (`InputError`, the request's problem: a service answers it with a 4xx). Each `InputError`
subclass carries the numbers its message quotes as attributes (`FlowTooLongError(limit, n).limit`), so a
caller can word its own message without parsing ours; `details` holds them all as a dict.

A plain ValueError stays for what no well-formed request can cause: a tensor of the wrong shape, a device
or dtype name, a bad `k`. That is the caller's bug, and mapping it to a 4xx would hide it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, cast

__all__ = [
    "Cancelled",
    "ChatPairError",
    "ChatTemplateError",
    "CheckpointError",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "EmptyInputError",
    "FlowTooLongError",
    "HeadOutOfRangeError",
    "HeadsMismatchError",
    "InputError",
    "MaxTokensError",
    "ProbeSizeError",
    "NoChatTemplateError",
    "NoRoomError",
    "NonFiniteOutputError",
    "NotCausalError",
    "NothingAlignedError",
    "PairNotSupportedError",
    "QueriesOutOfRangeError",
    "ShapeMismatchError",
    "TargetNotSupportedError",
    "TokenIdOutOfRangeError",
    "TokenizerNotFoundError",
    "UnsupportedCheckpointError",
]


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the subclass says why."""


class UnsupportedCheckpointError(CheckpointError):
    """The checkpoint's architecture (or one of its options) is not one we can run exactly."""


class CheckpointMismatchError(CheckpointError):
    """The checkpoint's weights do not fit the architecture: missing, unexpected or mis-shaped keys, or
    weights of another family than config.json's model_type (the message names both)."""


class CheckpointNotFoundError(CheckpointError):
    """No checkpoint at the given path (and it could not be fetched), or a file it needs is missing or
    unreadable: config.json (or a field of it its family cannot read), the weights (truncated, damaged,
    not weights at all), the tokenizer."""


class TokenizerNotFoundError(CheckpointNotFoundError):
    """The checkpoint has no tokenizer of its own: its vocabulary files are missing, or the tokenizer they
    give is far smaller than the model's vocabulary (transformers would build a stand-in of a few tokens)."""


# --- inputs ---------------------------------------------------------------------------------------------


class InputError(ValueError):
    """An input mha refuses. mha raises the subclasses; each words its message from its `template` and
    the numbers it is given, which it keeps as attributes (and all together in `details`)."""

    template = ""

    def __init__(self, message: str | None = None, **details: Any) -> None:
        super().__init__(self.template.format(**details) if message is None else message)
        self.details: dict[str, Any] = details
        for name, value in details.items():
            setattr(self, name, value)

    def __post_init__(self) -> None:
        # A subclass that is a dataclass of the numbers its template quotes (eq=False, repr=False: compared
        # and shown as any exception): its typed __init__ sets them, and the message is the template filled
        # with them.
        fields = dataclasses.fields(cast(Any, self))
        InputError.__init__(self, **{f.name: getattr(self, f.name) for f in fields})

    def __reduce__(self) -> tuple[Any, ...]:
        # The subclasses' constructors take numbers, not the message: rebuild from both (pickle, Ray).
        return (_rebuild, (type(self), str(self), self.details))


def _rebuild(cls: type[InputError], message: str, details: dict[str, Any]) -> InputError:
    error = cls.__new__(cls)
    InputError.__init__(error, message, **details)
    return error


class EmptyInputError(InputError):
    """The text (or the pair) is empty or blank, or gives no token of its own. `field` names which."""

    field: str

    def __init__(self, field: str, value: object, *, no_tokens: bool = False) -> None:
        if no_tokens:
            message = f"{field} gives no tokens: {value!r}"
        elif field == "text_pair":
            message = f"text_pair is empty: {value!r} (pass None for no pair)"
        else:
            message = f"{field} is empty: {value!r}"
        super().__init__(message, field=field)


@dataclasses.dataclass(eq=False, repr=False)
class MaxTokensError(InputError):
    """`max_tokens` is below 1 or above the model's own `limit`."""

    template = "max_tokens ({max_tokens}) must be between 1 and the model's maximum ({limit})"
    max_tokens: int
    limit: int


@dataclasses.dataclass(eq=False, repr=False)
class ProbeSizeError(InputError):
    """A head probe (mha.model.probe) of `sequences` random sequences of `length` tokens, repeated once,
    outside its bounds: 1..`most_sequences` sequences, 1..`most_length` tokens (half the model's limit, less
    the start token)."""

    template = (
        "a head probe takes 1 to {most_sequences} sequences of 1 to {most_length} tokens (twice the length, "
        "plus a start token, must fit the model's {limit}); got {sequences} of {length}"
    )
    sequences: int
    length: int
    most_sequences: int
    most_length: int
    limit: int


class NoRoomError(InputError):
    """`max_tokens` leaves no token for a text once the template's special tokens (or, for a pair, the
    other text) are in."""

    max_tokens: int

    def __init__(self, max_tokens: int, *, pair: bool = False) -> None:
        room = "both texts" if pair else "the text after the special tokens"
        super().__init__(f"max_tokens ({max_tokens}) leaves no room for {room}", max_tokens=max_tokens)


class TokenIdOutOfRangeError(InputError):
    """The tokenizer gave `ids` past the model's `vocab_size` embeddings (tokenizer and weights differ)."""

    template = (
        "the tokenizer gives token ids {ids} but the model has only {vocab_size} token embeddings: "
        "the checkpoint's tokenizer and weights do not match"
    )
    ids: list[int]
    vocab_size: int

    def __init__(self, ids: Sequence[int], vocab_size: int) -> None:
        message = self.template.format(ids=list(ids)[:5], vocab_size=vocab_size)  # the first five
        super().__init__(message, ids=list(ids), vocab_size=vocab_size)


@dataclasses.dataclass(eq=False, repr=False)
class PairNotSupportedError(InputError):
    """The tokenizer marks the pair with `type_id`, but the model has only `type_vocab_size` token types."""

    template = (
        "the tokenizer marks the pair with token type {type_id} but the model has {type_vocab_size} token "
        "type(s), so it cannot read a pair (transformers fails on it too); send the two texts as one text"
    )
    type_id: int
    type_vocab_size: int


@dataclasses.dataclass(eq=False, repr=False)
class NoChatTemplateError(InputError):
    """The tokenizer has no chat template to put the text in."""

    template = "this model's tokenizer has no chat template; send the text without chat"


@dataclasses.dataclass(eq=False, repr=False)
class ChatPairError(InputError):
    """A chat template takes one user turn: no pair."""

    template = "a chat-templated input is one user turn: send it without text_pair"


@dataclasses.dataclass(eq=False, repr=False)
class ChatTemplateError(InputError):
    """The tokenizer's chat template failed on this input, or passed a bound (mha.text.chat): `reason`
    ends the sentence ("took longer than 2 s to render and was stopped", "refused this input: ...")."""

    template = "this model's chat template {reason}"
    reason: str


@dataclasses.dataclass(eq=False, repr=False)
class NonFiniteOutputError(InputError):
    """`model` computed NaN or an infinity for this input (`what`: its attention, its head effects, its
    trace): a value overflowed, in its weights or on the way. No answer may hold one."""

    template = (
        "{model!r} computed NaN or an infinity in {what} for this input, so there is nothing exact to show: "
        "a value overflowed on the way (weights that large, or a precision too small for this input)"
    )
    model: str
    what: str


@dataclasses.dataclass(eq=False, repr=False)
class NotCausalError(InputError):
    """Only a causal (decoder) model continues a prompt; `model` is an encoder."""

    template = (
        "{model!r} is an encoder: it reads the whole text at once and cannot continue it; continuing a "
        "prompt (max_new_tokens) needs a decoder model"
    )
    model: str


@dataclasses.dataclass(eq=False, repr=False)
class TargetNotSupportedError(InputError):
    """A target text was given to a model that is not an encoder-decoder: nothing reads it."""

    template = (
        "{model!r} is not an encoder-decoder (its architecture is {architecture!r}): a target text needs "
        "an encoder-decoder model (T5, BART, Marian), whose decoder reads it"
    )
    model: str
    architecture: str


@dataclasses.dataclass(eq=False, repr=False)
class FlowTooLongError(InputError):
    """Attention flow of `n` tokens is over its `limit`: its cost grows as n⁴ (mha.analysis.rollout)."""

    template = (
        "attention flow is limited to {limit} tokens (n² max-flow problems), got {n}; "
        "use rollout, pass fewer queries with a larger max_tokens, or shorten the input"
    )
    limit: int
    n: int


class QueriesOutOfRangeError(InputError):
    """Query rows `queries` lie outside 0..n-1."""

    queries: list[int]
    n: int

    def __init__(self, queries: Sequence[int], n: int) -> None:
        super().__init__(
            f"queries {list(queries)} are outside 0..{n - 1} (n = {n})", queries=list(queries), n=n
        )


@dataclasses.dataclass(eq=False, repr=False)
class HeadOutOfRangeError(InputError):
    """Head (`layer`, `head`) is not one of the model's `layers` x `heads`."""

    template = "head ({layer}, {head}) is outside the {layers} x {heads} heads"
    layer: int
    head: int
    layers: int
    heads: int


class ShapeMismatchError(InputError):
    """Two maps compared position by position differ in shape (`shape_a`, `shape_b`)."""

    template = "a and b must have the same shape, got {shape_a} and {shape_b}"
    shape_a: tuple[int, ...]
    shape_b: tuple[int, ...]

    def __init__(self, shape_a: Sequence[int], shape_b: Sequence[int]) -> None:
        super().__init__(shape_a=tuple(shape_a), shape_b=tuple(shape_b))


class HeadsMismatchError(InputError):
    """Two models' maps differ in (layers, heads): `heads_a` against `heads_b`; nothing pairs their heads."""

    heads_a: tuple[int, int]
    heads_b: tuple[int, int]

    def __init__(self, heads_a: tuple[int, int], heads_b: tuple[int, int]) -> None:
        (la, ha), (lb, hb) = heads_a, heads_b
        super().__init__(f"a has {la}x{ha} heads but b has {lb}x{hb}", heads_a=(la, ha), heads_b=(lb, hb))


@dataclasses.dataclass(eq=False, repr=False)
class NothingAlignedError(InputError):
    """Two inputs share no aligned token, so there is nothing to compare."""

    template = "no aligned tokens to compare (pairs is empty)"


class Cancelled(Exception):
    """A forward stopped between layers because its `cancel` callback said nobody wants the result."""
