"""Work for a client that has gone away stops; a shared computation goes on for those still waiting; the
queue is bounded; identical insight requests in flight are computed once."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient

import app.service as service_module
from app.main import create_app
from app.service import bodies
from mha.errors import Cancelled
from tests.app.asgi import Exchange, post, run_async
from tests.app.started import serving

DEFAULT = "all-MiniLM-L6-v2"
TIMEOUT = 30  # seconds any wait in these tests may take before it counts as a failure


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.01)


class Gate:
    """Wraps the default model's attend_batch: records every forward's texts and how it ended, and holds
    the first forward until released, so the single worker is busy while a test arranges the queue."""

    def __init__(self, model: Any) -> None:
        self.original = model.attend_batch
        self.forwards: list[tuple[list[str], str]] = []  # (texts, "ok" | exception name)
        self.held = threading.Event()
        self.release = threading.Event()
        model.attend_batch = self

    def __call__(self, items: list[Any], **kwargs: Any) -> Any:
        texts = [text for text, _ in items]
        if not self.forwards and not self.held.is_set():
            self.held.set()
            assert self.release.wait(TIMEOUT)
        try:
            result = self.original(items, **kwargs)
        except Exception as exc:
            self.forwards.append((texts, type(exc).__name__))
            raise
        self.forwards.append((texts, "ok"))
        return result

    def texts(self) -> list[str]:
        return [text for texts, _ in self.forwards for text in texts]


@pytest.fixture
def one_worker(make_settings) -> Iterator[tuple[TestClient, Gate]]:  # type: ignore[no-untyped-def]
    app = create_app(make_settings(max_concurrency=1, max_queue=2))
    with serving(app) as client:
        service = app.state.service
        gate = Gate(service.models.registry.loaded(DEFAULT))
        yield client, gate
        gate.release.set()  # (a failed test must not leave the worker held)


def start(client: TestClient, path: str, body: Any) -> tuple[Exchange, Any]:
    """Send a request on the app's loop without waiting for it: (its exchange, a future of it)."""
    exchange = client.portal.call(Exchange)  # its Event belongs to the app's loop
    return exchange, client.portal.start_task_soon(post, client.app, path, body, exchange)


def hang_up(client: TestClient, exchange: Exchange) -> None:
    client.portal.call(exchange.gone.set)


def test_the_cancel_callback_stops_a_forward_between_layers(minilm) -> None:  # type: ignore[no-untyped-def]
    calls = {"n": 0}

    def cancel_before_layer_2() -> bool:
        calls["n"] += 1
        return calls["n"] == 3  # asked before layers 0, 1 and 2

    with pytest.raises(Cancelled, match="before layer 2 of 6"):
        minilm.attend_batch(["The cat sat."], cancel=cancel_before_layer_2)
    assert calls["n"] == 3
    kept = minilm.attend_batch(["The cat sat."], cancel=lambda: False)[0]
    assert torch.equal(kept.attentions, minilm.attend("The cat sat.").attentions)


def test_a_request_whose_client_left_is_dropped_before_its_forward(
    one_worker: tuple[TestClient, Gate], caplog: pytest.LogCaptureFixture
) -> None:
    client, gate = one_worker
    service = client.app.state.service
    _, first = start(client, "/api/attention/compact", {"text": "This one holds the worker."})
    assert gate.held.wait(TIMEOUT)
    left, left_done = start(client, "/api/attention", {"text": "Nobody will read this answer."})
    wait_until(lambda: service.forwards.queued(DEFAULT) == 1, "the second request is queued")
    with caplog.at_level(logging.INFO, logger="app"):
        hang_up(client, left)
        assert left_done.result(TIMEOUT).status == 499  # for the access log (uvicorn sends nothing)
        assert (
            service.forwards.queued(DEFAULT) == 0
        )  # an abandoned job does not count against the queue bound
    gate.release.set()
    assert first.result(TIMEOUT).status == 200
    assert gate.texts() == ["This one holds the worker."]  # the abandoned text never ran
    assert any("client closed the connection" in r.getMessage() for r in caplog.records)
    # The same text asked again later is computed afresh, not joined to the abandoned work.
    again = client.post("/api/attention", json={"text": "Nobody will read this answer."})
    assert again.status_code == 200 and gate.texts()[-1] == "Nobody will read this answer."


def test_a_shared_computation_goes_on_while_one_client_waits(one_worker: tuple[TestClient, Gate]) -> None:
    client, gate = one_worker
    service = client.app.state.service
    _, first = start(client, "/api/attention/compact", {"text": "This one holds the worker."})
    assert gate.held.wait(TIMEOUT)
    body = {"text": "Two clients ask for this."}
    leaving, leaving_done = start(client, "/api/attention", body)
    staying, staying_done = start(client, "/api/attention", body)
    wait_until(lambda: service.forwards.queued(DEFAULT) == 1, "the shared job is queued")
    hang_up(client, leaving)
    assert leaving_done.result(TIMEOUT).status == 499
    gate.release.set()
    assert first.result(TIMEOUT).status == 200
    assert staying_done.result(TIMEOUT).status == 200
    assert gate.texts().count("Two clients ask for this.") == 1  # run once, for the one still waiting


