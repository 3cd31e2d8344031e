"""How `headscope serve` runs the app under uvicorn: the settings that only the server can apply.

uvicorn closes an idle keep-alive connection after `timeout_keep_alive`, but it has no timeout for the
request head itself: a client that opens a connection and sends nothing, or half a header line, holds it
(and a slot of `limit_concurrency`) for as long as it likes. `HeaderTimeoutProtocol` adds that deadline to
uvicorn's h11 protocol; the body has its own, in the ASGI layer (app.main.RequestBodyMiddleware), and
`max_connections` becomes uvicorn's `limit_concurrency`.

The log is one stream, stderr, at `settings.log_level`: the root handler create_app installs, which uvicorn's
own loggers reach too (its log_config is not applied). uvicorn's access log is off: it writes a line as the
headers go out, so a stream its client left is 200 there, and an answer begun after the client left has no
line. The app's access log (app.access, app.middleware.AccessLogMiddleware) says what each client got.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import h11
import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol

from app.middleware import SECURITY_HEADERS
from app.settings import Settings


class HeaderTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request head.

    The clock starts when the server begins to wait for a head (the connection opens, or the previous
    response is sent) and stops when the head is complete. If it runs out, a client that sent part of a
    head gets 408 and the connection is closed; one that sent nothing is closed silently, as uvicorn
    closes an idle keep-alive connection.
    """

    header_timeout: float = 10.0  # seconds; set per server by `protocol_class`

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._watch_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        # Every byte received and every finished response passes here (on_response_complete calls it
        # once the connection is ready for the next request).
        super().handle_events()
        self._watch_head()

    def _watch_head(self) -> None:
        waiting = self.conn.their_state is h11.IDLE and not self.transport.is_closing()
        if waiting and self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)
        elif not waiting:
            self._stop_head_timer()

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        received, _closed = self.conn.trailing_data
        if received:
            # h11 cannot answer a request it has not seen, so the 408 is written as bytes.
            detail = f"request head not received within {self.header_timeout:g} s"
            self.logger.warning("%s: %s; closing the connection", _peer(self.client), detail)
            self.transport.write(_raw_response(408, "Request Timeout", {"detail": detail}))
        self.transport.close()


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "client"


def _raw_response(status: int, reason: str, body: dict[str, str]) -> bytes:
    content = json.dumps(body).encode()
    headers = {
        "Content-Type": "application/json",
        "Content-Length": str(len(content)),
        "Connection": "close",
        **SECURITY_HEADERS,
    }
    head = f"HTTP/1.1 {status} {reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return head.encode("latin-1") + b"\r\n" + content


def protocol_class(seconds: float) -> type[HeaderTimeoutProtocol]:
    """The protocol uvicorn instantiates per connection, with this server's header timeout."""

    class ServerProtocol(HeaderTimeoutProtocol):
        header_timeout = seconds

    return ServerProtocol


def uvicorn_config(app: FastAPI, settings: Settings, *, host: str, port: int) -> uvicorn.Config:
    """uvicorn's settings for `app` (built by create_app with these `settings`)."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,  # uvicorn's lines propagate to the root handler, in our format (module docstring)
        log_level=settings.log_level,
        access_log=False,  # app.access is the access log
        http=protocol_class(settings.header_timeout),
        limit_concurrency=settings.max_connections,
    )
