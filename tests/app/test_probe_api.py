"""The head atlas over HTTP: /api/probe answers mha's model.probe_heads exactly, with the bounds its schema
states (and the model's limit on `length`), refuses every bad body with a 4xx before the stream, shares one
probe among identical requests in flight and keeps its answer in the service's cache. On the tiny Llama
(its probes take milliseconds) and the tiny T5 (its decoder's self-attention)."""

from __future__ import annotations

import asyncio
import json
import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.schemas.probe import MAX_SEED, MAX_SEQUENCES, ProbeDone
from tests.app.asgi import post
from tests.app.started import serving
from tests.seq2seq_checkpoints import build_seq2seq_checkpoint

KINDS = ("previous_token", "duplicate_token", "induction")
TIMEOUT = 30  # seconds any wait may take before it counts as a failure


class Gated:
    """Wraps a model's probe_heads: counts its calls; `gate`, when set, holds each call until it is set."""

    def __init__(self, model: Any) -> None:
        self.model, self.original, self.calls = model, model.probe_heads, 0
        self.gate: threading.Event | None = None
        model.probe_heads = self

    def __call__(self, **kwargs: Any) -> Any:
        self.calls += 1
        if self.gate is not None:
            assert self.gate.wait(TIMEOUT)
        return self.original(**kwargs)


@pytest.fixture(scope="module")
def client(  # type: ignore[no-untyped-def]
    make_settings, tiny_checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TestClient]:
    t5 = build_seq2seq_checkpoint("t5", tmp_path_factory.mktemp("probe") / "t5")
    settings = make_settings(models={"llama": tiny_checkpoints["llama"], "t5": t5})
    with serving(create_app(settings)) as test_client:
        yield test_client


def model_of(client: TestClient, name: str) -> Any:
    return client.app.state.service.models.registry.get(name)[1]  # type: ignore[attr-defined]


@pytest.fixture
def llama(client: TestClient) -> Iterator[Gated]:
    model = model_of(client, "llama")
    gated = Gated(model)
    yield gated
    del model.probe_heads  # the class's own again


def done_of(response: Any) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    events = [json.loads(line) for line in response.text.splitlines()]
    assert events[-1]["event"] == "done", events[-1]
    assert all(event["event"] == "progress" for event in events[:-1])
    return events[-1]  # type: ignore[no-any-return]


def grid(values: Any) -> list[list[float | None]]:
    return [[None if math.isnan(v) else v for v in row] for row in values.tolist()]


@pytest.mark.parametrize("name", ["llama", "t5"])
def test_the_answer_is_the_probes_own(client: TestClient, name: str) -> None:
    done = done_of(client.post("/api/probe", json={"model": name, "seed": 3, "sequences": 2, "length": 5}))
    ProbeDone.model_validate(done)
    model = model_of(client, name)
    expected = model.probe_heads(seed=3, sequences=2, length=5)
    layers, heads = expected.scores["induction"].shape
    assert (done["layers"], done["heads"], done["kinds"]) == (layers, heads, list(KINDS))
    for kind in KINDS:  # float32 -> the Python floats they equal, NaN (no pattern key) as null
        assert done["scores"][kind] == grid(expected.scores[kind])
        assert done["spread"][kind] == grid(expected.spread[kind])
        assert done["chance"][kind] == grid(expected.chance[kind])
    assert done["labels"] == expected.labels
    assert done["token_ids"] == expected.token_ids[0].tolist() and done["tokens"] == expected.tokens
    assert len(done["token_ids"]) in (2 * 5, 2 * 5 + 1)  # with a start token, or none
    assert (done["seed"], done["sequences"], done["length"]) == (3, 2, 5)
    assert (done["threshold"], done["margin"]) == (expected.threshold, expected.margin)
    assert done["kind"] == ("decoder" if name == "t5" else "self") == expected.kind
    assert (done["byte_level"], done["causal"]) == (model.info.byte_level, model.info.causal)


def test_a_second_ask_is_the_cached_line(client: TestClient, llama: Gated) -> None:
    first = client.post("/api/probe", json={"model": "llama", "seed": 1, "length": 4})
    again = client.post("/api/probe", json={"model": "llama", "seed": 1.0, "length": 4, "sequences": 8})
    assert again.text == first.text.splitlines(keepends=True)[-1] and llama.calls == 1  # no progress: cached
    done_of(client.post("/api/probe", json={"model": "llama", "seed": 2, "length": 4}))  # another seed
    assert llama.calls == 2


