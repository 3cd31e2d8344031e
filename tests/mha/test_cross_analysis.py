"""Cross-attention statistics and labels (mha.analysis.cross) on hand-made maps [L, H, m, n], whose values
are known exactly: one-hot rows, uniform rows, and rows that move through the source in order or not."""

from __future__ import annotations

import math

import pytest
import torch
from tolerances import U32

from mha import analysis

SOURCE = ["▁the", "▁house", "▁is", "▁small", ".", "</s>"]  # n = 6, the last special, "." punctuation
TARGET_SPECIAL = [True, False, False, False, False, True]  # m = 6: the start token and </s> are special


def one_hot(rows: list[int], n: int = len(SOURCE)) -> torch.Tensor:
    """A [1, 1, m, n] head whose row i puts all its weight on key rows[i]."""
    a = torch.zeros(1, 1, len(rows), n)
    a[0, 0, torch.arange(len(rows)), torch.tensor(rows)] = 1.0
    return a


def stats_of(a: torch.Tensor, query_special: list[bool] | None = TARGET_SPECIAL) -> dict[str, torch.Tensor]:
    return analysis.cross_stats(a, SOURCE, query_special=query_special)


def label(a: torch.Tensor, query_special: list[bool] | None = TARGET_SPECIAL) -> str:
    return analysis.cross_labels(stats_of(a, query_special))[0][0]


def test_a_head_that_reads_the_source_in_order_is_an_alignment() -> None:
    # Start token on </s>, then the words in order (one twice: non-decreasing is enough), then </s>.
    a = one_hot([5, 0, 1, 1, 3, 5])
    stats = stats_of(a)
    assert float(stats["monotone"]) == 1.0 and float(stats["argmax_keys"]) == 3  # keys 0, 1, 3
    assert float(stats["entropy"]) == 0.0 and float(stats["max"]) == 1.0
    assert label(a) == "alignment"


def test_one_step_back_breaks_the_alignment() -> None:
    a = one_hot([5, 0, 2, 1, 3, 5])  # the content rows' maxima: 0, 2, 1, 3
    stats = stats_of(a)
    assert float(stats["monotone"]) == pytest.approx(2 / 3, abs=U32)  # 2 of 3 steps go forward
    assert label(a) == "mixed"


def test_maxima_on_one_source_token_are_not_an_alignment() -> None:
    a = one_hot([5, 2, 2, 2, 2, 5])
    stats = stats_of(a)
    assert float(stats["monotone"]) == 1.0 and float(stats["argmax_keys"]) == 1
    assert label(a) == "mixed"  # 4 of 6 rows on "▁is": no pointer label (keys of no special kind)


def test_special_rows_and_keys_are_left_out() -> None:
    # Content rows' maxima over content keys go 0, 1, 2, 3; special rows and the </s> key may do anything.
    a = torch.zeros(1, 1, 6, 6)
    for i, j in enumerate([3, 0, 1, 2, 3, 0]):
        a[0, 0, i, j] = 0.4
        a[0, 0, i, 5] = 0.6  # most weight on </s>, which is special: not a content key
    assert label(a, query_special=[True, False, False, False, False, True]) == "special-sink"  # 0.6 > 0.5
    stats = stats_of(a)
    assert float(stats["monotone"]) == 1.0 and float(stats["argmax_keys"]) == 4
    # With every row counted, the first and last rows move back: not monotone.
    assert float(stats_of(a, query_special=None)["monotone"]) == pytest.approx(3 / 5, abs=U32)


def test_pointer_labels_come_first_and_uniform_rows_are_broad() -> None:
    a = one_hot([4, 4, 4, 4, 4, 4])  # all on "."
    assert float(stats_of(a)["punctuation"]) == 1.0 and label(a) == "punctuation"
    first = one_hot([0, 0, 0, 0, 0, 0])
    assert label(first) == "first-token-sink"
    uniform = torch.full((1, 1, 6, 6), 1 / 6)
    stats = stats_of(uniform)
    # float32: 1/6 (1 rounding), each of 6 terms a·log2 a (2 each), their sum (6), the rescale by ln 2 (1):
    # at most 20 roundings of u relative to ln 6 (the normalised one: one more, the division).
    assert float(stats["entropy"]) == pytest.approx(math.log(6), abs=20 * U32 * math.log(6))
    assert float(stats["entropy_norm"]) == pytest.approx(1.0, abs=21 * U32)
    assert label(uniform) == "broad"


def test_rectangular_shapes_and_fewer_than_two_content_rows() -> None:
    a = one_hot([5, 1, 5])  # m = 3 target tokens, n = 6 source tokens, one content row
    stats = analysis.cross_stats(a, SOURCE, query_special=[True, False, True])
    assert float(stats["monotone"]) == 0.0 and float(stats["argmax_keys"]) == 1
    with pytest.raises(ValueError, match="key_tokens has 5 entries"):
        analysis.cross_stats(a, SOURCE[:5])
    with pytest.raises(ValueError, match="rows must sum to 1"):
        analysis.cross_stats(a * 2, SOURCE)


def test_descriptions_cover_every_statistic() -> None:
    stats = stats_of(one_hot([5, 0, 1, 2, 3, 5]))
    assert set(stats) == set(analysis.CROSS_STAT_DESCRIPTIONS)
    assert set(analysis.CROSS_SIMILARITY_STATS) <= set(stats)
    assert "argmax" in analysis.CROSS_STAT_DESCRIPTIONS["monotone"]
