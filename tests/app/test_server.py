"""The server as `headscope serve` runs it, over real sockets: clients that stall, too many connections.

Each server runs in a thread of this process on a free port, built by app.server.uvicorn_config as the CLI
builds it, with short timeouts. A client socket's own timeout (GUARD) only keeps a broken server from
hanging the suite; nothing here measures time.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import uvicorn

from app import cli
from app.main import create_app
from app.server import uvicorn_config
from app.settings import Settings
from tests.app.started import serving

GUARD = 30.0  # seconds a client waits for the server to answer or close


@contextmanager
def running(settings: Settings) -> Iterator[tuple[int, uvicorn.Server]]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    server = uvicorn.Server(uvicorn_config(create_app(settings), settings, host="127.0.0.1", port=port))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.05)
    try:
        yield port, server
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture(scope="module")
def stall_server(make_settings: Callable[..., Settings]) -> Iterator[int]:
    settings = make_settings(default_model="random", header_timeout=0.5, body_timeout=0.5)
    with running(settings) as (port, _server):
        yield port


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (fails if it never does)."""
    sock.settimeout(GUARD)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        pytest.fail(f"the server kept the connection open for {GUARD} s; received {data[:200]!r}")
    return data


def split_response(data: bytes) -> tuple[int, dict[str, str], Any]:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, json.loads(body)


def test_half_a_header_line_gets_408_and_the_connection_closed(stall_server: int) -> None:
    with socket.create_connection(("127.0.0.1", stall_server)) as sock:
        sock.sendall(b"GET /api/health HT")
        status, headers, body = split_response(read_until_closed(sock))
    assert status == 408
    assert headers["connection"] == "close" and headers["x-content-type-options"] == "nosniff"
    assert body == {"detail": "request head not received within 0.5 s"}


def test_a_connection_that_sends_nothing_is_closed(stall_server: int) -> None:
    with socket.create_connection(("127.0.0.1", stall_server)) as sock:
        assert read_until_closed(sock) == b""


def test_after_an_answer_the_next_head_has_the_same_deadline(stall_server: int) -> None:
    with socket.create_connection(("127.0.0.1", stall_server)) as sock:
        sock.sendall(b"GET /api/health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        sock.settimeout(GUARD)
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 ")
        sock.sendall(b"GET /api/health HTTP/1.1\r\nHost: loc")  # then the client stalls
        status, _headers, body = split_response(read_until_closed(sock))
    assert status == 408 and "head" in body["detail"]


def test_a_stalled_body_gets_408_json_and_the_connection_closed(stall_server: int) -> None:
    head = (
        b"POST /api/attention HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", stall_server)) as sock:
        sock.sendall(head + b'{"text": "The cat')  # 17 of the 100 bytes announced
        status, headers, body = split_response(read_until_closed(sock))
    assert status == 408
    assert headers["connection"] == "close" and "content-security-policy" in headers
    assert body == {"detail": "request body not received within 0.5 s"}


def test_a_request_without_host_is_refused(stall_server: int) -> None:
    with socket.create_connection(("127.0.0.1", stall_server)) as sock:
        sock.sendall(b"GET /api/health HTTP/1.0\r\n\r\n")  # HTTP/1.0 may omit Host; no browser does
        status, _headers, body = split_response(read_until_closed(sock))
    assert status == 400 and body == {"detail": "request has no Host header"}


def test_connections_beyond_the_limit_get_503_until_one_closes(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings(default_model="random", max_connections=3)
    with running(settings) as (port, server):
        held = [http.client.HTTPConnection("127.0.0.1", port, timeout=GUARD) for _ in range(2)]
        for connection in held:  # two kept-alive connections, each has been answered
            connection.request("GET", "/api/health")
            assert connection.getresponse().read()
        third = http.client.HTTPConnection("127.0.0.1", port, timeout=GUARD)
        third.request("GET", "/api/health")
        assert third.getresponse().status == 503  # 3 open connections: the limit
        third.close()
        for connection in held:
            connection.close()
        deadline = time.monotonic() + GUARD
        while server.server_state.connections and time.monotonic() < deadline:
            time.sleep(0.05)
        fresh = http.client.HTTPConnection("127.0.0.1", port, timeout=GUARD)
        fresh.request("GET", "/api/health")
        assert fresh.getresponse().status == 200
        fresh.close()


def test_serve_applies_the_settings_and_serves_its_bind_address(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[uvicorn.Config] = []

    class Recorder:
        def __init__(self, config: uvicorn.Config) -> None:
            started.append(config)

        def run(self) -> None:
            pass

    monkeypatch.setattr(uvicorn, "Server", Recorder)
    monkeypatch.setenv("HEADSCOPE_ALLOWED_HOSTS", '["configured.example"]')
    monkeypatch.setenv("HEADSCOPE_HEADER_TIMEOUT", "7")
    monkeypatch.setenv("HEADSCOPE_MAX_CONNECTIONS", "9")
    monkeypatch.setenv("HEADSCOPE_DEFAULT_MODEL", "random")
    monkeypatch.setenv("HEADSCOPE_DEVICE", "cpu")
    monkeypatch.setenv("HEADSCOPE_LOG_LEVEL", "debug")
    cli.main(["serve", "--host", "Box.Internal", "--port", "8123", "--log-level", "Warning"])
    (config,) = started
    assert (config.host, config.port, config.limit_concurrency) == ("Box.Internal", 8123, 9)
    assert config.http.header_timeout == 7  # type: ignore[union-attr]
    # One log at one level (the flag overrides the environment), uvicorn's lines in it, its access log off.
    assert (config.log_level, config.log_config, config.access_log) == ("WARNING", None, False)

    with serving(config.app) as client:
        for host, status in [("box.internal", 200), ("configured.example", 200), ("other.example", 400)]:
            assert client.get("/api/health", headers={"Host": host}).status_code == status, host