def test_identical_requests_in_flight_share_one_probe(client: TestClient, llama: Gated) -> None:
    llama.gate = threading.Event()
    service = client.app.state.service  # type: ignore[attr-defined]
    body = {"model": "llama", "seed": 7, "length": 3}

    async def both() -> list[Any]:
        tasks = [asyncio.ensure_future(post(client.app, "/api/probe", body)) for _ in range(2)]
        # Wait, on the app's loop, until both wait on the one flight; only then may the probe run.
        while not any(flight.waiters == 2 for flight in service.answers.flights._flights.values()):
            await asyncio.sleep(0)
        llama.gate.set()  # type: ignore[union-attr]
        return await asyncio.gather(*tasks)

    exchanges = client.portal.call(asyncio.wait_for, both(), TIMEOUT)
    assert llama.calls == 1
    assert exchanges[0].body == exchanges[1].body
    assert json.loads(exchanges[0].body.splitlines()[-1])["seed"] == 7


def test_length_is_bounded_by_the_models_limit(client: TestClient, llama: Gated) -> None:
    limit = client.app.state.service.settings.tokens_for(llama.model.info.max_tokens)  # type: ignore[attr-defined]
    longest = (limit - 1) // 2  # 2·length + 1 ≤ limit
    done = done_of(client.post("/api/probe", json={"model": "llama", "length": longest, "sequences": 1}))
    assert len(done["token_ids"]) <= limit
    over = client.post("/api/probe", json={"model": "llama", "length": longest + 1})
    assert (
        over.status_code == 422
        and f"length ({longest + 1}) is over {longest} for 'llama'" in over.json()["detail"]
    )
    assert llama.calls == 1


@pytest.mark.parametrize(
    ("body", "status", "detail"),
    [
        ({"model": "nope"}, 404, "unknown model 'nope'"),
        ({"seed": -1}, 422, "seed"),
        ({"seed": MAX_SEED + 1}, 422, "seed"),
        ({"seed": 1.5}, 422, "fractional part"),
        ({"seed": "1"}, 422, "seed"),
        ({"sequences": 0}, 422, "sequences"),
        ({"sequences": MAX_SEQUENCES + 1}, 422, "sequences"),
        ({"length": 1}, 422, "length"),
        ({"length": True}, 422, "length"),
        ({"length": 10**6}, 422, "length"),
        ({"text": "a"}, 422, "Extra inputs are not permitted"),
    ],
)
def test_a_bad_body_is_a_4xx_before_any_probe(
    client: TestClient, llama: Gated, body: dict[str, Any], status: int, detail: str
) -> None:
    response = client.post("/api/probe", json={"model": "llama", **body})
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    assert detail in response.json()["detail"]
    assert llama.calls == 0


def test_the_default_models_limit_is_said(client: TestClient) -> None:
    response = client.post("/api/probe", json={"length": 256})  # MiniLM reads 512 tokens: 255 at most
    assert response.status_code == 422
    assert "length (256) is over 255 for 'all-MiniLM-L6-v2'" in response.json()["detail"]


# -- the probe's input (`probe` in every input body): its first sequence, opened as a text is ---------


@pytest.mark.parametrize("name", ["llama", "t5"])
def test_the_probe_input_answers_as_the_probes_first_sequence(client: TestClient, name: str) -> None:
    """/api/attention with `probe` is model.attend_probe: the probe's row 0 (its token_ids as /api/probe
    sends them), maps as the model gives them; T5's is its decoder's target, the source the empty text."""
    body = {"model": name, "probe": {"seed": 3, "length": 5}}
    answer = client.post("/api/attention", json=body)
    assert answer.status_code == 200, answer.text
    got = answer.json()
    done = done_of(client.post("/api/probe", json={"model": name, "seed": 3, "sequences": 2, "length": 5}))
    model = model_of(client, name)
    expected = model.attend_probe(seed=3, length=5)
    if name == "t5":
        assert got["target_tokens"] == done["tokens"] == expected.target_tokens
        assert got["decoder_attentions"] == [
            [[[round(v, 6) for v in row] for row in h] for h in layer]
            for layer in expected.decoder_attentions.double().tolist()
        ]
    else:
        assert got["tokens"] == done["tokens"] == expected.tokens
        assert got["attention"] == [
            [[[round(v, 6) for v in row] for row in h] for h in layer]
            for layer in expected.attentions.double().tolist()
        ]
    # The page's other views of the same input: the compact first view, one head, the analysis.
    for route in ("/api/attention/compact", "/api/analysis"):
        assert client.post(route, json=body).status_code == 200, route
    kind = "decoder" if name == "t5" else "encoder"
    head = client.post("/api/attention/head", json={**body, "layer": 0, "head": 0, "kind": kind})
    assert head.status_code == 200, head.text


