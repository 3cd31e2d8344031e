"""mha.analysis.detection against a reference written from the definitions in plain Python loops.

Tolerance: the scores sum in float64 over float32 weights (a product with a 0/1 mask is exact), so each
carries one float32 rounding of a value in [0, 1], at most u = 2**-24 ≈ 6e-8; the reference sums the
same float32 weights in float64. 1e-6 is that rounding with room, and 1e5 times below a wrong pattern
(a key off by one moves a score by ~1e-1).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mha import AttentionModel
from mha.analysis import KINDS, chance_scores, detection_scores, model_scores

TOLERANCE = 1e-6  # one float32 rounding of a float64 sum (module docstring)


def pattern(kind: str, ids: list[int], keys: list[bool], i: int, j: int) -> bool:
    """P[i, j] from the words of the definition: previous key i - 1; an earlier key with the query's
    token; the key just after such an earlier copy (j <= i)."""
    if not (keys[i] and keys[j]):
        return False
    if kind == "previous_token":
        return j == i - 1
    if kind == "duplicate_token":
        return j < i and ids[j] == ids[i]
    return 1 <= j <= i and keys[j - 1] and ids[j - 1] == ids[i]


def reference(
    a: list[list[float]], ids: list[int], kind: str, measure: str, keys: list[bool], bos: bool, current: bool
) -> float:
    """One head's score by the definitions: counted weights, then the whole share or the mean row share."""
    n = len(ids)

    def counted(i: int, j: int) -> bool:
        return keys[i] and keys[j] and not (bos and j == 0) and not (current and j == i)

    on = [
        sum(a[i][j] for j in range(n) if counted(i, j) and pattern(kind, ids, keys, i, j)) for i in range(n)
    ]
    total = [sum(a[i][j] for j in range(n) if counted(i, j)) for i in range(n)]
    if measure == "mul":
        whole = sum(total)
        return sum(on) / whole if whole > 0 else math.nan
    rows = [
        i
        for i in range(n)
        if total[i] > 0 and any(counted(i, j) and pattern(kind, ids, keys, i, j) for j in range(n))
    ]
    return sum(on[i] / total[i] for i in rows) / len(rows) if rows else math.nan


def random_maps(
    generator: torch.Generator, layers: int, heads: int, keys: torch.Tensor, causal: bool
) -> torch.Tensor:
    """Softmax rows over the visible real keys; integer logits in {0, 1, 2}, so many weights tie."""
    n = keys.shape[0]
    logits = torch.randint(0, 3, (layers, heads, n, n), generator=generator).float()
    visible = keys[None, :].expand(n, n).clone()
    if causal:
        visible &= torch.ones(n, n, dtype=torch.bool).tril()
    visible |= torch.eye(n, dtype=torch.bool)  # a row always sees itself: it sums to 1
    return logits.masked_fill(~visible, -math.inf).softmax(-1)


