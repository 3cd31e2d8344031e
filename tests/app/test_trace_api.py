"""Long inputs over HTTP: /api/trace streams a trace's progress and keeps the trace; /api/trace/overview,
/window and /row read it. Values are checked against mha's own trace of the same model, cache reuse and
eviction by counting forwards, cancellation by hanging up mid-forward."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient

import mha
from app import compact
from app.main import create_app
from app.service.traces import trace_bytes_per_token, trace_max_tokens, trace_nbytes, trace_peak_nbytes
from mha.errors import Cancelled
from tests.app.asgi import Exchange, post
from tests.app.counting import Counting
from tests.app.started import serving
from tests.tolerances import ROUND6, U32, quant8

DEFAULT = "all-MiniLM-L6-v2"
TEXT = " ".join(f"Sentence {i} says something new about cats and dogs." for i in range(6))
TIMEOUT = 30  # seconds any wait may take before it counts as a failure


@pytest.fixture
def traced(make_settings) -> Iterator[tuple[TestClient, Counting]]:  # type: ignore[no-untyped-def]
    with serving(create_app(make_settings())) as client:
        yield client, Counting(client.app.state.service.models.registry.loaded(DEFAULT), "trace")


def close(answer: list[Any], expected: torch.Tensor) -> bool:
    """The JSON's 6-decimal values against float32 ones, both in float64 (so nothing else rounds): the
    service and the tests run the same float32 ops on the same shapes in one process (its
    torch.set_num_threads is global), so the weights agree bit for bit and only the rounding is left."""
    return torch.allclose(torch.tensor(answer, dtype=torch.float64), expected.double(), rtol=0, atol=ROUND6)


def lines(response: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in response.text.splitlines()]


def test_the_stream_reports_each_layer_then_the_tokens(traced: tuple[TestClient, Counting], minilm) -> None:  # type: ignore[no-untyped-def]
    client, counting = traced
    response = client.post("/api/trace", json={"text": TEXT})
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/x-ndjson"
    events = lines(response)
    layers = minilm.info.layers
    assert events[:-1] == [{"event": "progress", "layer": i, "layers": layers} for i in range(layers)]
    done = events[-1]
    expected = minilm.trace(TEXT)
    assert done["event"] == "done" and done["model"] == DEFAULT
    assert done["tokens"] == expected.tokens and done["n"] == expected.n
    assert done["segments"] == expected.encoded.segments and done["special"] == expected.encoded.special
    assert done["unknown"] == expected.encoded.unknown
    assert (done["layers"], done["heads"], done["kv_heads"]) == (layers, minilm.info.heads, minilm.info.heads)
    assert done["causal"] is False and done["truncated"] is False and done["byte_level"] is False
    assert done["overview_size"] == min(128, expected.n) and done["stats_available"] is True
    # Asked again: the kept trace, no forward, no progress.
    again = lines(client.post("/api/trace", json={"text": TEXT}))
    assert again == [done] and counting.forwards == 1


def test_the_done_event_says_which_path_the_forward_took(traced: tuple[TestClient, Counting], minilm) -> None:  # type: ignore[no-untyped-def]
    """As mha says: on the CPU a trace that pools its overview (the service's always do) runs in row blocks,
    the cheaper path there (mha.trace.blocked FUSED_CPU_OVERVIEW); MiniLM's fused kernel runs without one."""
    client, _ = traced
    done = lines(client.post("/api/trace", json={"text": TEXT}))[-1]
    assert done["path"] == minilm.trace(TEXT).path == "blocked"
    assert minilm.trace(TEXT, overview_size=None).path == "fused-flash-cpu"


def test_windows_rows_and_the_overview_reuse_one_forward(traced: tuple[TestClient, Counting], minilm) -> None:  # type: ignore[no-untyped-def]
    client, counting = traced
    expected = minilm.trace(TEXT)
    n = expected.n
    # Never traced: the window traces it first, transparently; the rest reuse that trace.
    window = client.post(
        "/api/trace/window", json={"text": TEXT, "layer": 2, "head": 5, "rows": [3, n], "cols": [0, n - 4]}
    ).json()
    exact = expected.window(2, 5, (3, n), (0, n - 4))
    assert window["exact"] is True and window["factor"] == [1, 1] and window["reduce"] == "max"
    assert window["row_edges"] == list(range(3, n + 1)) and window["col_edges"] == list(range(0, n - 3))
    assert close(window["values"], exact.values)

    pooled = client.post(
        "/api/trace/window",
        json={"text": TEXT, "layer": 5, "head": 0, "max_cells": 7, "reduce": "mean"},
    ).json()
    reference = expected.window(5, 0, max_cells=7, reduce="mean")
    assert pooled["exact"] is False and pooled["reduce"] == "mean"
    assert pooled["row_edges"] == reference.row_edges and pooled["factor"] == list(reference.factor)
    assert close(pooled["values"], reference.values)

    row = client.post("/api/trace/row", json={"text": TEXT, "layer": 4, "head": 11, "q": n - 1}).json()
    assert row["q"] == n - 1 and row["n"] == n
    assert close(row["values"], expected.row(4, 11, n - 1))

    for size, reduce in ((128, "max"), (9, "mean")):
        response = client.post(
            "/api/trace/overview",
            params={"scheme": "abs-uint8"},
            json={"text": TEXT, "size": size, "reduce": reduce},
        )
        assert response.status_code == 200
        header, values = compact.decode(response.content)
        reference = expected.overview(size, reduce)  # type: ignore[arg-type]
        edges = reference.row_edges
        assert header["n"] == len(edges) - 1 == min(size, n) and header["input_n"] == n
        assert header["edges"] == edges and header["reduce"] == reduce
        assert header["exact"] == (size >= n)
        first, last = expected.tokens[edges[1]], expected.tokens[edges[2] - 1]
        assert header["tokens"][1] == (first if edges[2] - edges[1] == 1 else f"{first}…{last}")
        # abs-uint8: within half a quantization step of the pooled value (quant8 says why).
        assert torch.allclose(torch.from_numpy(values), reference.values, rtol=0, atol=quant8())
    assert counting.forwards == 1


def test_windows_and_rows_are_gzipped_for_clients_that_accept_it(traced: tuple[TestClient, Counting]) -> None:
    client, _ = traced
    for route, extra in (("/api/trace/window", {}), ("/api/trace/row", {"q": 3})):
        body = {"text": TEXT, "layer": 1, "head": 2, **extra}
        plain = client.post(route, json=body, headers={"Accept-Encoding": "identity"})
        zipped = client.post(route, json=body, headers={"Accept-Encoding": "gzip"})
        assert "content-encoding" not in plain.headers
        assert zipped.headers["content-encoding"] == "gzip" and "Accept-Encoding" in zipped.headers["vary"]
        assert zipped.headers["content-type"] == plain.headers["content-type"] == "application/json"
        assert zipped.json() == plain.json()  # httpx undoes the gzip: the same answer, fewer bytes
        assert int(zipped.headers["content-length"]) < int(plain.headers["content-length"])


def test_an_evicted_trace_is_traced_again_when_next_needed(make_settings) -> None:  # type: ignore[no-untyped-def]
    # Room for one 62-token trace of MiniLM (2.3 MB: trace_nbytes; its forward's peak 3.5 MB:
    # trace_peak_nbytes), not two.
    budget = 4 * 2**20
    settings = make_settings(trace_max_bytes=budget, trace_cache_bytes=budget)
    with serving(create_app(settings)) as client:
        service = client.app.state.service
        counting = Counting(service.models.registry.loaded(DEFAULT), "trace")
        first, second = TEXT, TEXT.replace("cats", "birds")
        body = {"layer": 0, "head": 0, "q": 3}
        before = client.post("/api/trace/row", json={"text": first, **body}).json()
        assert lines(client.post("/api/trace", json={"text": second}))[-1]["event"] == "done"
        assert counting.forwards == 2 and len(service.traces.cache) == 1  # the first was evicted
        assert budget / 2 < service.traces.cache.nbytes <= budget
        after = client.post("/api/trace/row", json={"text": first, **body})
        assert after.status_code == 200 and after.json() == before
        assert counting.forwards == 3
        kept = service.traces.cache.keys()
        assert len(kept) == 1 and kept[0][2] == first


def test_the_limit_follows_from_the_byte_budget(make_settings, minilm) -> None:  # type: ignore[no-untyped-def]
    cfg = minilm.network.config
    # q [H, D] and k [H_kv, D] float32 per layer and token, plus each query's log-sum-exp and each key's
    # value norm per head.
    per_token = cfg.num_layers * (cfg.num_heads + cfg.num_heads) * (cfg.embed_dim // cfg.num_heads) * 4
    per_token += 2 * cfg.num_layers * cfg.num_heads * 4
    assert trace_bytes_per_token(minilm) == per_token == 19_008
    # The limit is the longest input whose forward, the trace and its scratch, fits the budget.
    for budget in (2**20, 3 * 2**20, 2**23, 2**31):
        for threads in (1, 4):
            limit = trace_max_tokens(minilm, budget, threads)
            assert limit == min(512, limit) and trace_peak_nbytes(minilm, limit, threads) <= budget
            assert limit == 512 or trace_peak_nbytes(minilm, limit + 1, threads) > budget
            assert trace_nbytes(minilm, limit) < trace_peak_nbytes(minilm, limit, threads)
    budget = 2**23
    limit = trace_max_tokens(minilm, budget)
    assert 0 < limit < 512
    text = "cat " * 300
    with serving(create_app(make_settings(trace_max_bytes=budget, trace_cache_bytes=budget))) as client:
        entry = next(m for m in client.get("/api/models").json()["models"] if m["name"] == DEFAULT)
        assert entry["trace_max_tokens"] == limit and entry["max_tokens"] == 512
        reads = {
            "/api/trace": {},
            "/api/trace/overview": {"size": 16},
            "/api/trace/row": {"layer": 0, "head": 0, "q": 0},
        }
        for path, read in reads.items():
            response = client.post(path, json={"text": text, **read})
            assert response.status_code == 413, path
            assert response.json()["detail"] == (
                f"input has 302 tokens; model {DEFAULT!r} traces at most {limit} tokens (what a trace of "
                f"HEADSCOPE_TRACE_MAX_BYTES ({budget}) holds); shorten the text"
            )
        # At the limit (with [CLS] and [SEP]): traced, and its trace within the budget.
        at_limit = "cat " * (limit - 2)
        assert lines(client.post("/api/trace", json={"text": at_limit}))[-1]["n"] == limit
        kept = client.app.state.service.traces.cache.get(("trace", DEFAULT, at_limit, None, 0, False))
        assert kept.nbytes <= trace_nbytes(minilm, limit) < budget
        # Over the model's own limit, and within the budget's: 413 naming the model's limit.
        with serving(create_app(make_settings())) as roomy:
            detail = roomy.post("/api/trace", json={"text": "cat " * 600}).json()["detail"]
            assert "traces at most 512 tokens (the model's own limit)" in detail


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ({"layer": 6, "head": 0, "q": 0}, "layer 6 out of range: the model has 6 layers"),
        ({"layer": 0, "head": 12, "q": 0}, "head 12 out of range: the model has 12 heads"),
        ({"layer": 0, "head": 0, "q": 10**4}, "query 10000 out of range: the input has"),
        ({"layer": 0, "head": 0, "rows": [5, 5]}, "rows 5..5 is not a non-empty range within 0.."),
        ({"layer": 0, "head": 0, "cols": [0, 10**4]}, "cols 0..10000 is not a non-empty range within 0.."),
        ({"layer": 0, "head": 0, "reduce": "median"}, "reduce: Input should be 'max' or 'mean'"),
        ({"layer": 0, "head": 0, "max_cells": 513}, "max_cells: Input should be less than or equal to 512"),
        ({"size": 0}, "size: Input should be greater than or equal to 1"),
        ({"layer": 0, "head": 0, "rows": [1]}, "rows.1: Field required"),
        ({"model": "nope"}, "unknown model 'nope'"),
    ],
)
def test_bad_reads_are_refused_clearly(client: TestClient, body: dict[str, Any], detail: str) -> None:
    path = (
        "/api/trace/row"
        if "q" in body
        else "/api/trace/overview"
        if "size" in body or "model" in body
        else "/api/trace/window"
    )
    response = client.post(path, json={"text": TEXT, **body})
    assert response.status_code == (404 if "model" in body else 422), response.text
    assert detail in response.json()["detail"]


