"""The service's one access log, as `headscope serve` writes it: a real server in a subprocess, real sockets.

uvicorn's own access log is off (app/server.py): it wrote 200 for a stream as its headers went out, and
nothing for an answer begun after its client left. What is left is app.access, on stderr at INFO with the
defaults: one line per request once it has ended, with the client's address, and 499 for a client that hung
up before the last byte. The server runs a tiny random Llama with 8,192 positions (tests/checkpoints.py),
so a trace of a few thousand tokens takes long enough to hang up in the middle of it. Nothing here measures
time: GUARD only keeps a broken server from hanging the suite.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from checkpoints import build_long_llama

from benchmarks.launch import free_port, stop, wait_up

ROOT = Path(__file__).resolve().parents[2]
MODEL = "llama-long"
GUARD = 120.0  # seconds to wait for the server to start, answer or log
SENTENCE = "The cat sat on the mat. "
# ~4,200 tokens: the trace's forward runs for about a second after its first progress line (here, 1.1 s in
# all), so the client's hang-up, microseconds after that line, reaches the server while the stream goes on.
TRACE_TEXT = SENTENCE * 600
# Past the 512-token cap: every head is 4 layers x 4 heads x 512 x 512 values (~4 M), streamed as ~21 MB of
# JSON; the client's receive buffer (RECEIVE_BUFFER) and the server's send buffer (at most 4 MiB, Linux's
# tcp_wmem) hold a fraction of it, so the answer cannot end while the client reads nothing.
ATTENTION_TEXT = SENTENCE * 100
RECEIVE_BUFFER = 64 * 1024
CLIENT_CLOSED = "client closed the connection"


@dataclass(frozen=True)
class Served:
    port: int
    stdout: Path
    stderr: Path

    def log(self) -> str:
        """stdout and stderr as written so far."""
        return self.stdout.read_text(errors="replace") + self.stderr.read_text(errors="replace")

    def stderr_size(self) -> int:
        return self.stderr.stat().st_size


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("access-log")
    model = build_long_llama(root / MODEL, layers=4)
    # No HEADSCOPE_* from the developer's environment: the log level is the default one.
    env = {name: value for name, value in os.environ.items() if not name.startswith("HEADSCOPE_")}
    env |= {
        "HEADSCOPE_MODELS": json.dumps({MODEL: str(model)}),
        "HEADSCOPE_DEFAULT_MODEL": MODEL,
        "HEADSCOPE_RANDOM_MODEL": "false",
        "HEADSCOPE_BUNDLED_LLM": "false",  # one model, the one the requests name
        "HEADSCOPE_DEVICE": "cpu",
        "HEADSCOPE_THREADS": "1",
    }
    port = free_port()
    served = Served(port, root / "stdout.log", root / "stderr.log")
    # `python -m app.cli` is the `headscope` script (pyproject's [project.scripts]) without the venv's bin/.
    command = [sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    with served.stdout.open("wb") as out, served.stderr.open("wb") as err:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=err)
    try:
        try:
            wait_up(process, f"http://127.0.0.1:{port}", start_s=GUARD, poll_s=0.2)
        except RuntimeError as error:
            pytest.fail(f"headscope serve did not start ({error}):\n{served.log()}")
        yield served
    finally:
        stop(process, timeout=30)


def connect(served: Served, *, receive_buffer: int | None = None) -> tuple[socket.socket, int]:
    """A client socket to the server and its own port (which its access line names)."""
    sock = socket.socket()
    if receive_buffer is not None:  # set before connecting, so the TCP window never grows past it
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.settimeout(GUARD)
    sock.connect(("127.0.0.1", served.port))
    return sock, int(sock.getsockname()[1])


def post(sock: socket.socket, path: str, body: dict[str, object]) -> None:
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    sock.sendall(head.encode() + data)


def receive_until(sock: socket.socket, done: Callable[[bytes], bool]) -> bytes:
    data = b""
    while not done(data):
        chunk = sock.recv(65536)
        if not chunk:
            pytest.fail(f"the server closed the connection; received {data[:300]!r}")
        data += chunk
    return data


def access_lines(text: str, client: int) -> list[str]:
    """Every line that names this client's address and port (any access line, uvicorn's or ours)."""
    return [line for line in text.splitlines() if f"127.0.0.1:{client}" in line]


def wait_for_log(served: Served, since: int, access: re.Pattern[str], *, closed: bool = False) -> list[str]:
    """The stderr lines written after byte `since`, once one matches `access` (and, if `closed`, one says
    the client closed the connection)."""
    deadline = time.monotonic() + GUARD
    while True:
        with served.stderr.open("rb") as err:
            err.seek(since)
            lines = err.read().decode(errors="replace").splitlines()
        said_closed = any(CLIENT_CLOSED in line for line in lines)
        if any(access.match(line) for line in lines) and (said_closed or not closed):
            return lines
        if time.monotonic() > deadline:
            pytest.fail(f"not logged within {GUARD:g} s; stderr since the request:\n" + "\n".join(lines))
        time.sleep(0.05)


def access_line(method: str, target: str, status: int, client: int) -> re.Pattern[str]:
    """app.access's line at INFO, as the default format writes it."""
    return re.compile(
        rf"^\S+ \S+ INFO app\.access: {method} {re.escape(repr(target))} {status} \d+\.\d ms "
        rf"from 127\.0\.0\.1:{client} HTTP/1\.1$"
    )


