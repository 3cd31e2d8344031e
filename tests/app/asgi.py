"""Calling the app as the server would, with a client that can hang up: for disconnect tests; and
`run_async`, for a test that runs a coroutine of the service."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from starlette.types import ASGIApp, Message


def run_async(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """asyncio.run(coroutine) in a thread of its own: after a browser test in the same process,
    Playwright's sync API leaves an event loop running in this one, where asyncio.run refuses to start."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


@dataclass
class Exchange:
    """One request's answer as the app sent it; `gone` hangs the client up (set it on the app's loop)."""

    gone: asyncio.Event = field(default_factory=asyncio.Event)
    messages: list[Message] = field(default_factory=list)
    hang_up_after_chunks: int | None = None
    # A slow reader: after this many chunks, send() waits until `resume` is set.
    pause_after_chunks: int | None = None
    resume: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def status(self) -> int | None:
        starts = [m for m in self.messages if m["type"] == "http.response.start"]
        return starts[0]["status"] if starts else None

    @property
    def headers(self) -> dict[str, str]:
        start = next(m for m in self.messages if m["type"] == "http.response.start")
        return {k.decode(): v.decode() for k, v in start["headers"]}

    @property
    def chunks(self) -> list[bytes]:
        return [m["body"] for m in self.messages if m["type"] == "http.response.body" and m.get("body")]

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)


async def post(app: ASGIApp, path: str, body: Any, exchange: Exchange | None = None) -> Exchange:
    """POST `body` as JSON; after the request body, receive() blocks until `exchange.gone` is set."""
    exchange = exchange or Exchange()
    data = json.dumps(body).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},  # as uvicorn: disconnects come via receive()
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"localhost"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(data)).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("localhost", 80),
    }
    body_sent = False

    async def receive() -> Message:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": data, "more_body": False}
        await exchange.gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        # Kept even after the client has gone (uvicorn would drop it): tests look at what the app sent.
        exchange.messages.append(message)
        limit = exchange.hang_up_after_chunks
        if limit is not None and len(exchange.chunks) >= limit:
            exchange.gone.set()
        pause = exchange.pause_after_chunks
        if pause is not None and len(exchange.chunks) >= pause:
            await exchange.resume.wait()
        await asyncio.sleep(0)

    await app(scope, receive, send)
    return exchange
