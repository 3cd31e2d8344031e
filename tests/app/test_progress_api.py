"""POST /api/attention/progress: the load's and then the forward's progress of the work in flight for an
input, a line per layer, ending when that work ends; a cancelled forward stops before its next layer; a bad
body is a 4xx before any stream."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from mha.loading import checkpoint
from tests.app.started import serving
from tests.app.test_cancellation import TIMEOUT, Gate, hang_up, one_worker, start, wait_until

__all__ = ["one_worker"]  # the fixture, shared with test_cancellation.py

PROGRESS = "/api/attention/progress"
LAYERS = 6  # the embedded MiniLM's


def events(body: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in body.decode().splitlines() if line.strip()]


def layers_told(lines: list[dict[str, Any]]) -> list[int]:
    return [line["layer"] for line in lines if line["event"] == "progress"]


def pausing(gate: Gate, before: int, paused: threading.Event, go_on: Callable[[], bool]) -> None:
    """The gate's forwards pause as layer `before` is asked for (paused set), until go_on() says so."""
    gate.held.set()  # no holding before the forward: this pauses inside it instead
    original = gate.original
    asked = {"n": 0}

    def attend_batch(items: list[Any], *, cancel: Callable[[], bool], **kwargs: Any) -> Any:
        def pausing_cancel() -> bool:
            asked["n"] += 1
            if asked["n"] == before + 1:
                paused.set()
                wait_until(go_on, "the test lets the forward go on")
            return cancel()

        return original(items, cancel=pausing_cancel, **kwargs)

    gate.original = attend_batch
    gate.asked = asked  # type: ignore[attr-defined]


def test_each_layer_of_a_forward_in_flight_is_told_then_done(one_worker: tuple[TestClient, Gate]) -> None:
    client, gate = one_worker
    paused, go = threading.Event(), threading.Event()
    pausing(gate, 1, paused, go.is_set)
    body = {"text": "A forward watched layer by layer."}
    _, answer = start(client, "/api/attention/compact", body)
    assert paused.wait(TIMEOUT)
    watch, watched = start(client, PROGRESS, {**body, "words": True})  # words: the same forward
    wait_until(lambda: bool(watch.chunks), "the stream tells the latest layer")
    go.set()
    assert answer.result(TIMEOUT).status == 200
    assert watched.result(TIMEOUT).status == 200
    lines = events(watch.body)
    assert watch.headers["content-type"].startswith("application/x-ndjson")
    # The latest first (layer 0 had started when the stream opened), then each layer as it starts.
    assert layers_told(lines) == list(range(LAYERS))
    assert {(line["layers"], line["pass"]) for line in lines if line["event"] == "progress"} == {(LAYERS, 0)}
    assert lines[-1] == {"event": "done"}


def test_a_cancelled_forward_stops_before_its_next_layer_and_the_stream_ends(
    one_worker: tuple[TestClient, Gate],
) -> None:
    client, gate = one_worker
    paused = threading.Event()
    stream_open = threading.Event()
    body = {"text": "A forward that is cancelled while watched."}
    exchange, answer = start(client, "/api/attention/compact", body)
    pausing(gate, 2, paused, lambda: stream_open.is_set() and answer.done())
    assert paused.wait(TIMEOUT)
    watch, watched = start(client, PROGRESS, body)
    wait_until(lambda: bool(watch.chunks), "the stream tells the latest layer")
    stream_open.set()
    hang_up(client, exchange)  # the page's Cancel: it aborts its request
    assert answer.result(TIMEOUT).status == 499
    assert watched.result(TIMEOUT).status == 200
    wait_until(lambda: bool(gate.forwards), "the forward ends")
    assert gate.forwards == [([body["text"]], "Cancelled")]
    assert gate.asked["n"] == 3  # type: ignore[attr-defined]  # asked before layers 0, 1, 2: stopped there
    lines = events(watch.body)
    assert layers_told(lines) == [1]  # the latest when it opened; layer 2 never started
    assert lines[-1] == {"event": "done"}


