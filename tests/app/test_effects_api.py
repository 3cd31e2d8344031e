"""Which heads matter over HTTP: /api/head-effects answers mha's model.head_effects exactly, streams a
progress line per layer for a model of more than 100 heads, keeps its answer in the service's cache,
refuses what it cannot measure with a 4xx before the stream, and stops when its client hangs up."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from checkpoints import build_long_llama
from fastapi.testclient import TestClient
from tolerances import FORWARD

import mha
from app.main import create_app
from app.schemas.effects import PROGRESS_HEADS, HeadEffectsDone
from mha.errors import Cancelled
from tests.app.asgi import Exchange, post
from tests.app.counting import Counting
from tests.app.started import serving
from tests.seq2seq_checkpoints import build_seq2seq_checkpoint

DEFAULT = "all-MiniLM-L6-v2"
TEXT = "The capital of France is"
PAIR = "It is a city."
WIDE = "wide-llama"  # 13 layers x 8 heads: past PROGRESS_HEADS
WIDE_LAYERS, WIDE_HEADS = 13, 8
TIMEOUT = 30  # seconds any wait may take before it counts as a failure


@pytest.fixture(scope="module")
def models(tiny_checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("effects")
    wide = build_long_llama(
        root / WIDE, layers=WIDE_LAYERS, num_attention_heads=WIDE_HEADS, num_key_value_heads=2
    )
    return {"llama": tiny_checkpoints["llama"], WIDE: wide, "t5": build_seq2seq_checkpoint("t5", root / "t5")}


@pytest.fixture
def client(make_settings, models: dict[str, Path]) -> Iterator[TestClient]:  # type: ignore[no-untyped-def]
    with serving(create_app(make_settings(models=models, max_new_tokens=4))) as test_client:
        yield test_client


def counting(client: TestClient, name: str) -> Counting:
    registry = client.app.state.service.models.registry  # type: ignore[attr-defined]
    return Counting(registry.get(name)[1], "head_effects")


def lines(response: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in response.text.splitlines()]


def as_list(values: torch.Tensor | None) -> Any:
    return None if values is None else values.tolist()


@pytest.mark.parametrize(
    ("name", "body"),
    [
        ("llama", {"text": TEXT, "max_new_tokens": 3}),
        ("llama", {"text": TEXT, "chat": True}),
        (DEFAULT, {"text": TEXT, "text_pair": PAIR}),
    ],
)
def test_the_answer_is_mhas_head_effects_exactly(
    client: TestClient, models: dict[str, Path], name: str, body: dict[str, Any]
) -> None:
    response = client.post("/api/head-effects", json={**body, "model": name})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/x-ndjson"
    [done] = lines(response)  # 12 and 72 heads: no progress lines
    HeadEffectsDone.model_validate(done)
    model = mha.load_pretrained(models.get(name), device="cpu")
    # The same float32 ops on the same shapes in one process (torch.set_num_threads is global): bit for bit.
    limit = client.app.state.service.settings.tokens_for(model.info.max_tokens)  # type: ignore[attr-defined]
    expected = model.head_effects(
        body["text"],
        body.get("text_pair"),
        max_tokens=limit,
        max_new_tokens=body.get("max_new_tokens"),
        chat=body.get("chat", False),
    )
    assert done["model"] == name and done["tokens"] == expected.tokens and done["n"] == len(expected.tokens)
    assert (done["layers"], done["heads"]) == (model.info.layers, model.info.heads)
    assert done["causal"] is model.info.causal and done["byte_level"] is model.info.byte_level
    assert done["measure"] == expected.measure and done["truncated"] is False
    assert done["effects"] == expected.effects.tolist()
    assert done["steps"] == as_list(expected.steps) and done["pooled"] == as_list(expected.pooled)
    assert done["positions"] == expected.positions and done["generated"] == expected.generated
    assert done["top_tokens"] == expected.top_tokens and done["top_probs"] == expected.top_probs
    if model.info.causal:  # the output named: the last step's token and probability
        assert done["top_tokens"] is not None and len(done["top_tokens"]) == expected.generated + 1
        assert 0 < done["top_probs"][-1] <= 1
    else:
        assert done["pooled"] is not None and done["top_tokens"] is None


def test_an_encoder_decoder_answers_the_heads_of_its_three_attentions(
    client: TestClient, models: dict[str, Path]
) -> None:
    model = mha.load_pretrained(models["t5"], device="cpu")
    limit = client.app.state.service.settings.tokens_for(model.info.max_tokens)  # type: ignore[attr-defined]
    for body, new_tokens in (({"target": "Das Haus."}, None), ({}, 4), ({"max_new_tokens": 2}, 2)):
        response = client.post("/api/head-effects", json={"text": TEXT, "model": "t5", **body})
        assert response.status_code == 200, response.text
        [done] = lines(response)  # a few heads: no progress lines
        HeadEffectsDone.model_validate(done)
        # No target and no max_new_tokens: the model writes min(its default, the service's limit of 4).
        expected = model.head_effects(
            TEXT, max_tokens=limit, max_new_tokens=new_tokens, target=body.get("target")
        )
        assert expected.sections is not None and done["sections"] is not None
        assert done["measure"] == "kl" and done["tokens"] == expected.tokens
        assert done["source_tokens"] == expected.source_tokens and done["generated"] == expected.generated
        for kind, section in expected.sections.items():
            answer = done["sections"][kind]
            # The service's worker thread may split T5's products over another number of threads than this
            # one (its sums in another order): each log-probability within FORWARD, so each KL within
            # 2·FORWARD plus FORWARD times its size, as tests/mha/test_ablation.py bounds it.
            steps = torch.tensor(answer["steps"], dtype=torch.float64)
            bound = 2 * FORWARD + FORWARD * float(steps.abs().max())
            assert (steps - section.steps.double()).abs().max() <= bound, kind
            assert answer["effects"] == [[cell[-1] for cell in row] for row in answer["steps"]]
            assert (answer["layers"], answer["heads"]) == tuple(section.effects.shape)
        assert done["effects"] == done["sections"]["encoder"]["effects"]
        assert done["positions"] == list(range(len(expected.tokens)))


def test_a_model_over_100_heads_streams_its_progress_and_a_second_ask_is_the_cached_line(
    client: TestClient,
) -> None:
    assert WIDE_LAYERS * WIDE_HEADS > PROGRESS_HEADS
    calls = counting(client, WIDE)
    response = client.post("/api/head-effects", json={"text": TEXT, "model": WIDE})
    assert response.status_code == 200
    events = lines(response)
    progress = [{"event": "progress", "done": i + 1, "layers": WIDE_LAYERS} for i in range(WIDE_LAYERS)]
    assert events[:-1] == progress and events[-1]["event"] == "done"
    assert len(events[-1]["effects"]) == WIDE_LAYERS and len(events[-1]["effects"][0]) == WIDE_HEADS
    # Asked again (max_new_tokens 0 is no continuation, as null): the cached line, no ablation, no progress.
    again = client.post("/api/head-effects", json={"text": TEXT, "model": WIDE, "max_new_tokens": 0})
    assert again.text == response.text.splitlines(keepends=True)[-1]
    assert calls.ended == ["ok"]
    # Another input is measured afresh.
    other = lines(client.post("/api/head-effects", json={"text": TEXT + " Paris", "model": WIDE}))
    assert len(other) == WIDE_LAYERS + 1 and calls.ended == ["ok", "ok"]


@pytest.mark.parametrize(
    ("body", "status", "detail"),
    [
        ({"model": "llama", "target": "Paris"}, 422, "only encoder-decoder models take a target"),
        ({"target": "Paris"}, 422, "is an encoder model: only encoder-decoder models take a target"),
        ({"max_new_tokens": 2}, 422, "is an encoder: it reads the whole text at once"),
        ({"model": "llama", "max_new_tokens": 5}, 422, "over this service's limit (4"),
        ({"chat": True}, 422, "chat template"),
        ({"model": "llama", "chat": True, "text_pair": PAIR}, 422, "without text_pair"),
        ({"model": "nope"}, 404, "unknown model 'nope'"),
        ({"weighting": "norm"}, 422, "weighting: Extra inputs are not permitted"),
        ({"text": "   "}, 422, "text is blank"),
    ],
)
def test_what_cannot_be_measured_is_refused_before_the_stream(
    client: TestClient, body: dict[str, Any], status: int, detail: str
) -> None:
    response = client.post("/api/head-effects", json={"text": TEXT, **body})
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    assert detail in response.json()["detail"]


def test_a_client_that_hangs_up_stops_the_ablations(client: TestClient) -> None:
    calls = counting(client, WIDE)
    service = client.app.state.service  # type: ignore[attr-defined]
    hung_up = threading.Event()

    def hold_layer_2(layer: int) -> None:
        if layer == 2:  # the ablations wait here until the client has gone
            assert hung_up.wait(TIMEOUT)

    calls.before_layer = hold_layer_2
    exchange = client.portal.call(Exchange)  # its Event belongs to the app's loop
    exchange.hang_up_after_chunks = 2  # layers 0 and 1 done
    client.portal.call(post, client.app, "/api/head-effects", {"text": TEXT, "model": WIDE}, exchange)
    hung_up.set()
    assert exchange.status == 200
    assert [json.loads(line)["done"] for line in exchange.chunks] == [1, 2]
    assert calls.wait_ended(TIMEOUT) == [Cancelled.__name__]  # stopped before layer 3, not run to its end
    assert not [key for key in service.answers.cache.keys() if key[0] == "head-effects"]
    # Asked again later: measured afresh, whole.
    calls.before_layer = None
    assert lines(client.post("/api/head-effects", json={"text": TEXT, "model": WIDE}))[-1]["event"] == "done"
    assert calls.ended == [Cancelled.__name__, "ok"]


def test_a_failure_after_the_stream_began_is_its_last_line(client: TestClient) -> None:
    calls = counting(client, WIDE)

    def fail_at_layer_3(layer: int) -> None:
        if layer == 3:
            raise RuntimeError("out of memory, say")

    calls.before_layer = fail_at_layer_3
    response = client.post("/api/head-effects", json={"text": TEXT, "model": WIDE})
    assert response.status_code == 200
    events = lines(response)
    assert [event["done"] for event in events[:-1]] == [1, 2, 3]
    assert events[-1] == {
        "event": "error",
        "detail": "measuring the head effects failed on the server (logged)",
    }
    calls.before_layer = None  # nothing was kept: measured again
    assert lines(client.post("/api/head-effects", json={"text": TEXT, "model": WIDE}))[-1]["event"] == "done"
