"""No answer is encoded on the event loop; the largest is streamed, bounded, and stops with its client."""

from __future__ import annotations

import gzip
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
import uvicorn
from fastapi.testclient import TestClient

import app.service.flights as service_module
from app import encoders
from app.main import create_app
from app.service import BATCH_CHARS
from tests import tolerances
from tests.app.asgi import Exchange, post
from tests.app.started import serving

# ~130 tokens on MiniLM: 6·12·130² ≈ 1.2 M values, above STREAM_VALUES, so this answer is streamed.
LONG = " ".join(f"Sentence {i} says something new about cats and dogs." for i in range(12))
SHORT = "The cat sat on the mat."
LONGEST = " ".join(f"Sentence {i} says something new about cats and dogs." for i in range(60))  # > 512


def old_json(body: dict[str, Any]) -> bytes:
    """How /api/attention was encoded before it was streamed: the bytes must not change."""
    attention = np.round(np.array(body["attention"], dtype=np.float64), 6).tolist()
    return json.dumps({**body, "attention": attention}, ensure_ascii=False, separators=(",", ":")).encode()


@pytest.fixture(scope="module")
def app_client(make_settings) -> Iterator[TestClient]:  # type: ignore[no-untyped-def]
    with serving(create_app(make_settings())) as client:
        yield client


def test_a_large_answer_is_streamed_unchanged_and_not_cached_as_bytes(app_client: TestClient, minilm) -> None:  # type: ignore[no-untyped-def]
    service = app_client.app.state.service
    exchange = app_client.portal.call(post, app_client.app, "/api/attention", {"text": LONG})
    assert exchange.status == 200 and exchange.headers["content-type"] == "application/json"
    body = json.loads(exchange.body)
    n = body["n"]
    assert 6 * 12 * n * n > service_module.STREAM_VALUES
    assert len(exchange.chunks) >= len(exchange.body) // service_module.CHUNK_BYTES  # sent as it is built
    assert max(map(len, exchange.chunks)) < 2 * service_module.CHUNK_BYTES
    # Same bytes as the whole-body encoder wrote, and the attention is mha's (exact float32 -> 6 decimals).
    assert exchange.body == old_json(body)
    expected = minilm.attend(LONG).attentions.double()
    # Two float32 forwards (summation order may differ) and the 6-decimal rounding.
    torch.testing.assert_close(
        torch.tensor(body["attention"], dtype=torch.float64), expected, atol=tolerances.FORWARD_JSON, rtol=0
    )
    # The tensor is cached (the next answer needs no forward), the 9 MB of JSON are not.
    keys = {key[0] for key in service.answers.cache.keys()}
    assert "result" in keys and "json" not in keys
    # A small answer is encoded once and cached as bytes.
    small = app_client.post("/api/attention", json={"text": SHORT})
    assert small.content == old_json(small.json())
    assert "json" in {key[0] for key in service.answers.cache.keys()}


ROUTES = [
    ("/api/attention", {"text": SHORT}),
    ("/api/attention", {"text": LONG}),
    ("/api/attention/head", {"text": LONG, "layer": 1, "head": 2}),
    ("/api/analysis", {"text": SHORT}),
    ("/api/rollout", {"text": LONG}),
    ("/api/flow", {"text": SHORT}),
    ("/api/compare", {"a": {"text": SHORT}, "b": {"text": "The dog sat on the mat."}}),
    ("/api/compare/head", {"a": {"text": LONG}, "b": {"text": LONG + " More."}, "layer": 0, "head": 0}),
    ("/api/attention", {"text": SHORT, "words": True}),
    ("/api/attention/compact", {"text": LONG}),
]