def test_a_batch_tells_every_input_of_it(one_worker: tuple[TestClient, Gate]) -> None:
    client, gate = one_worker
    _, first = start(client, "/api/attention/compact", {"text": "This one holds the worker."})
    assert gate.held.wait(TIMEOUT)
    service = client.app.state.service
    texts = ["Batched one.", "Batched two."]
    answers = [start(client, "/api/attention/compact", {"text": text})[1] for text in texts]
    wait_until(lambda: service.forwards.queued("all-MiniLM-L6-v2") == 2, "both are queued")
    watches = [start(client, PROGRESS, {"text": text}) for text in texts]
    wait_until(lambda: service.watch.watching == 2, "both streams watch")
    gate.release.set()
    for done in [first, *answers, *(done for _, done in watches)]:
        assert done.result(TIMEOUT).status == 200
    assert gate.forwards[-1] == (texts, "ok")  # one forward for both
    for watch, _ in watches:
        lines = events(watch.body)
        assert layers_told(lines) == list(range(LAYERS)) and lines[-1] == {"event": "done"}


def test_nothing_in_flight_is_done_at_once(client: TestClient) -> None:
    answer = client.post(PROGRESS, json={"text": "Nothing asked this yet."})
    assert answer.status_code == 200
    assert events(answer.content) == [{"event": "done"}]


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"text": "x", "model": "no/such:model"}, 404),
        ({}, 422),
        ({"text": 5}, 422),
        ({"text": "x", "max_new_tokens": 10**6}, 422),
        ({"text": "x", "words": "yes"}, 422),
    ],
)
def test_a_bad_body_is_a_4xx_before_any_stream(client: TestClient, body: dict[str, Any], status: int) -> None:
    answer = client.post(PROGRESS, json=body)
    assert answer.status_code == status
    assert answer.json()["detail"]


@pytest.fixture
def slow_load(
    make_settings: Callable[..., Any], tiny_checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[TestClient, threading.Event]]:
    """A service whose tiny Llama's load waits, in the middle of reading its weights, until released."""
    release = threading.Event()
    original = checkpoint.load_weights

    def held(files: list[Path]) -> Any:
        if files[0].is_relative_to(tiny_checkpoints["llama"]):  # (the default loads unheld at startup)
            assert release.wait(TIMEOUT)
        return original(files)

    monkeypatch.setattr(checkpoint, "load_weights", held)
    app = create_app(make_settings(models={"tiny/llama:Q8": tiny_checkpoints["llama"]}))
    with serving(app) as client:
        yield client, release
        release.set()


def watch_a_held_load(slow_load: tuple[TestClient, threading.Event], path: str) -> list[dict[str, Any]]:
    """POST `path` for the held model, watch its load from the progress stream once it is loading, release
    it: the stream's lines, once both requests answered 200."""
    client, release = slow_load
    body = {"text": "The cat sat.", "model": "tiny/llama:Q8"}  # a name with / and :, in the body only
    _, answer = start(client, path, body)
    wait_until(lambda: body["model"] in client.get("/api/health").json()["loading"], "the load starts")
    watch, watched = start(client, PROGRESS, body)
    wait_until(lambda: bool(watch.chunks), "the stream tells the load")
    release.set()
    assert answer.result(TIMEOUT).status == 200
    assert watched.result(TIMEOUT).status == 200
    return events(watch.body)


def test_a_load_is_told_as_it_goes_then_the_forward(slow_load: tuple[TestClient, threading.Event]) -> None:
    lines = watch_a_held_load(slow_load, "/api/attention/compact")
    loads = [line for line in lines if line["event"] == "load"]
    assert loads and {line["model"] for line in loads} == {"tiny/llama:Q8"}
    steps = [line["step"] for line in loads]
    assert steps == sorted(steps) and loads[-1]["step"] == loads[-1]["steps"]  # rising to the end
    first_layer = next(i for i, line in enumerate(lines) if line["event"] == "progress")
    assert first_layer > lines.index(loads[-1])  # the load, then the forward
    assert lines[-1] == {"event": "done"}
    service = slow_load[0].app.state.service
    wait_until(lambda: service.watch._latest == {}, "nothing left of it once both ended")


def test_a_load_without_a_forward_is_told_too(slow_load: tuple[TestClient, threading.Event]) -> None:
    """A long input's token count waits for its model's load: the stream tells that load, then ends."""
    lines = watch_a_held_load(slow_load, "/api/trace/tokens")
    assert [line["event"] for line in lines] == ["load"] * (len(lines) - 1) + ["done"]
    assert lines[-2]["step"] == lines[-2]["steps"]
