"""Every trace alive and every trace's forward in flight are counted against one budget (TraceBudget):
HEADSCOPE_TRACE_CACHE_BYTES + HEADSCOPE_MAX_CONCURRENCY x HEADSCOPE_TRACE_MAX_BYTES, the memory row for
traces in docs/memory-and-load.md. A forward that would pass it waits; traces the cache dropped still count
while something holds them."""

from __future__ import annotations

import asyncio
import gc
import json
import time

import pytest
from fastapi.testclient import TestClient

import app.service.trim as trim_module
from app.main import create_app
from app.service.trace_budget import TraceBudget
from app.service.traces import trace_peak_nbytes
from mha.trace.windows import Trace
from tests.app.asgi import Exchange, post, run_async
from tests.app.started import serving
from tests.app.test_cancellation import wait_until

DEFAULT = "all-MiniLM-L6-v2"
TIMEOUT = 30  # seconds any wait may take before it counts as a failure
MiB = 2**20


class Kept:
    """Stands in for a trace: something with nbytes that can be freed."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


def test_a_reservation_waits_until_it_fits() -> None:
    async def scenario() -> None:
        freed: list[int] = []  # what was counted each time the budget reported bytes given back
        budget = TraceBudget(10, freed=lambda: freed.append(budget.counted))
        await budget.reserve(6)
        later = asyncio.ensure_future(budget.reserve(6))  # 12 > 10: waits
        await asyncio.sleep(0)
        assert not later.done() and budget.counted == 6
        budget.release(6)
        await asyncio.wait_for(later, TIMEOUT)
        assert budget.counted == 6 and freed == [0]  # reported on the loop, then the waiter took the room
        # A waiter that gives up leaves nothing counted.
        gone = asyncio.ensure_future(budget.reserve(5))
        await asyncio.sleep(0)
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert budget.counted == 6
        # With nothing counted, even a reservation past the limit is admitted: it cannot wait for ever.
        budget.release(6)
        await asyncio.wait_for(budget.reserve(11), TIMEOUT)
        assert budget.counted == 11

    run_async(scenario())


def test_a_kept_trace_counts_until_it_is_freed() -> None:
    async def scenario() -> None:
        budget = TraceBudget(10)
        trace = Kept(7)
        budget.keep(trace)  # type: ignore[arg-type]
        assert budget.counted == 7
        waiting = asyncio.ensure_future(budget.reserve(5))
        await asyncio.sleep(0)
        assert not waiting.done()
        del trace
        gc.collect()  # (CPython frees it at once; a collection makes the test independent of that)
        await asyncio.wait_for(waiting, TIMEOUT)
        assert budget.counted == 5

    run_async(scenario())


def trace_of(client: TestClient, text: str) -> Trace:
    """Trace `text` through the API and take the kept trace from the cache (as a reader would hold it)."""
    done = json.loads(client.post("/api/trace", json={"text": text}).text.splitlines()[-1])
    assert done["event"] == "done", done
    kept = client.app.state.service.traces.cache.get(("trace", DEFAULT, text, None, 0, False))
    assert isinstance(kept, Trace)
    return kept


def test_traces_held_past_the_cache_hold_back_a_new_forward(make_settings) -> None:  # type: ignore[no-untyped-def]
    """4 MiB a trace, 4 MiB of cache and one worker: 8 MiB for all traces. A 62-token MiniLM trace keeps 2.3
    MB and peaks at 3.5 MB while computed: with three alive (6.9 MB; the cache keeps one, something holds
    the other two) a fourth's forward (3.5 MB more) waits, and starts once one of them is freed; with one
    waiting (max_queue), a fifth gets 503."""
    settings = make_settings(
        trace_max_bytes=4 * MiB, trace_cache_bytes=4 * MiB, max_concurrency=1, max_queue=1
    )
    texts = [
        " ".join(f"Sentence {i} says something new about {animal} and dogs." for i in range(6))
        for animal in ("cats", "birds", "fish", "cows")
    ]
    with serving(create_app(settings)) as client:
        service = client.app.state.service
        budget = service.traces.budget
        model = service.models.registry.loaded(DEFAULT)
        assert budget.limit == 8 * MiB
        held = [trace_of(client, text) for text in texts[:3]]
        assert [t.n for t in held] == [62] * 3
        assert len(service.traces.cache) == 1  # the cache dropped the first two; this test holds them
        wait_until(lambda: budget.counted == sum(t.nbytes for t in held), "the forwards' reservations end")
        need = trace_peak_nbytes(model, held[0].n)
        assert budget.counted + need > budget.limit >= budget.counted - held[0].nbytes + need
        exchange = client.portal.call(Exchange)
        fourth = client.portal.start_task_soon(post, client.app, "/api/trace", {"text": texts[3]}, exchange)
        wait_until(lambda: budget.waiting == 1, "the fourth forward waits for room")
        assert not exchange.chunks  # no layer has started
        # As many wait as a model's queue takes (HEADSCOPE_MAX_QUEUE): the next is told to come back.
        busy = client.post("/api/trace/row", json={"text": "Another text.", "layer": 0, "head": 0, "q": 0})
        assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
        assert "1 traces already wait for memory" in busy.json()["detail"]
        del held[0]
        gc.collect()
        answer = fourth.result(TIMEOUT)
        assert answer.status == 200 and json.loads(answer.chunks[-1])["event"] == "done"
        del held[:]
        gc.collect()
        # Once the forward is done and the readers gone, only what the cache keeps is counted.
        wait_until(lambda: budget.counted == service.traces.cache.nbytes, "the fourth's reservation ends")


def test_the_service_trims_once_idle_after_a_trace(make_settings, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """A trace's forward frees its scratch, an evicted trace its buffer: the C heap is trimmed after, as
    after a large answer (app/service/trim.py), once the service is idle."""
    trims: list[float] = []
    monkeypatch.setattr(trim_module.memory, "trim", lambda: trims.append(time.monotonic()) or True)
    monkeypatch.setattr(trim_module, "IDLE_TRIM_SECONDS", 0.05)
    monkeypatch.setattr(trim_module, "TRIM_INTERVAL", 3600.0)  # only the idle trim in this test
    monkeypatch.setattr(trim_module, "LARGE_BYTES", 10**15)  # no answer counts as large: only the trace
    with serving(create_app(make_settings())) as client:
        trace_of(client, "A trace, and then the memory its forward used goes back.")
        wait_until(lambda: bool(trims), "the idle trim after the trace")