def assert_matches(
    scores: dict[str, torch.Tensor],
    maps: torch.Tensor,
    ids: torch.Tensor,
    keys: torch.Tensor,
    measure: str,
    bos: bool,
    current: bool,
) -> None:
    ids_list, keys_list = ids.tolist(), keys.tolist()
    for kind in KINDS:
        for layer in range(maps.shape[0]):
            for head in range(maps.shape[1]):
                want = reference(
                    maps[layer, head].double().tolist(), ids_list, kind, measure, keys_list, bos, current
                )
                got = float(scores[kind][layer, head])
                if math.isnan(want):
                    assert math.isnan(got), (kind, layer, head, got)
                else:
                    assert abs(got - want) <= TOLERANCE, (kind, layer, head, got, want)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 10),
    vocab=st.integers(1, 4),
    seed=st.integers(0, 2**31),
    measure=st.sampled_from(["probe", "mul"]),
    bos=st.booleans(),
    current=st.booleans(),
    causal=st.booleans(),
    masked=st.booleans(),
)
def test_scores_equal_the_reference(
    n: int, vocab: int, seed: int, measure: str, bos: bool, current: bool, causal: bool, masked: bool
) -> None:
    """Ties (integer logits), repeats (a vocabulary of 1 to 4), masked keys, both measures and options."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (n,), generator=generator)
    keys = torch.rand(n, generator=generator) > 0.3 if masked else torch.ones(n, dtype=torch.bool)
    maps = random_maps(generator, 2, 3, keys, causal)
    scores = detection_scores(
        maps,
        ids,
        measure=measure,
        exclude_bos=bos,
        exclude_current_token=current,
        keys=keys,  # type: ignore[arg-type]
    )
    assert {k: v.shape for k, v in scores.items()} == {k: (2, 3) for k in KINDS}
    assert_matches(scores, maps, ids, keys, measure, bos, current)


@pytest.mark.parametrize("measure", ["probe", "mul"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_a_padded_batch_scores_as_each_text_alone(measure: str, side: str) -> None:
    """Two texts of 7 and 4 tokens padded to 7 with a pad id that is also a real token (1): the padding
    is neither a key, a query nor a copy."""
    generator = torch.Generator().manual_seed(3)
    texts = [torch.tensor([0, 1, 2, 1, 2, 3, 1]), torch.tensor([1, 2, 1, 2])]
    ids = torch.ones(2, 7, dtype=torch.long)
    keys = torch.zeros(2, 7, dtype=torch.bool)
    maps = torch.zeros(2, 2, 3, 7, 7)
    alone = []
    for row, text in enumerate(texts):
        where = slice(0, len(text)) if side == "right" else slice(7 - len(text), 7)
        ids[row, where], keys[row, where] = text, True
        own = random_maps(generator, 2, 3, torch.ones(len(text), dtype=torch.bool), causal=True)
        maps[row, :, :, where, where] = own
        maps[row, :, :, ~keys[row], 0] = 1.0  # filler rows, as a padded forward leaves them
        alone.append(detection_scores(own, text, measure=measure))  # type: ignore[arg-type]
    batched = detection_scores(maps, ids, measure=measure, keys=keys)  # type: ignore[arg-type]
    for row in range(2):
        for kind in KINDS:
            torch.testing.assert_close(
                batched[kind][row], alone[row][kind], atol=TOLERANCE, rtol=0, equal_nan=True
            )


def test_a_text_without_repeats_has_no_duplicate_or_induction_score() -> None:
    """Absent is NaN under the probe measure, never 0; TransformerLens's mul gives its 0."""
    maps = random_maps(torch.Generator().manual_seed(0), 1, 2, torch.ones(5, dtype=torch.bool), causal=True)
    ids = torch.arange(5)
    probe = detection_scores(maps, ids)
    assert probe["duplicate_token"].isnan().all() and probe["induction"].isnan().all()
    assert not probe["previous_token"].isnan().any()
    mul = detection_scores(maps, ids, measure="mul")
    assert (mul["duplicate_token"] == 0).all() and (mul["induction"] == 0).all()


def test_induction_counts_the_query_itself_after_a_copy() -> None:
    """ids [5, 5]: row 1's earlier copy is key 0, so its induction key is key 1, itself (TransformerLens's
    shifted duplicate pattern keeps the diagonal)."""
    maps = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]]]])
    scores = detection_scores(maps, torch.tensor([5, 5]))
    assert float(scores["induction"][0, 0]) == 1.0
    assert float(scores["duplicate_token"][0, 0]) == 0.0


def repeated(length: int, seed: int = 0) -> torch.Tensor:
    """The probe's input: a start token (0), then `length` distinct ids, repeated once."""
    half = torch.randperm(1000, generator=torch.Generator().manual_seed(seed))[:length] + 1
    return torch.cat([torch.zeros(1, dtype=torch.long), half, half])