def assert_one_access_line(served: Served, lines: list[str], pattern: re.Pattern[str], client: int) -> None:
    mine = access_lines("\n".join(lines), client)
    assert len(mine) == 1 and pattern.match(mine[0]), mine
    # Nothing else, on either stream, names the request: uvicorn's own access line (on stdout) is gone.
    assert access_lines(served.log(), client) == mine


def assert_left_by_client(served: Served, since: int, path: str, client: int, words: str) -> None:
    """The POST to `path` that `client` left is one 499 access line, and one client-closed line naming
    `words`."""
    pattern = access_line("POST", path, 499, client)
    lines = wait_for_log(served, since, pattern, closed=True)
    assert_one_access_line(served, lines, pattern, client)
    closed = [line for line in lines if CLIENT_CLOSED in line]
    assert len(closed) == 1 and words in closed[0], lines


def test_an_answered_request_is_one_line_with_its_client(served: Served) -> None:
    since = served.stderr_size()
    connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=GUARD)
    connection.connect()
    assert connection.sock is not None
    client = int(connection.sock.getsockname()[1])
    connection.request("GET", "/api/health?from=test")
    response = connection.getresponse()
    assert response.status == 200 and json.load(response)["status"] == "ok"
    connection.close()
    pattern = access_line("GET", "/api/health?from=test", 200, client)
    lines = wait_for_log(served, since, pattern)
    assert_one_access_line(served, lines, pattern, client)


def test_a_trace_stream_left_by_its_client_is_499_with_the_client_closed_line(served: Served) -> None:
    since = served.stderr_size()
    sock, client = connect(served)
    with sock:
        post(sock, "/api/trace", {"text": TRACE_TEXT})
        received = receive_until(sock, lambda data: b'"event":"progress"' in data)
    assert received.startswith(b"HTTP/1.1 200 ")  # the stream had begun: its status was sent as 200
    assert b'"event":"done"' not in received
    assert_left_by_client(served, since, "/api/trace", client, "before its answer to POST '/api/trace'")


def test_an_attention_answer_left_mid_stream_is_499_with_the_client_closed_line(served: Served) -> None:
    since = served.stderr_size()
    sock, client = connect(served, receive_buffer=RECEIVE_BUFFER)
    with sock:
        post(sock, "/api/attention", {"text": ATTENTION_TEXT})
        received = receive_until(sock, lambda data: len(data.partition(b"\r\n\r\n")[2]) >= 65536)
    head = received.partition(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"http/1.1 200 ") and b"transfer-encoding: chunked" in head  # streamed
    assert_left_by_client(served, since, "/api/attention", client, "during /api/attention")


def test_the_whole_log_is_on_stderr_in_one_format(served: Served) -> None:
    # uvicorn's own lines reach the root handler the app installs; its access log (stdout) is off.
    assert served.stdout.read_text() == ""
    startup = r"^\S+ \S+ INFO uvicorn\.error: Application startup complete\.$"
    assert re.search(startup, served.stderr.read_text(), re.MULTILINE)