@pytest.mark.parametrize(("path", "body"), ROUTES, ids=[f"{p} {len(json.dumps(b))}" for p, b in ROUTES])
def test_no_answer_is_encoded_on_the_event_loop(
    app_client: TestClient, monkeypatch: pytest.MonkeyPatch, path: str, body: dict[str, Any]
) -> None:
    loop_thread = app_client.portal.call(threading.get_ident)
    encoded_on: list[tuple[str, int]] = []
    dumps, fast_block = json.dumps, encoders._fast_block

    def recording_dumps(value: Any, *args: Any, **kwargs: Any) -> str:
        text = dumps(value, *args, **kwargs)
        if len(text) > 1000:  # an answer's numbers, not an error's detail
            encoded_on.append(("json.dumps", threading.get_ident()))
        return text

    def recording_fast_block(*args: Any) -> bytes:
        encoded_on.append(("fast", threading.get_ident()))
        return fast_block(*args)

    decompress = gzip.decompress

    def recording_decompress(data: bytes) -> bytes:
        encoded_on.append(("gzip.decompress", threading.get_ident()))
        return decompress(data)

    monkeypatch.setattr(json, "dumps", recording_dumps)
    monkeypatch.setattr(encoders, "_fast_block", recording_fast_block)
    monkeypatch.setattr(gzip, "decompress", recording_decompress)
    body = {**body, "text": body["text"] + " (uncached)"} if "text" in body else body
    headers = {"Accept-Encoding": "identity"} if "compact" in path else {}  # (unzipped from the cache)
    r = app_client.post(path, json=body, headers=headers)
    assert r.status_code == 200, r.text
    assert encoded_on, "the answer was encoded by app.encoders, in pieces"
    assert all(thread != loop_thread for _, thread in encoded_on), encoded_on