@pytest.mark.parametrize("length", [1, 5, 12])
def test_planted_heads_score_one_and_uniform_heads_their_chance(length: int) -> None:
    """A hand-set induction head (second half on the token after the earlier copy, the rest on the start
    token), a previous-token head and a uniform causal head, on a repeated sequence."""
    ids = repeated(length)
    n = ids.shape[0]
    induction, previous = torch.zeros(n, n), torch.zeros(n, n)
    induction[:, 0] = 1.0
    previous[0, 0] = 1.0
    for i in range(1, n):
        previous[i, i - 1] = 1.0
    for i in range(length + 1, n):
        induction[i] = 0.0
        induction[i, i - length + 1] = 1.0  # the copy of token i is i - length; its successor follows it
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    uniform = causal.float() / causal.sum(-1, keepdim=True)
    maps = torch.stack([induction, previous, uniform])[None]  # [1, 3, n, n]
    scores = detection_scores(maps, ids)
    assert float(scores["induction"][0, 0]) == pytest.approx(1.0, abs=TOLERANCE)
    assert float(scores["previous_token"][0, 1]) == pytest.approx(1.0, abs=TOLERANCE)
    chance = chance_scores(causal[None, None], ids)
    # Causal uniform: row i sees i + 1 keys, one of them the pattern's, in the second half (induction and
    # duplicate) or everywhere but row 0 (previous).
    second = range(length + 1, n)
    want = {
        "induction": sum(1 / (i + 1) for i in second) / len(second),
        "duplicate_token": sum(1 / (i + 1) for i in second) / len(second),
        "previous_token": sum(1 / (i + 1) for i in range(1, n)) / (n - 1),
    }
    for kind in KINDS:
        assert float(chance[kind][0, 0]) == pytest.approx(want[kind], abs=TOLERANCE)
        assert float(scores[kind][0, 2]) == pytest.approx(want[kind], abs=TOLERANCE)


def test_chance_follows_the_mask_it_is_given() -> None:
    """A sliding window of 3 keys: each row's uniform share is 1/3 (fewer at the start), and an induction
    key beyond the window is not visible, so the chance is 0 where the copy is too far."""
    ids = repeated(6)
    n = ids.shape[0]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    window = (j <= i) & (j > i - 3)
    chance = chance_scores(torch.stack([window, j <= i])[:, None], ids, kinds=("induction", "previous_token"))
    assert chance["induction"].shape == (2, 1)
    assert float(chance["induction"][0, 0]) == 0.0  # every induction key lies 5 back, outside the window
    assert float(chance["previous_token"][0, 0]) == pytest.approx(
        (1 / 2 + (n - 2) / 3) / (n - 1), abs=TOLERANCE
    )


def test_bad_input_raises_value_error() -> None:
    maps = torch.full((1, 1, 3, 3), 1 / 3)
    with pytest.raises(ValueError, match="token_ids"):
        detection_scores(maps, torch.arange(4))
    with pytest.raises(ValueError, match="sum to 1"):
        detection_scores(maps * 2, torch.arange(3))
    with pytest.raises(ValueError, match="kinds"):
        detection_scores(maps, torch.arange(3), kinds=("copying",))
    with pytest.raises(ValueError, match="measure"):
        detection_scores(maps, torch.arange(3), measure="abs")  # type: ignore[arg-type]


@pytest.mark.parametrize("measure", ["probe", "mul"])
def test_a_pair_on_minilm_equals_the_reference(minilm: AttentionModel, measure: str) -> None:
    """A real encoder's maps on a pair that repeats its first text: [CLS] A [SEP] A [SEP], bidirectional
    weights (the patterns still name earlier keys only), with [CLS] as position 0 for exclude_bos."""
    result = minilm.attend("the cat sat on the mat", "the cat sat on the mat")
    ids = torch.tensor(result.token_ids)
    keys = torch.ones(len(ids), dtype=torch.bool)
    scores = detection_scores(result.attentions, ids, measure=measure, exclude_bos=True)  # type: ignore[arg-type]
    assert_matches(scores, result.attentions, ids, keys, measure, True, False)


def test_model_scores_read_rows_that_miss_one_by_half_precision_rounding() -> None:
    """bfloat16 rows may sum to 1 ± 2**-9: the probe's path takes them (each row's share is over its own
    total, so scaling a row changes nothing) where detection_scores' check refuses them."""
    ids = repeated(5)[None]
    maps = random_maps(
        torch.Generator().manual_seed(2), 2, 3, torch.ones(ids.shape[1], dtype=torch.bool), True
    )
    scaled = maps * (1 + 2**-9)
    with pytest.raises(ValueError, match="sum to 1"):
        detection_scores(scaled[None], ids)
    got = model_scores(scaled[None], ids)
    want = detection_scores(maps[None], ids)
    for kind in KINDS:
        # a/(1+e) over a·(1+e)... the same share, up to one float32 rounding of each scaled weight
        torch.testing.assert_close(got[kind], want[kind], atol=TOLERANCE, rtol=0)