def test_a_forward_stops_between_layers_when_its_client_leaves(
    one_worker: tuple[TestClient, Gate],
) -> None:
    client, gate = one_worker
    gate.held.set()  # no holding: this test pauses inside the forward instead
    asked = {"n": 0}
    inside = threading.Event()
    original = gate.original

    def attend_batch(items: list[Any], *, cancel: Callable[[], bool], **kwargs: Any) -> Any:
        def pausing_cancel() -> bool:
            asked["n"] += 1
            if asked["n"] == 2:  # before layer 1: let the client leave now
                inside.set()
                wait_until(cancel, "the service cancels the forward")
            return cancel()

        return original(items, cancel=pausing_cancel, **kwargs)

    gate.original = attend_batch
    exchange, done = start(client, "/api/attention", {"text": "A forward that nobody waits for."})
    assert inside.wait(TIMEOUT)
    hang_up(client, exchange)
    assert done.result(TIMEOUT).status == 499
    wait_until(lambda: bool(gate.forwards), "the forward ends")
    assert gate.forwards == [(["A forward that nobody waits for."], "Cancelled")]
    assert asked["n"] == 2  # stopped before layer 1 of 6


def test_a_full_queue_answers_503_with_retry_after(one_worker: tuple[TestClient, Gate]) -> None:
    client, gate = one_worker
    service = client.app.state.service
    _, first = start(client, "/api/attention/compact", {"text": "This one holds the worker."})
    assert gate.held.wait(TIMEOUT)
    queued = [start(client, "/api/attention/compact", {"text": f"Queued text {i}."})[1] for i in range(2)]
    wait_until(lambda: service.forwards.queued(DEFAULT) == 2, "two requests are queued (the limit)")
    r = client.post("/api/attention/compact", json={"text": "One too many."})
    assert r.status_code == 503
    assert int(r.headers["retry-after"]) >= 1
    assert "busy" in r.json()["detail"] and DEFAULT in r.json()["detail"]
    assert client.get("/api/health").status_code == 200  # the service itself is fine
    gate.release.set()
    assert [f.result(TIMEOUT).status for f in [first, *queued]] == [200, 200, 200]
    assert client.post("/api/attention/compact", json={"text": "One too many."}).status_code == 200


INSIGHT = {  # route, its method of service.insight, the body builder that must run once, the request
    "analysis": ("/api/analysis", "analysis", "analysis_body", {"text": "Insight once."}),
    "rollout": ("/api/rollout", "rollout", "rollout_body", {"text": "Insight once."}),
    "flow": ("/api/flow", "flow", "flow_body", {"text": "Insight once."}),
    "compare": (
        "/api/compare",
        "compare",
        "compare_body",
        {"a": {"text": "Insight once."}, "b": {"text": "Insight twice."}},
    ),
}


@pytest.mark.parametrize("kind", sorted(INSIGHT))
def test_identical_insight_requests_in_flight_are_computed_once(
    one_worker: tuple[TestClient, Gate], monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    client, gate = one_worker
    path, method, builder, body = INSIGHT[kind]
    insight = client.app.state.service.insight
    built: list[int] = []
    entered: list[int] = []
    answer = getattr(insight, method)

    async def counting_answer(*args: Any, **kwargs: Any) -> Any:
        entered.append(1)  # from here to joining the shared work there is no await
        return await answer(*args, **kwargs)

    monkeypatch.setattr(insight, method, counting_answer)
    original = getattr(bodies, builder)

    def counting(*args: Any, **kwargs: Any) -> Any:
        built.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(bodies, builder, counting)
    _, first = start(client, "/api/attention/compact", {"text": "This one holds the worker."})
    assert gate.held.wait(TIMEOUT)
    asks = [start(client, path, body)[1] for _ in range(4)]
    wait_until(lambda: len(entered) == 4, "all four are in flight, behind the held worker")
    gate.release.set()
    answers = [f.result(TIMEOUT) for f in [first, *asks]]
    assert [a.status for a in answers] == [200] * 5
    assert len({a.body for a in answers[1:]}) == 1
    assert built == [1]


def test_the_flights_forget_finished_and_abandoned_work() -> None:
    flights = service_module.Flights()

    async def scenario() -> None:
        started = asyncio.Event()

        async def slow(abandoned: threading.Event) -> int:
            started.set()
            await asyncio.sleep(10)
            return 1

        waiter = asyncio.ensure_future(flights.join("k", slow))
        await started.wait()
        assert len(flights) == 1
        waiter.cancel()
        await asyncio.sleep(0)
        assert len(flights) == 0

        async def quick(abandoned: threading.Event) -> int:
            return 2

        assert await asyncio.gather(flights.join("k", quick), flights.join("k", quick)) == [2, 2]
        assert len(flights) == 0

    run_async(scenario())
