"""The insight API (docs/http-api.md, "Insight routes"): every answer equals mha.analysis on mha's result."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from tolerances import FORWARD, ROUND6, U32, float32_sum, rounded_row_sum, row_sum

from app import compact
from app.main import create_app
from mha import analysis
from tests.app.asgi import run_async
from tests.app.started import serving

TEXT = "Headscope shows what every head looks at, word by word."
PAIR = "It is a fine tool."
SHORT = "Headscope reads text."  # 7 tokens: flow stays cheap
MODEL = "all-MiniLM-L6-v2"


def tensor(values: Any) -> torch.Tensor:
    return torch.as_tensor(values, dtype=torch.float64)


def close(got: Any, expected: torch.Tensor, *, atol: float) -> None:
    torch.testing.assert_close(tensor(got), expected.double(), atol=atol, rtol=0)


def served(client: TestClient, text: str, pair: str | None = None, *, words: bool = False) -> Any:
    """The attention view the service answered from (its cached result), so an insight answer is checked
    against mha.analysis on the very same tensor: equal up to the answer's own rounding. That the service's
    attention equals mha's own forward is tests/app/test_api.py's concern."""
    service = client.app.state.service  # type: ignore[attr-defined]
    return run_async(service.views.view((MODEL, text, pair, None, False, None, None), words=words))


def js_atol(m: int) -> float:
    """A compare score computed from the same maps sliced another way (the service goes layer by layer):
    three entropies, each a float32 sum of m terms adding up to at most ln m, of rows renormalised by
    another m-term sum (a relative error m·u, which moves an entropy by at most (ln m + 1) times that)."""
    return 3 * float32_sum(m, math.log(m) + 1)


def word_view(result: Any, text: str, pair: str | None) -> tuple[list[str], list[list[int]], torch.Tensor]:
    """The word-level labels, groups and map, computed with mha.analysis directly."""
    groups = analysis.word_groups_from(result.word_ids, result.segments, result.special).groups
    labels = analysis.word_labels(
        result.tokens, groups, offsets=result.offsets, segments=result.segments, texts=(text, pair)
    )
    return labels, groups, analysis.merge_to_words(result.attentions, groups)


def post(client: TestClient, path: str, body: dict[str, Any], status: int = 200) -> Any:
    response = client.post(path, json=body)
    assert response.status_code == status, response.text[:500]
    return response.json()


# -- /api/analysis ----------------------------------------------------------------------------------


@pytest.mark.parametrize("pair", [None, PAIR])
def test_analysis_equals_mha(client: TestClient, minilm, pair: str | None) -> None:  # type: ignore[no-untyped-def]
    body = post(client, "/api/analysis", {"text": TEXT, "text_pair": pair})
    result = minilm.attend(TEXT, pair)
    view = served(client, TEXT, pair)
    special = view.special
    stats = analysis.head_stats(view.attentions, view.tokens, special=special, causal=False)
    assert body["tokens"] == result.tokens
    assert (body["model"], body["n"], body["layers"], body["heads"], body["words"]) == (
        "all-MiniLM-L6-v2",
        len(result.tokens),
        6,
        12,
        False,
    )
    assert set(body["stats"]) == set(stats) == set(body["stat_descriptions"])
    for name, value in stats.items():
        close(body["stats"][name], value, atol=ROUND6)  # the same function on the same tensor, 6 decimals
    assert all(body["stat_descriptions"][name] for name in stats)
    chance = analysis.head_chance(view.tokens, causal=False)
    assert body["labels"] == analysis.head_labels(stats, chance=chance)
    assert body["thresholds"] == {
        "pointer": 0.5,
        "broad": 0.8,
        "local": 0.6,
        "induction": analysis.DETECTION_THRESHOLD,
        "induction_margin": analysis.DETECTION_MARGIN,
    }
    for layer in range(6):
        for head in range(12):
            expected = analysis.similar_heads(stats, layer, head, k=5)
            got = body["similar"][layer][head]
            assert [(g[0], g[1]) for g in got] == [(e[0], e[1]) for e in expected]
            close([g[2] for g in got], tensor([e[2] for e in expected]), atol=ROUND6)  # 6 decimals
    # Cheap: no n x n payload in the answer.
    assert len(client.post("/api/analysis", json={"text": TEXT}).content) < 40_000


def test_analysis_of_words_equals_mha_on_the_merged_map(client: TestClient, minilm) -> None:  # type: ignore[no-untyped-def]
    body = post(client, "/api/analysis", {"text": TEXT, "text_pair": PAIR, "words": True})
    result = minilm.attend(TEXT, PAIR)
    labels, groups, _ = word_view(result, TEXT, PAIR)
    view = served(client, TEXT, PAIR, words=True)
    assert view.tokens == labels
    stats = analysis.head_stats(view.attentions, labels, special=view.special, causal=False)
    assert body["words"] is True
    assert body["tokens"] == labels
    assert "Headscope" in body["tokens"] and "##cope" not in body["tokens"]
    assert body["n"] == len(groups) < len(result.tokens)
    for name, value in stats.items():
        close(body["stats"][name], value, atol=ROUND6)  # the same function on the same tensor, 6 decimals
    assert body["labels"] == analysis.head_labels(stats, chance=analysis.head_chance(labels, causal=False))


def test_a_text_without_repeats_has_null_copy_scores(client: TestClient) -> None:
    """No token repeats: the duplicate-token and induction scores are absent, written null (the page's
    "–"), never 0; the previous-token score is there; "heads like this one" still ranks every head."""
    body = post(client, "/api/analysis", {"text": "One two three."})
    assert len(set(body["tokens"])) == len(body["tokens"])  # the premise: [CLS] one two three . [SEP]
    for kind in ("duplicate_token", "induction"):
        assert all(value is None for row in body["stats"][kind] for value in row)
        assert "absent" in body["stat_descriptions"][kind]
    assert all(0 <= value <= 1 for row in body["stats"]["previous_token"] for value in row)
    assert all(len(head) == 5 for row in body["similar"] for head in row)
    assert "induction" not in {label for row in body["labels"] for label in row}


# -- words on the attention routes -------------------------------------------------------------------


def test_attention_in_words(client: TestClient, minilm) -> None:  # type: ignore[no-untyped-def]
    body = post(client, "/api/attention", {"text": TEXT, "text_pair": PAIR, "words": True})
    result = minilm.attend(TEXT, PAIR)
    labels, groups, _ = word_view(result, TEXT, PAIR)
    merged = served(client, TEXT, PAIR, words=True).attentions
    assert body["tokens"] == labels
    assert body["tokens"][:3] == ["[CLS]", "Headscope", "shows"]
    assert "heads" not in body["tokens"] and "##cope" not in body["tokens"]
    assert body["segments"] == [result.segments[g[0]] for g in groups]
    assert 1 in body["segments"] and body["segments"][-1] == 1
    assert body["special"] == [result.special[g[0]] for g in groups]
    assert body["n"] == len(labels)
    got = tensor(body["attention"])
    close(got, merged, atol=ROUND6)  # the JSON rounds to 6 decimals
    rows = got.sum(-1)
    close(rows, torch.ones_like(rows), atol=rounded_row_sum(body["n"]))

    head = post(
        client, "/api/attention/head", {"text": TEXT, "text_pair": PAIR, "words": True, "layer": 2, "head": 5}
    )
    assert head["tokens"] == labels
    close(head["attention"], merged[2, 5], atol=0)  # full float32 precision


def test_compact_in_words(client: TestClient, minilm) -> None:  # type: ignore[no-untyped-def]
    response = client.post("/api/attention/compact?scheme=abs-uint8", json={"text": TEXT, "words": True})
    assert response.status_code == 200
    header, values = compact.decode(response.content)  # the client has undone the gzip
    labels = word_view(minilm.attend(TEXT), TEXT, None)[0]
    merged = served(client, TEXT, words=True).attentions
    assert header["tokens"] == labels and header["n"] == len(labels)
    # The 8-bit bound, plus one float32 rounding of the decoded q / 255 · scale.
    assert np.abs(values - merged.numpy()).max() <= compact.MAX_ABS_ERROR + U32


def test_words_are_cached_apart_from_tokens(client: TestClient) -> None:
    text = "Tokenization splits unbelievable words."
    words = post(client, "/api/attention", {"text": text, "words": True})
    tokens = post(client, "/api/attention", {"text": text})
    assert "Tokenization" in words["tokens"]
    assert "##ization" in tokens["tokens"] and tokens["n"] > words["n"]
    service = client.app.state.service  # type: ignore[attr-defined]
    name = "all-MiniLM-L6-v2"
    # Keys: (kind, model, text, pair, tokens to write (None: the default), chat, target, ...)
    assert service.answers.cache.get(("result", name, text, None, None, False, None, None)).n == tokens["n"]
    assert (
        service.answers.cache.get(("words", name, text, None, None, False, None, None, "weight")).n
        == words["n"]
    )
    # Every answer kind is cached under its own (kind, ..., words, weighting) key of the same LRU.
    assert (
        service.answers.cache.get(("json", name, text, None, None, False, None, None, True, "weight"))
        is not None
    )
    assert (
        service.answers.cache.get(("json", name, text, None, None, False, None, None, False, "weight"))
        is not None
    )
    normed = post(client, "/api/attention", {"text": text, "weighting": "norm"})
    assert service.answers.cache.get(("norm", name, text, None, None, False, None, None)).weighting == "norm"
    assert (
        service.answers.cache.get(("json", name, text, None, None, False, None, None, False, "norm"))
        is not None
    )
    assert normed["attention"] != tokens["attention"]


# -- /api/rollout -----------------------------------------------------------------------------------


@pytest.mark.parametrize("words", [False, True])
def test_rollout_equals_mha(client: TestClient, minilm, words: bool) -> None:  # type: ignore[no-untyped-def]
    body = post(client, "/api/rollout", {"text": TEXT, "words": words})
    attentions = served(client, TEXT, words=words).attentions
    per_layer = analysis.rollout_per_layer(attentions, residual=0.5)
    assert (body["layers"], body["residual"], body["n"]) == (6, 0.5, attentions.shape[-1])
    assert ("Headscope" in body["tokens"]) is words
    close(body["per_layer"], per_layer, atol=ROUND6)  # the same function, rounded to 6 decimals
    assert body["rollout"] == body["per_layer"][-1]


@pytest.mark.parametrize("scheme", ["row-max-uint8", "abs-uint8"])
def test_rollout_compact_decodes_within_its_bound(client: TestClient, minilm, scheme: str) -> None:  # type: ignore[no-untyped-def]
    response = client.post(
        f"/api/rollout/compact?scheme={scheme}", json={"text": TEXT}, headers={"Accept-Encoding": "identity"}
    )
    assert response.status_code == 200
    assert response.headers["content-type"] == compact.MEDIA_TYPE
    assert "content-encoding" not in response.headers
    header, values = compact.decode(response.content)
    result = minilm.attend(TEXT)
    assert (header["layers"], header["heads"], header["n"]) == (6, 1, len(result.tokens))
    assert header["tokens"] == result.tokens and header["residual"] == 0.5
    assert header["quantization"]["scheme"] == scheme
    expected = analysis.rollout_per_layer(served(client, TEXT).attentions).unsqueeze(1).numpy()
    # The 8-bit bound, plus one float32 rounding of the decoded q / 255 · scale.
    assert np.abs(values - expected).max() <= compact.MAX_ABS_ERROR + U32
    gzipped = client.post(f"/api/rollout/compact?scheme={scheme}", json={"text": TEXT})
    assert gzipped.headers["content-encoding"] == "gzip"
    assert gzipped.content == response.content  # the test client undoes the gzip


# -- /api/flow --------------------------------------------------------------------------------------


def test_flow_equals_mha(client: TestClient, minilm) -> None:  # type: ignore[no-untyped-def]
    body = post(client, "/api/flow", {"text": SHORT})
    result = minilm.attend(SHORT)
    assert body["tokens"] == result.tokens and body["n"] == len(result.tokens) <= analysis.FLOW_MAX_TOKENS
    flow = analysis.attention_flow(served(client, SHORT).attentions)
    close(body["flow"], flow, atol=ROUND6)  # the same function, rounded to 6 decimals
    published = analysis.attention_flow(served(client, SHORT).attentions, normalize=True)
    # Normalised from the float32 raw values rather than mha's float64 ones: a few float32 roundings
    # (raw value, its row sum, the quotient, the cast) of values <= 1, then 6 decimals.
    close(body["flow_normalized"], published, atol=ROUND6 + 8 * U32)
    sums = torch.tensor(body["flow_normalized"], dtype=torch.float64).sum(-1)
    torch.testing.assert_close(sums, torch.ones_like(sums), atol=rounded_row_sum(body["n"]), rtol=0)


def test_flow_over_the_limit_is_422_naming_it(client: TestClient) -> None:
    long_text = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
    body = post(client, "/api/flow", {"text": long_text}, status=422)
    limit = analysis.FLOW_MAX_TOKENS
    assert f"limited to {limit} tokens" in body["detail"] and "has 16" in body["detail"]


def test_flow_limit_is_a_setting(make_settings) -> None:  # type: ignore[no-untyped-def]
    with serving(create_app(make_settings(flow_max_tokens=4))) as c:
        assert (
            "limited to 4 words" in post(c, "/api/flow", {"text": SHORT, "words": True}, status=422)["detail"]
        )


# -- /api/compare -----------------------------------------------------------------------------------


def test_compare_of_identical_inputs_scores_zero(client: TestClient) -> None:
    body = post(client, "/api/compare", {"a": {"text": TEXT}, "b": {"text": TEXT}})
    n = len(body["a"]["tokens"])
    assert body["pairs"] == [[i, i] for i in range(n)]
    assert body["tokens"] == body["a"]["tokens"] == body["b"]["tokens"]
    assert (body["layers"], body["heads"]) == (6, 12)
    # Both sides are the one cached result: p = q bitwise, so H(m) - (H(p) + H(q)) / 2 is exactly 0.
    assert np.abs(np.array(body["score"])).max() == 0
    # Every key is aligned, so kept is a float32 row sum.
    assert np.abs(np.array(body["kept_a"]) - 1).max() <= row_sum(n)


def test_compare_one_word_changed(client: TestClient, minilm) -> None:  # type: ignore[no-untyped-def]
    a, b = "The cat sat on the mat.", "The dog sat on the mat."
    body = post(client, "/api/compare", {"a": {"text": a}, "b": {"text": b}})
    result_a, result_b = minilm.attend(a), minilm.attend(b)
    # The swapped word is paired position by position with the rest; its label comes from a.
    assert body["pairs"] == [[i, i] for i in range(len(result_a.tokens))]
    assert body["tokens"] == result_a.tokens and "cat" in body["tokens"]
    assert body["b"]["tokens"] == result_b.tokens
    pairs = [tuple(p) for p in body["pairs"]]
    view_a, view_b = served(client, a), served(client, b)
    expected = analysis.compare_aligned(view_a.attentions, view_b.attentions, pairs)
    m = len(pairs)
    close(body["score"], expected["js"], atol=js_atol(m))
    close(body["kept_a"], expected["kept_a"], atol=row_sum(m))  # a mean of m-term float32 sums
    scores = np.array(body["score"])
    assert scores.min() > 0 and np.median(scores) > 1e-3  # every head sees the change, most clearly
    assert np.array(body["score"]).max() <= math.log(2)


def test_compare_inserted_word_is_left_out_of_the_pairs(client: TestClient, minilm) -> None:  # type: ignore[no-untyped-def]
    a, b = "The cat sat on the mat.", "The big cat sat on the mat."
    body = post(client, "/api/compare", {"a": {"text": a}, "b": {"text": b}})
    assert body["b"]["tokens"][2] == "big"
    assert body["pairs"] == [[0, 0], [1, 1]] + [[i, i + 1] for i in range(2, 9)]
    assert "big" not in body["tokens"]
    pairs = [tuple(p) for p in body["pairs"]]
    expected = analysis.compare_aligned(served(client, a).attentions, served(client, b).attentions, pairs)
    close(body["score"], expected["js"], atol=js_atol(len(pairs)))
    close(body["kept_b"], expected["kept_b"], atol=row_sum(len(pairs)))  # a mean of m-term float32 sums
    assert np.array(body["kept_b"]).max() < 1  # b's weight on "big" was dropped


def test_compare_words(client: TestClient) -> None:
    body = post(client, "/api/compare", {"a": {"text": TEXT}, "b": {"text": TEXT.lower()}, "words": True})
    assert body["tokens"][1] == "Headscope" and body["b"]["tokens"][1] == "headscope"
    assert len(body["pairs"]) == len(body["a"]["tokens"])  # uncased model: same words, same maps
    # The same ids in two separate forwards: each weight within FORWARD, so the total variation of a row
    # is at most n·FORWARD / 2 over the n tokens, and Jensen-Shannon is at most ln 2 times that.
    n = served(client, TEXT).n
    bound = math.log(2) * n * FORWARD / 2 + js_atol(len(body["pairs"]))
    assert np.abs(np.array(body["score"])).max() <= bound


def test_compare_head_equals_mha(client: TestClient, minilm) -> None:  # type: ignore[no-untyped-def]
    a, b = "The cat sat on the mat.", "The big cat sat on the mat."
    body = post(client, "/api/compare/head", {"a": {"text": a}, "b": {"text": b}, "layer": 3, "head": 7})
    pairs = analysis.align_tokens(minilm.attend(a).tokens, minilm.attend(b).tokens, include_replaced=True)
    expected = analysis.compare_aligned(served(client, a).attentions, served(client, b).attentions, pairs)
    m = len(pairs)
    assert (body["layer"], body["head"], len(body["tokens"])) == (3, 7, m)
    # Rows renormalised by an m-term float32 sum that may run in another order for another slice.
    renormalised = float32_sum(m) + U32
    close(body["a"], expected["a"][3, 7], atol=renormalised)
    close(body["b"], expected["b"][3, 7], atol=renormalised)
    close(body["diff"], expected["difference"][3, 7], atol=2 * renormalised)
    close(tensor(body["a"]).sum(-1), torch.ones(m), atol=row_sum(m))


def test_compare_models_of_different_shapes_is_422(client: TestClient) -> None:
    body = {"a": {"text": TEXT}, "b": {"text": TEXT, "model": "random"}}
    detail = post(client, "/api/compare", body, status=422)["detail"]
    assert "6 layers x 12 heads" in detail and "4 layers x 8 heads" in detail
    detail = post(client, "/api/compare/head", {**body, "layer": 0, "head": 0}, status=422)["detail"]
    assert "4 layers x 8 heads" in detail


def test_compare_head_out_of_range_is_422(client: TestClient) -> None:
    body = {"a": {"text": TEXT}, "b": {"text": TEXT}, "layer": 6, "head": 0}
    assert "layer 6 is out of range" in post(client, "/api/compare/head", body, status=422)["detail"]


# -- errors and the contract -------------------------------------------------------------------------

ROUTES = ["/api/analysis", "/api/rollout", "/api/rollout/compact", "/api/flow"]


@pytest.mark.parametrize("route", ROUTES)
def test_unknown_model_is_404(client: TestClient, route: str) -> None:
    detail = post(client, route, {"text": SHORT, "model": "nope"}, status=404)["detail"]
    assert "'nope'" in detail and "all-MiniLM-L6-v2" in detail


@pytest.mark.parametrize("route", ["/api/compare", "/api/compare/head"])
def test_compare_unknown_model_is_404_and_bad_body_422(client: TestClient, route: str) -> None:
    extra = {"layer": 0, "head": 0} if route.endswith("head") else {}
    body = {"a": {"text": SHORT}, "b": {"text": SHORT, "model": "nope"}, **extra}
    assert "'nope'" in post(client, route, body, status=404)["detail"]
    detail = post(client, route, {"a": {"text": " "}, "b": {"text": SHORT}, **extra}, status=422)["detail"]
    assert detail.startswith("a.text: text is blank")


def test_openapi_documents_every_insight_route(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    for path in [*ROUTES, "/api/compare", "/api/compare/head"]:
        operation = spec["paths"][path]["post"]
        assert len(operation["description"]) > 80, path
        assert {"200", "404", "422"} <= set(operation["responses"]), path
        ok = operation["responses"]["200"]["content"]
        schema = next(iter(ok.values()))["schema"]
        assert "$ref" in schema or schema.get("format") == "binary", path
    for path in ["/api/attention", "/api/attention/head", "/api/attention/compact", "/api/analysis"]:
        ref = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert "words" in spec["components"]["schemas"][ref.rsplit("/", 1)[1]]["properties"], path


# -- a causal, byte-level model --------------------------------------------------------------------------


def test_gpt2_analysis_rollout_and_words(tiny_checkpoints: dict[str, Path], make_settings) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings(models={"gpt2": tiny_checkpoints["gpt2"]}, default_model="gpt2")
    text = "The cat sat on the mat."
    with serving(create_app(settings)) as c:
        stats = post(c, "/api/analysis", {"text": text})["stats"]
        assert np.array(stats["forward"]).max() == 0  # causal: no weight on later tokens
        rollout = tensor(post(c, "/api/rollout", {"text": text})["rollout"])
        assert torch.equal(rollout.triu(1), torch.zeros_like(rollout))
        words = post(c, "/api/attention", {"text": text, "words": True})
        assert words["tokens"] == ["The", "cat", "sat", "on", "the", "mat", "."]
        assert words["causal"] is True
        merged = tensor(words["attention"])
        assert torch.equal(merged.triu(1), torch.zeros_like(merged))
        _, values = compact.decode(c.post("/api/rollout/compact", json={"text": text}).content)
        assert np.triu(values, 1).max() == 0  # quantized, a 0 stays exactly 0


def test_analysis_numbers_have_6_decimals_like_every_json_answer(client: TestClient) -> None:
    # The float32 reprs took twice the bytes (17 digits), which the page's first view pays for.
    text = client.post("/api/analysis", json={"text": TEXT}).text
    numbers = text[text.index('"stats"') : text.index('"stat_descriptions"')]
    numbers += text[text.index('"similar"') :]
    decimals = [len(tok.split(".")[1]) for tok in numbers.replace("]", ",").split(",") if "." in tok]
    assert decimals and max(decimals) <= 6


# -- [UNK] ------------------------------------------------------------------------------------------------

UNKNOWN = "The snowman ☃ waved at me 😀 today."  # MiniLM's vocabulary has neither: two [UNK]


@pytest.mark.parametrize("words", [False, True], ids=["tokens", "words"])
def test_unknown_words_are_marked_apart_and_no_sink(client: TestClient, words: bool) -> None:
    """[UNK] stands for a word: answers mark it `unknown`, not `special`, and the `special` statistic is
    Clark et al.'s attention to [CLS] plus [SEP], by hand on the answer's own attention."""
    head = post(client, "/api/attention", {"text": UNKNOWN, "words": words})
    tokens = head["tokens"]
    assert head["unknown"] == [t in (("☃", "😀") if words else ("[UNK]",)) for t in tokens]
    assert sum(head["unknown"]) == 2  # the premise; in words, each unknown word keeps its text
    assert head["special"] == [t in ("[CLS]", "[SEP]") for t in tokens]
    body = post(client, "/api/analysis", {"text": UNKNOWN, "words": words})
    sinks = [j for j, t in enumerate(tokens) if t in ("[CLS]", "[SEP]")]
    clark = tensor(head["attention"])[..., sinks].sum(-1).mean(-1)
    # Two 6-decimal weights summed and a 6-decimal answer (3·ROUND6), over the server's float32 sum of
    # two weights and mean of n rows.
    close(body["stats"]["special"], clark, atol=3 * ROUND6 + float32_sum(2) + float32_sum(len(tokens)))