def test_a_client_that_hangs_up_stops_the_forward(
    traced: tuple[TestClient, Counting], caplog: pytest.LogCaptureFixture
) -> None:
    client, counting = traced
    service = client.app.state.service
    hung_up = threading.Event()

    def hold_layer_2(layer: int) -> None:
        if layer == 2:  # the forward waits here until the client has gone
            assert hung_up.wait(TIMEOUT)

    counting.before_layer = hold_layer_2
    exchange = client.portal.call(Exchange)
    exchange.hang_up_after_chunks = 2  # layers 0 and 1 started
    with caplog.at_level(logging.INFO, logger="app"):
        client.portal.call(post, client.app, "/api/trace", {"text": TEXT}, exchange)
    hung_up.set()
    assert [json.loads(line)["layer"] for line in exchange.chunks] == [0, 1]
    # Logged as every abandoned request is: the line `watched` writes, and 499 in the access log, though
    # the stream had begun with 200.
    assert exchange.status == 200
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("client closed the connection after") and "'/api/trace'" in m for m in messages)
    assert [m.split()[:3] for m in messages if m.startswith("POST '/api/trace'")] == [
        ["POST", "'/api/trace'", "499"]
    ]
    assert counting.wait_ended(TIMEOUT) == [Cancelled.__name__]  # stopped before layer 2, not run to its end
    assert len(service.traces.cache) == 0
    # Asked again later: traced afresh, whole.
    counting.before_layer = None
    assert lines(client.post("/api/trace", json={"text": TEXT}))[-1]["event"] == "done"
    assert counting.ended == [Cancelled.__name__, "ok"]


