"""Encoder-decoder models (tiny T5, BART and Marian) through the HTTP API: a target or generation, the
three attention kinds in JSON and in the compact transport's sections, kind on the head and insight
routes, and every refusal a 422 that says why."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from checkpoints import build_checkpoint
from fastapi.testclient import TestClient
from tolerances import FORWARD, FORWARD_JSON, ROUND6, quant8

import mha
from app import compact
from app.settings import Settings
from mha import analysis
from mha.errors import Cancelled
from tests.app.asgi import Exchange, post
from tests.app.started import serving

FAMILIES = ("t5", "bart", "marian")
SOURCE = "the house is small"
TARGET = "das haus ist klein"
OTHER_TARGET = "das haus war klein"
MAX_NEW_TOKENS = 6  # the service's HEADSCOPE_MAX_NEW_TOKENS here: under the default of 20
KINDS = {"encoder": "attention", "decoder": "decoder_attentions", "cross": "cross_attentions"}


@pytest.fixture(scope="module")
def served(
    seq2seq_checkpoints: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
    make_settings: Callable[..., Settings],
) -> Iterator[TestClient]:
    from app.main import create_app

    llama = build_checkpoint("llama", tmp_path_factory.mktemp("llama") / "llama")
    models = {**seq2seq_checkpoints, "llama": llama}
    with serving(create_app(make_settings(models=models, max_new_tokens=MAX_NEW_TOKENS))) as client:
        yield client


@pytest.fixture(scope="module")
def reference(seq2seq_checkpoints: dict[str, Path]) -> Callable[[str], mha.AttentionModel]:
    """family -> the checkpoint loaded by mha directly: what the service must match."""
    return cache(lambda family: mha.load_pretrained(seq2seq_checkpoints[family], device="cpu"))


def expected(model: mha.AttentionModel, **kwargs: object) -> mha.Seq2SeqResult:
    result = model.attend(SOURCE, **kwargs)  # type: ignore[arg-type]
    assert isinstance(result, mha.Seq2SeqResult)
    return result


def tensors(result: mha.Seq2SeqResult) -> dict[str, torch.Tensor]:
    return {
        "encoder": result.attentions,
        "decoder": result.decoder_attentions,
        "cross": result.cross_attentions,
    }


# -- /api/models --------------------------------------------------------------------------------------------


def test_models_say_the_architecture_before_loading(
    seq2seq_checkpoints: dict[str, Path], make_settings: Callable[..., Settings]
) -> None:
    from app.main import create_app

    # Read from each checkpoint's config by the startup check: the page offers a target box at once.
    with serving(create_app(make_settings(models=seq2seq_checkpoints))) as client:
        entries = {m["name"]: m for m in client.get("/api/models").json()["models"]}
    for family in FAMILIES:
        assert entries[family]["loaded"] is False and entries[family]["architecture"] == "encoder-decoder"
        assert entries[family]["layers"] is None  # the rest waits for the load


def test_models_say_the_architecture(served: TestClient) -> None:
    for name in (*FAMILIES, "llama"):  # a request loads each
        assert served.post("/api/attention", json={"text": "Hi.", "model": name}).status_code == 200
    entries = {m["name"]: m for m in served.get("/api/models").json()["models"]}
    for family in FAMILIES:
        entry = entries[family]
        assert entry["architecture"] == "encoder-decoder"
        # The tiny models' decoders have 3 layers to the encoders' 2, and as many heads (4).
        assert (entry["layers"], entry["heads"], entry["decoder_layers"], entry["decoder_heads"]) == (
            2,
            4,
            3,
            None,
        )
        assert entry["trace_max_tokens"] == 0  # no long-input traces of an encoder-decoder
    assert entries["llama"]["architecture"] == "decoder"
    assert entries["all-MiniLM-L6-v2"]["architecture"] == "encoder"


# -- the answer, JSON and compact ---------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_json_with_a_target_equals_mha(served: TestClient, reference: Callable, family: str) -> None:
    body = served.post("/api/attention", json={"text": SOURCE, "target": TARGET, "model": family}).json()
    result = expected(reference(family), target=TARGET)
    assert body["architecture"] == "encoder-decoder"
    assert body["tokens"] == result.tokens and body["target_tokens"] == result.target_tokens
    assert body["target_special"] == result.target_special and body["target_truncated"] is False
    assert body["generated"] == 0 and body["causal"] is False
    assert (body["n"], body["layers"], body["heads"]) == (result.n, 2, 4)
    for kind, field in KINDS.items():
        got = torch.tensor(body[field], dtype=torch.float64)
        # Two float32 forwards (the service's and this one) and the JSON's 6 decimals.
        torch.testing.assert_close(got, tensors(result)[kind].double(), atol=FORWARD_JSON, rtol=0)
    assert len(body["target_tokens"]) == len(body["cross_attentions"][0][0])
    assert len(body["tokens"]) == len(body["cross_attentions"][0][0][0])


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("scheme", ["row-max-uint8", "abs-uint8-key-major"])
def test_compact_sections_equal_mha(
    served: TestClient, reference: Callable, family: str, scheme: str
) -> None:
    response = served.post(
        f"/api/attention/compact?scheme={scheme}", json={"text": SOURCE, "target": TARGET, "model": family}
    )
    header, sections = compact.decode_sections(response.content)
    result = expected(reference(family), target=TARGET)
    m, n = result.m, result.n
    assert header["sections"] == [
        {"kind": "encoder", "layers": 2, "heads": 4, "rows": n, "cols": n},
        {"kind": "decoder", "layers": 3, "heads": 4, "rows": m, "cols": m},
        {"kind": "cross", "layers": 3, "heads": 4, "rows": m, "cols": n},
    ]
    assert header["architecture"] == "encoder-decoder" and header["target_tokens"] == result.target_tokens
    assert header["target_special"] == result.target_special and header["target_truncated"] is False
    assert header["tokens"] == result.tokens and header["generated"] == 0
    for kind, values in sections.items():
        # 8-bit rounding of the service's values, which differ from this forward's by FORWARD
        np.testing.assert_allclose(values, tensors(result)[kind].numpy(), rtol=0, atol=quant8() + FORWARD)


@pytest.mark.parametrize("family", FAMILIES)
def test_generation_when_no_target(served: TestClient, reference: Callable, family: str) -> None:
    model = reference(family)
    # No target: the model writes up to min(20, HEADSCOPE_MAX_NEW_TOKENS) tokens.
    body = served.post("/api/attention", json={"text": SOURCE, "model": family}).json()
    result = expected(model, max_new_tokens=MAX_NEW_TOKENS)
    assert body["target_tokens"] == result.target_tokens and body["generated"] == result.generated >= 1
    torch.testing.assert_close(
        torch.tensor(body["cross_attentions"], dtype=torch.float64),
        result.cross_attentions.double(),
        atol=FORWARD_JSON,  # two float32 forwards and 6 decimals
        rtol=0,
    )
    # A blank or null target is the same request: the same answer.
    for blank in ("", "  \n", None):
        again = served.post("/api/attention", json={"text": SOURCE, "model": family, "target": blank}).json()
        assert again == body
    # max_new_tokens bounds what it writes.
    short = served.post("/api/attention", json={"text": SOURCE, "model": family, "max_new_tokens": 2}).json()
    two = expected(model, max_new_tokens=2)
    assert short["target_tokens"] == two.target_tokens and short["generated"] == two.generated <= 2


def test_a_forced_target_is_not_the_generated_one(served: TestClient) -> None:
    forced = served.post("/api/attention", json={"text": SOURCE, "model": "t5", "target": TARGET}).json()
    written = served.post("/api/attention", json={"text": SOURCE, "model": "t5"}).json()
    assert forced["generated"] == 0 and written["generated"] >= 1
    assert forced["target_tokens"] != written["target_tokens"]
    assert forced["tokens"] == written["tokens"] and forced["attention"] == written["attention"]


def test_a_long_target_or_source_is_truncated_and_flagged(served: TestClient, reference: Callable) -> None:
    long = " ".join(["klein"] * 200)
    body = served.post("/api/attention", json={"text": SOURCE, "model": "t5", "target": long}).json()
    info = reference("t5").info
    assert body["target_truncated"] is True and body["truncated"] is False
    assert len(body["target_tokens"]) == info.decoder_max_tokens
    assert np.shape(body["cross_attentions"]) == (3, 4, info.decoder_max_tokens, body["n"])
    source = served.post("/api/attention", json={"text": long, "model": "t5", "target": TARGET}).json()
    assert source["truncated"] is True and source["target_truncated"] is False
    assert source["n"] == info.max_tokens


# -- kinds on the head routes ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["encoder", "decoder", "cross"])
def test_one_head_of_each_kind_at_full_precision(served: TestClient, reference: Callable, kind: str) -> None:
    query = {"text": SOURCE, "target": TARGET, "model": "bart", "layer": 1, "head": 3, "kind": kind}
    body = served.post("/api/attention/head", json=query).json()
    result = expected(reference("bart"), target=TARGET)
    want = tensors(result)[kind][1, 3]
    queries = result.tokens if kind == "encoder" else result.target_tokens
    assert body["kind"] == kind and body["tokens"] == queries
    assert body["key_tokens"] == (result.target_tokens if kind == "decoder" else result.tokens)
    # Full float32 precision: only the two forwards differ.
    torch.testing.assert_close(torch.tensor(body["attention"]), want, atol=FORWARD, rtol=0)
    header, sections = compact.decode_sections(served.post("/api/attention/head/compact", json=query).content)
    assert header["kind"] == kind and (header["layer"], header["head"]) == (1, 3)
    assert list(sections) == [kind]
    # The compact head is the JSON head's float32 values exactly.
    np.testing.assert_array_equal(sections[kind][0, 0], np.array(body["attention"], dtype=np.float32))


def test_head_ranges_are_each_kinds_own(served: TestClient) -> None:
    base = {"text": SOURCE, "model": "t5", "head": 0}
    # The decoder has a third layer (2); the encoder has not.
    assert served.post("/api/attention/head", json={**base, "layer": 2, "kind": "cross"}).status_code == 200
    refused = served.post("/api/attention/head", json={**base, "layer": 2, "kind": "encoder"})
    assert refused.status_code == 422 and "layers 0..1" in refused.json()["detail"]
    refused = served.post("/api/attention/head", json={**base, "layer": 3, "kind": "decoder"})
    assert refused.status_code == 422 and "decoder attention" in refused.json()["detail"]


# -- refusals --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "architecture"), [("all-MiniLM-L6-v2", "an encoder"), ("llama", "a decoder")]
)
def test_a_target_for_a_model_without_a_decoder_of_its_own(
    served: TestClient, model: str, architecture: str
) -> None:
    for route in ("/api/attention", "/api/attention/compact"):
        r = served.post(route, json={"text": SOURCE, "model": model, "target": TARGET})
        assert r.status_code == 422
        assert r.json()["detail"] == (
            f"{model!r} is {architecture} model: only encoder-decoder models take a target (T5, BART, "
            "Marian); send no target"
        )
    # A blank target is no target.
    assert (
        served.post("/api/attention", json={"text": SOURCE, "model": model, "target": " "}).status_code == 200
    )
    # Asked outright to write one: refused the same way.
    r = served.post("/api/attention", json={"text": SOURCE, "model": model, "generate": True})
    assert r.status_code == 422
    assert r.json()["detail"] == (
        f"{model!r} is {architecture} model: only encoder-decoder models write a target (generate) (T5, "
        "BART, Marian); send no target"
    )


def test_generate_is_no_target_said_outright(served: TestClient) -> None:
    plain = served.post("/api/attention", json={"text": SOURCE, "model": "t5"}).json()
    asked = served.post("/api/attention", json={"text": SOURCE, "model": "t5", "generate": True}).json()
    assert asked == plain and asked["generated"] >= 1
    body = {"text": SOURCE, "model": "t5", "generate": True, "target": "Hi"}
    both = served.post("/api/attention", json=body)
    assert both.status_code == 422 and "not both" in str(both.json()["detail"])


@pytest.mark.parametrize("kind", ["decoder", "cross"])
def test_decoder_and_cross_kinds_need_an_encoder_decoder(served: TestClient, kind: str) -> None:
    for route, extra in (("/api/attention/head", {"layer": 0, "head": 0}), ("/api/analysis", {})):
        r = served.post(route, json={"text": SOURCE, "model": "llama", "kind": kind, **extra})
        assert r.status_code == 422
        assert f'kind "{kind}" needs an encoder-decoder model' in r.json()["detail"]
        assert "'llama' is a decoder model" in r.json()["detail"]


def test_other_refusals_say_why(served: TestClient) -> None:
    def detail(route: str, **body: object) -> str:
        r = served.post(route, json={"text": SOURCE, "model": "t5", **body})
        assert r.status_code == 422, (route, body, r.text)
        return str(r.json()["detail"])

    assert "HEADSCOPE_MAX_NEW_TOKENS" in detail("/api/attention", max_new_tokens=MAX_NEW_TOKENS + 1)
    assert "words: true is not available for an encoder-decoder" in detail("/api/attention", words=True)
    assert 'across the encoder\'s layers only (kind "encoder")' in detail("/api/rollout", kind="cross")
    assert "kind 'decoder'" in detail("/api/rollout/compact", kind="decoder")
    assert "attention flow" in detail("/api/flow", kind="cross")
    assert "traces cover encoder and decoder models" in detail("/api/trace")
    assert served.post("/api/rollout", json={"text": SOURCE, "model": "t5"}).status_code == 200


# -- insight per kind ---------------------------------------------------------------------------------------


def test_analysis_of_each_kind(served: TestClient) -> None:
    base = {"text": SOURCE, "target": TARGET, "model": "marian"}
    encoder = served.post("/api/analysis", json=base).json()
    assert "kind" not in encoder and set(encoder["stats"]) == set(analysis.STAT_DESCRIPTIONS)
    decoder = served.post("/api/analysis", json={**base, "kind": "decoder"}).json()
    assert decoder["kind"] == "decoder" and (decoder["layers"], decoder["n"]) == (3, len(decoder["tokens"]))
    assert {label for row in decoder["labels"] for label in row} <= set(analysis.LABELS)
    assert decoder["stats"]["forward"] == [[0.0] * 4] * 3  # causal: nothing above the diagonal

    cross = served.post("/api/analysis", json={**base, "kind": "cross"}).json()
    assert cross["kind"] == "cross" and cross["key_tokens"] == encoder["tokens"]
    assert cross["tokens"] == decoder["tokens"]
    assert set(cross["stats"]) == set(analysis.CROSS_STAT_DESCRIPTIONS)
    assert cross["stat_descriptions"] == analysis.CROSS_STAT_DESCRIPTIONS
    assert {label for row in cross["labels"] for label in row} <= set(analysis.CROSS_LABELS)
    # The statistics of the very float32 values the head route serves, to 6 decimals.
    heads = torch.tensor(
        [
            [
                served.post(
                    "/api/attention/head", json={**base, "kind": "cross", "layer": layer, "head": head}
                ).json()["attention"]
                for head in range(4)
            ]
            for layer in range(3)
        ]
    )
    full = served.post("/api/attention", json=base).json()
    want = analysis.cross_stats(
        heads, full["tokens"], key_special=full["special"], query_special=full["target_special"]
    )
    assert cross["labels"] == analysis.cross_labels(want)
    for name, values in want.items():
        # Rounded to 6 decimals (ROUND6) after the same float32 arithmetic on the same values.
        torch.testing.assert_close(torch.tensor(cross["stats"][name]), values, atol=ROUND6, rtol=0)


def test_compare_per_kind(served: TestClient) -> None:
    side = {"text": SOURCE, "target": TARGET, "model": "t5"}
    same = served.post("/api/compare", json={"a": side, "b": side, "kind": "cross"}).json()
    assert same["kind"] == "cross" and same["score"] == [[0.0] * 4] * 3 and same["kept_a"] == [[1.0] * 4] * 3
    other = {**side, "target": OTHER_TARGET}
    a_tokens = served.post("/api/attention", json=side).json()["target_tokens"]
    b_tokens = served.post("/api/attention", json=other).json()["target_tokens"]
    assert len(a_tokens) == len(b_tokens) and a_tokens != b_tokens  # one word swapped, as many tokens
    changed = served.post("/api/compare", json={"a": side, "b": other, "kind": "cross"})
    assert changed.status_code == 200 and max(max(row) for row in changed.json()["score"]) > 0
    longer = {**side, "target": TARGET + " und alt"}
    refused = served.post("/api/compare", json={"a": side, "b": longer, "kind": "cross"})
    assert refused.status_code == 422 and "same target and source lengths" in refused.json()["detail"]
    # The decoder's maps are square: compared on aligned target tokens, like an encoder's.
    decoder = served.post("/api/compare", json={"a": side, "b": longer, "kind": "decoder"}).json()
    assert decoder["kind"] == "decoder" and decoder["a"]["tokens"] == a_tokens
    head = served.post(
        "/api/compare/head", json={"a": side, "b": side, "kind": "cross", "layer": 2, "head": 1}
    ).json()
    assert head["kind"] == "cross" and head["diff"] == np.zeros_like(head["a"]).tolist()
    mixed = served.post(
        "/api/compare", json={"a": side, "b": {"text": SOURCE, "model": "llama"}, "kind": "cross"}
    )
    assert mixed.status_code == 422 and "needs an encoder-decoder model" in mixed.json()["detail"]


# -- generation runs on the model's workers and stops when nobody waits --------------------------------------


def test_generation_stops_when_its_client_leaves(served: TestClient) -> None:
    model = served.app.state.service.models.registry.get("t5")[1]  # type: ignore[attr-defined]
    asked, inside, ended = {"n": 0}, threading.Event(), []

    def attend(text: str, pair: str | None = None, *, cancel: Callable[[], bool], **kwargs: Any) -> Any:
        def pausing_cancel() -> bool:
            asked["n"] += 1
            if asked["n"] == 4:  # past the encoder's 2 layers, between generated tokens: the client leaves
                inside.set()
                deadline = time.monotonic() + 30
                while not cancel() and time.monotonic() < deadline:
                    time.sleep(0.01)
            return cancel()

        try:
            result = original(text, pair, cancel=pausing_cancel, **kwargs)
        except Cancelled as exc:
            ended.append(str(exc))
            raise
        ended.append("ok")
        return result

    original, model.attend = model.attend, attend
    try:
        exchange = served.portal.call(Exchange)  # its Event belongs to the app's loop
        body = {"text": "a source nobody waits for", "model": "t5"}
        done = served.portal.start_task_soon(post, served.app, "/api/attention", body, exchange)
        assert inside.wait(30)
        served.portal.call(exchange.gone.set)
        assert done.result(30).status == 499
        deadline = time.monotonic() + 30
        while not ended and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        del model.attend  # the class's method again
    assert len(ended) == 1 and ended[0].startswith("generation cancelled after"), ended