def test_the_probe_input_is_one_forward_cached(client: TestClient) -> None:
    """Two asks of the same probe input: one forward (the second a cache hit), apart from another seed's."""
    model = model_of(client, "llama")
    calls = []
    original = model.attend_probe
    model.attend_probe = lambda **kwargs: calls.append(kwargs) or original(**kwargs)
    try:
        for seed in (11, 11, 12):
            response = client.post(
                "/api/attention", json={"model": "llama", "probe": {"seed": seed, "length": 4}}
            )
            assert response.status_code == 200, response.text
    finally:
        del model.attend_probe
    assert [call["seed"] for call in calls] == [11, 12]


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ({"text": "a", "probe": {}}, "with probe set, send no text"),
        ({"probe": {}, "text_pair": "b"}, "(got text_pair)"),
        ({"probe": {}, "chat": True}, "(got chat)"),
        ({"probe": {}, "max_new_tokens": 2}, "(got max_new_tokens)"),
        ({"probe": {}, "generate": True}, "(got generate)"),
        ({"probe": {}, "words": True}, "words must be false"),
        ({"probe": {}, "weighting": "norm"}, "words must be false"),
        ({"probe": {"seed": -1}}, "seed"),
        ({"probe": {"length": 1}}, "length"),
        ({"probe": {"sequences": 2}}, "Extra inputs are not permitted"),
        ({"probe": {"length": 10_000}}, "length"),
        ({"probe": None}, "text is empty: give a text, or a probe"),
    ],
)
def test_a_bad_probe_input_is_422(client: TestClient, body: dict[str, Any], detail: str) -> None:
    response = client.post("/api/attention", json={"model": "llama", **body})
    assert response.status_code == 422, response.text
    assert detail in response.json()["detail"]


def test_the_probe_inputs_length_is_bounded_by_the_models_limit(client: TestClient) -> None:
    limit = client.app.state.service.settings.tokens_for(model_of(client, "llama").info.max_tokens)  # type: ignore[attr-defined]
    longest = (limit - 1) // 2
    ok = client.post("/api/attention", json={"model": "llama", "probe": {"length": longest}})
    assert ok.status_code == 200 and len(ok.json()["tokens"]) <= limit
    over = client.post("/api/attention", json={"model": "llama", "probe": {"length": longest + 1}})
    assert over.status_code == 422 and f"length ({longest + 1}) is over {longest}" in over.json()["detail"]


def test_identical_probe_inputs_in_flight_share_one_forward(client: TestClient) -> None:
    """Two identical probe-input requests, both waiting on one flight before the forward may start: one
    attend_probe, one answer for both."""
    model, gate, calls = model_of(client, "llama"), threading.Event(), []
    original = model.attend_probe
    service = client.app.state.service  # type: ignore[attr-defined]

    def gated(**kwargs: Any) -> Any:
        calls.append(kwargs)
        assert gate.wait(TIMEOUT)
        return original(**kwargs)

    body = {"model": "llama", "probe": {"seed": 21, "length": 3}}

    async def both() -> list[Any]:
        tasks = [asyncio.ensure_future(post(client.app, "/api/attention", body)) for _ in range(2)]
        while not any(flight.waiters == 2 for flight in service.answers.flights._flights.values()):
            await asyncio.sleep(0)
        gate.set()
        return await asyncio.gather(*tasks)

    model.attend_probe = gated
    try:
        exchanges = client.portal.call(asyncio.wait_for, both(), TIMEOUT)
    finally:
        del model.attend_probe
    assert [call["seed"] for call in calls] == [21]
    assert exchanges[0].body == exchanges[1].body and json.loads(exchanges[0].body)["tokens"]