def test_a_failure_after_the_stream_began_is_its_last_line(traced: tuple[TestClient, Counting]) -> None:
    client, counting = traced

    def fail_at_layer_3(layer: int) -> None:
        if layer == 3:
            raise RuntimeError("out of memory, say")

    counting.before_layer = fail_at_layer_3
    response = client.post("/api/trace", json={"text": TEXT})
    assert response.status_code == 200
    events = lines(response)
    assert [e["layer"] for e in events[:-1]] == [0, 1, 2]
    assert events[-1] == {"event": "error", "detail": "the trace failed on the server (logged)"}
    # Nothing was kept: the next request traces again.
    counting.before_layer = None
    assert lines(client.post("/api/trace", json={"text": TEXT}))[-1]["event"] == "done"


def test_a_decoder_with_grouped_heads_reads_exactly(make_settings, tiny_checkpoints: dict[str, Path]) -> None:  # type: ignore[no-untyped-def]
    model = mha.load_pretrained(tiny_checkpoints["llama"], device="cpu")
    assert model.info.kv_heads < model.info.heads and model.info.causal
    settings = make_settings(models={"llama": tiny_checkpoints["llama"]})
    with serving(create_app(settings)) as client:
        text = TEXT[:90]  # within the tiny checkpoint's 128 positions (its tokenizer splits finely)
        body = {"text": text, "model": "llama"}
        done = lines(client.post("/api/trace", json=body))[-1]
        expected = model.trace(text)
        assert done["tokens"] == expected.tokens and done["kv_heads"] == model.info.kv_heads
        last = model.info.heads - 1
        window = client.post("/api/trace/window", json={**body, "layer": 1, "head": last}).json()
        exact = expected.window(1, last)
        assert window["exact"] is (expected.n <= 512)
        assert close(window["values"], exact.values)
        values = torch.tensor(window["values"], dtype=torch.float64)
        assert torch.all(values.triu(1) == 0)  # causal: exact zeros above the diagonal
        # Each row of weights sums to 1 up to its n roundings to 6 decimals and float32's n-term sum.
        n = expected.n
        assert torch.allclose(
            values.sum(-1), torch.ones(n, dtype=torch.float64), rtol=0, atol=n * (ROUND6 + 2 * U32)
        )