def test_a_streamed_answer_stops_being_encoded_when_its_client_leaves(
    app_client: TestClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    chunks_built: list[int] = []
    next_chunk = service_module._next_chunk

    def counting(parts: Iterator[bytes], size: int) -> bytes:
        chunk = next_chunk(parts, size)
        chunks_built.append(len(chunk))
        return chunk

    monkeypatch.setattr(service_module, "_next_chunk", counting)
    text = LONG + " Read by nobody."
    whole = len(app_client.post("/api/attention", json={"text": text}).content)
    total = len(chunks_built)
    assert total >= 8  # ~9 MB in 1 MiB chunks
    chunks_built.clear()
    with caplog.at_level(logging.INFO, logger="app"):
        exchange = app_client.portal.call(Exchange)
        exchange.hang_up_after_chunks = 2
        app_client.portal.call(post, app_client.app, "/api/attention", {"text": text}, exchange)
    assert len(exchange.body) < whole
    assert len(chunks_built) <= 3  # the two sent, and at most the one in hand when the client left
    assert any("client closed the connection during /api/attention" in r.getMessage() for r in caplog.records)
    # Begun with 200, cut short by its client: 499 in the access log, as an answer abandoned before it began.
    access = [r.getMessage().split()[:3] for r in caplog.records if r.name == "app.access"]
    assert access == [["POST", "'/api/attention'", "499"]]


@pytest.mark.parametrize(
    "second",
    [LONG + " Second.", "cat " * 150],  # a long text waits before its forward; a short one (600 chars,
    ids=["long text", "short text, large answer"],  # 152 tokens) after it, without holding its tensor
)
def test_at_most_max_streams_large_answers_are_streamed_at_once(make_settings, second: str) -> None:  # type: ignore[no-untyped-def]
    app = create_app(make_settings(max_streams=1))
    with serving(app) as client:
        service = app.state.service
        slow = client.portal.call(Exchange)
        slow.pause_after_chunks = 1  # a client that stops reading after the first chunk
        first = client.portal.start_task_soon(post, app, "/api/attention", {"text": LONG}, slow)
        deadline = time.monotonic() + 30
        while not slow.chunks:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        waiting = client.portal.start_task_soon(post, app, "/api/attention", {"text": second})
        while service.attention.streams_waiting != 1:  # its turn comes only when the first stream ends
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert not waiting.done()
        client.portal.call(slow.resume.set)
        assert first.result(30).status == 200 and waiting.result(30).status == 200
        assert json.loads(waiting.result().body)["n"] > 120 and json.loads(slow.body)["n"] > 120
        assert service.attention.streams_waiting == 0


def test_a_long_text_with_a_small_answer_gives_back_its_turn_to_stream(make_settings) -> None:  # type: ignore[no-untyped-def]
    # Over BATCH_CHARS, so it waits for a turn to stream before its forward; on "random" (4 layers x 8
    # heads, ~142 tokens: 32·142² ≈ 0.65 M values, under STREAM_VALUES) its answer is sent whole, and the
    # turn must come back: with max_streams=1 a kept turn would leave every later long text waiting forever.
    texts = ["word " * 140, "other " * 120]
    app = create_app(make_settings(max_streams=1))
    with serving(app) as client:
        service = app.state.service
        for text in texts:
            assert len(text) > BATCH_CHARS
            r = client.post("/api/attention", json={"text": text, "model": "random"})
            assert r.status_code == 200
            assert 4 * 8 * r.json()["n"] ** 2 <= service_module.STREAM_VALUES  # whole, not streamed
            assert not service.attention._stream_slots.locked(), "the turn to stream was not given back"


@pytest.mark.slow
def test_keep_alive_survives_a_large_answer_read_slowly(make_settings) -> None:  # type: ignore[no-untyped-def]
    """uvicorn starts its keep-alive timer when the app has sent the last byte of an answer. Sent whole,
    a 512-token answer (~150 MB) is "sent" at once while the client still reads it for seconds; the timer
    then closes the connection as the client finishes, and a next request on it gets no response and
    leaves no log line (3 of 500 connections under 16 clients at 512 tokens). Streamed, the last chunk
    goes out only once the client has drained all but the socket buffers (a few MB)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    keep_alive = 2  # seconds; the slow read below outlasts it (48 reads of 64 KiB, 0.06 s apart: ~2.9 s)
    config = uvicorn.Config(
        create_app(make_settings()),
        port=port,
        timeout_keep_alive=keep_alive,
        log_level="warning",
        lifespan="on",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
            time.sleep(0.05)
        with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
            started = time.monotonic()
            # The first 3 MB slowly (longer than the keep-alive timeout), then the rest at full speed, and the
            # next request at once: the answer is not decoded, so a busy machine's slow Python cannot
            # stand in for the bug between the last byte and the next request.
            status, _ = _exchange(conn, {"text": LONGEST}, slow_bytes=3 << 20, pause=0.06, decode=False)
            assert status == 200
            assert time.monotonic() - started > keep_alive
            status, body = _exchange(conn, {"text": SHORT})  # the same connection
            assert status == 200 and json.loads(body)["tokens"][0] == "[CLS]"
    finally:
        server.should_exit = True
        thread.join(30)


def _exchange(
    conn: socket.socket, body: dict[str, Any], *, slow_bytes: int = 0, pause: float = 0.0, decode: bool = True
) -> tuple[int | None, bytes]:
    """One keep-alive request; the answer read 64 KiB at a time, the first `slow_bytes` with `pause`
    between reads; decode=False reads it to its end but returns no body."""
    data = json.dumps(body).encode()
    conn.sendall(
        b"POST /api/attention HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    raw = b""
    while b"\r\n\r\n" not in raw:
        chunk = conn.recv(65536)
        if not chunk:
            return None, b""  # closed without a response
        raw += chunk
    head, _, rest = raw.partition(b"\r\n\r\n")
    lines = head.decode().lower().split("\r\n")
    status = int(lines[0].split()[1])
    headers = dict(line.split(": ", 1) for line in lines[1:])
    received = bytearray(rest)
    chunked = headers.get("transfer-encoding") == "chunked"
    while not (
        received.endswith(b"0\r\n\r\n") if chunked else len(received) >= int(headers["content-length"])
    ):
        chunk = conn.recv(65536)
        assert chunk, "connection closed in the middle of an answer"
        received += chunk
        if len(received) < slow_bytes:
            time.sleep(pause)
    if not decode:
        return status, b""
    return status, _unchunk(bytes(received)) if chunked else bytes(received)


def _unchunk(data: bytes) -> bytes:
    out = bytearray()
    at = 0
    while True:
        end = data.index(b"\r\n", at)
        size = int(data[at:end], 16)
        if size == 0:
            return bytes(out)
        out += data[end + 2 : end + 2 + size]
        at = end + 2 + size + 2
