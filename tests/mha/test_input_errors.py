"""One error vocabulary: every input mha refuses raises an mha.errors.InputError subclass that carries the
numbers its message quotes, so a caller (the web service) can word its own message from them."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from mha import analysis, errors, load_pretrained
from mha.errors import InputError

EXAMPLES: list[InputError] = [
    errors.EmptyInputError("text_pair", "  "),
    errors.EmptyInputError("text", "\u200b", no_tokens=True),
    errors.MaxTokensError(65, 64),
    errors.NoRoomError(2),
    errors.NoRoomError(1, pair=True),
    errors.TokenIdOutOfRangeError([40000, 50000], 30522),
    errors.PairNotSupportedError(1, 1),
    errors.FlowTooLongError(14, 20),
    errors.QueriesOutOfRangeError([7, -1], 5),
    errors.HeadOutOfRangeError(3, 0, 3, 4),
    errors.ShapeMismatchError((2, 3, 5, 5), (2, 3, 4, 4)),
    errors.HeadsMismatchError((6, 12), (4, 8)),
    errors.NothingAlignedError(),
    errors.NotCausalError("all-MiniLM-L6-v2"),
    errors.NoChatTemplateError(),
    errors.ChatPairError(),
    errors.NonFiniteOutputError("tiny", "its attention"),
    errors.ChatTemplateError("took longer than 2 s to render and was stopped"),
    errors.TargetNotSupportedError("all-MiniLM-L6-v2", "encoder"),
    errors.ProbeSizeError(40, 50, 32, 255, 512),
]


def uniform(layers: int, heads: int, n: int) -> torch.Tensor:
    return torch.full((layers, heads, n, n), 1.0 / n)


def test_every_input_error_is_exported_and_has_an_example() -> None:
    subclasses = {
        value
        for value in vars(errors).values()
        if isinstance(value, type) and issubclass(value, InputError) and value is not InputError
    }
    assert subclasses == {type(e) for e in EXAMPLES}  # a new error gets an example here
    assert {cls.__name__ for cls in subclasses} <= set(errors.__all__)


@pytest.mark.parametrize("error", EXAMPLES, ids=lambda e: type(e).__name__)
def test_input_errors_carry_their_numbers_and_survive_pickling(error: InputError) -> None:
    assert isinstance(error, ValueError) and str(error)
    for name, value in error.details.items():
        assert getattr(error, name) == value
        if isinstance(value, int) and not isinstance(value, bool):
            assert str(value) in str(error), name  # the message quotes the numbers it carries
    copy = pickle.loads(pickle.dumps(error))  # errors cross process boundaries (workers, Ray)
    assert type(copy) is type(error) and str(copy) == str(error) and copy.details == error.details


def test_flow_too_long_gives_the_service_limit_and_n() -> None:
    with pytest.raises(errors.FlowTooLongError) as caught:
        analysis.attention_flow(uniform(2, 1, 5), max_tokens=4)
    assert (caught.value.limit, caught.value.n) == (4, 5)
    assert "limited to 4 tokens" in str(caught.value) and "got 5" in str(caught.value)
    with pytest.raises(errors.QueriesOutOfRangeError) as out:
        analysis.attention_flow(uniform(2, 1, 5), queries=[0, 7, -1])
    assert (out.value.queries, out.value.n) == ([7, -1], 5)


def test_analysis_refusals_are_input_errors() -> None:
    a = uniform(2, 2, 4)
    with pytest.raises(errors.NothingAlignedError):
        analysis.compare_aligned(a, uniform(2, 2, 3), [])
    with pytest.raises(errors.HeadsMismatchError) as heads:
        analysis.compare_aligned(a, uniform(1, 2, 4), [(0, 0)])
    assert (heads.value.heads_a, heads.value.heads_b) == ((2, 2), (1, 2))
    with pytest.raises(errors.ShapeMismatchError) as shapes:
        analysis.compare(a, uniform(2, 2, 3))
    assert (shapes.value.shape_a, shapes.value.shape_b) == ((2, 2, 4, 4), (2, 2, 3, 3))
    stats = analysis.head_stats(a, ["a", "b", "c", "d"])
    with pytest.raises(errors.HeadOutOfRangeError) as head:
        analysis.similar_heads(stats, 0, 2)
    assert (head.value.layer, head.value.head, head.value.layers, head.value.heads) == (0, 2, 2, 2)
    # A tensor of the wrong shape is the caller's bug, not an input to refuse with a 4xx.
    with pytest.raises(ValueError) as bug:
        analysis.head_stats(a[0], ["a"])
    assert not isinstance(bug.value, InputError)


def test_model_refusals_are_input_errors(tiny_checkpoints: dict[str, Path]) -> None:
    bert = load_pretrained(tiny_checkpoints["bert"], device="cpu")
    with pytest.raises(errors.EmptyInputError) as empty:
        bert.attend("fine", " ")
    assert empty.value.field == "text_pair"
    with pytest.raises(errors.MaxTokensError) as too_many:
        bert.attend("fine", max_tokens=65)
    assert (too_many.value.max_tokens, too_many.value.limit) == (65, 64)
    with pytest.raises(errors.NoRoomError) as no_room:  # [CLS] and [SEP] take both tokens: not an empty text
        bert.attend("fine words", max_tokens=2)
    assert no_room.value.max_tokens == 2 and "after the special tokens" in str(no_room.value)
    with pytest.raises(errors.NoRoomError, match="no room for both texts"):
        bert.attend("fine", "words", max_tokens=4)  # [CLS] fine [SEP] [SEP]: the pair is cut away
    gpt2 = load_pretrained(tiny_checkpoints["gpt2"], device="cpu")
    with pytest.raises(errors.NoRoomError, match="no room for both texts"):
        gpt2.attend("one two", "three four", max_tokens=1)