def held_at(counting: Counting, layer: int) -> tuple[threading.Event, threading.Event]:
    """(reached, release): the next forward waits before `layer` until released."""
    reached, release = threading.Event(), threading.Event()

    def hold(index: int) -> None:
        if index == layer:
            reached.set()
            assert release.wait(TIMEOUT)

    counting.before_layer = hold
    return reached, release


def start(client: TestClient, path: str, body: Any) -> tuple[Exchange, Any]:
    exchange = client.portal.call(Exchange)  # its Event belongs to the app's loop
    return exchange, client.portal.start_task_soon(post, client.app, path, body, exchange)


def test_a_trace_goes_on_for_a_window_that_waits_when_its_streaming_client_leaves(
    traced: tuple[TestClient, Counting],
) -> None:
    client, counting = traced
    flights = client.app.state.service.traces._flights
    reached, release = held_at(counting, 2)
    streaming, streamed = start(client, "/api/trace", {"text": TEXT})
    assert reached.wait(TIMEOUT)
    _, window = start(client, "/api/trace/window", {"text": TEXT, "layer": 0, "head": 0, "max_cells": 4})
    key = ("trace", DEFAULT, TEXT, None, 0, False)
    for _ in range(TIMEOUT * 100):  # until the window has joined the stream's forward
        if client.portal.call(lambda: flights._flights[key].waiters) == 2:
            break
        release.wait(0.01)
    client.portal.call(streaming.gone.set)
    assert streamed.result(TIMEOUT).status == 200  # what it had sent: layers 0 and 1
    release.set()
    answer = window.result(TIMEOUT)
    assert answer.status == 200 and json.loads(answer.body)["factor"][0] > 1
    assert counting.forwards == 1 and counting.ended == ["ok"]


def test_a_long_trace_does_not_hold_up_a_short_request(traced: tuple[TestClient, Counting]) -> None:
    client, counting = traced  # two workers per model (max_concurrency's default)
    reached, release = held_at(counting, 1)
    _, streamed = start(client, "/api/trace", {"text": TEXT})
    assert reached.wait(TIMEOUT)
    try:
        _, short = start(client, "/api/attention", {"text": "The cat sat."})
        assert short.result(TIMEOUT).status == 200  # answered while the trace is still held
    finally:
        release.set()
    assert json.loads(streamed.result(TIMEOUT).chunks[-1])["event"] == "done"


def test_tokens_counts_the_whole_input_without_a_forward(traced: tuple[TestClient, Counting], minilm) -> None:  # type: ignore[no-untyped-def]
    client, counting = traced
    long = "cat " * 600  # past MiniLM's 512: the attention routes would cut it
    for text in (TEXT, long):
        answer = client.post("/api/trace/tokens", json={"text": text, "text_pair": "A dog."})
        assert answer.status_code == 200, answer.text
        want = len(minilm.encoder.encode_batch([(text, "A dog.")], 10**6)[0].ids)
        assert answer.json() == {"model": DEFAULT, "n": want, "max_tokens": 512, "trace_max_tokens": 512}
    assert want > 512 and counting.forwards == 0
    assert client.post("/api/trace/tokens", json={"text": "  "}).status_code == 422
    assert client.post("/api/trace/tokens", json={"text": "a", "model": "nope"}).status_code == 404
