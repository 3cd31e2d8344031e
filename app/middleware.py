"""The HTTP layer's middlewares (pure ASGI), in the order create_app adds them, innermost first: a bug's
500 as JSON, the request body's limits, the Host check, the security headers, the access log. And
`HTTP_ERRORS`: what they answer for any route, before it runs (documented on every operation)."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections.abc import Iterable
from typing import Any

from fastapi.responses import JSONResponse
from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.routes.common import CLIENT_CLOSED
from app.schemas.common import ErrorResponse
from app.settings import normalize_host

logger = logging.getLogger("app")
access_logger = logging.getLogger("app.access")

# Plotly styles its SVG inline, hence 'unsafe-inline' for styles only; scripts come from us alone.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
# Host names that only this machine can put in a Host header: a DNS-rebinding page's Host is its own
# domain, never one of these, so they are always served (loopback IP addresses too, as Jupyter does).
LOCAL_HOSTS = ("localhost",)

# What the middlewares below answer for any route, before it runs (documented on every operation).
HTTP_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "The Host header names a host this server does not serve."},
    408: {
        "model": ErrorResponse,
        "description": "The request body did not arrive in time (connection closed).",
    },
    413: {"model": ErrorResponse, "description": "Request body larger than the service's limit."},
    415: {
        "model": ErrorResponse,
        "description": "A Content-Encoding other than identity: send the body uncompressed.",
    },
}


class HttpMiddleware:
    """A pure ASGI middleware (no body buffering) that sees HTTP requests only: the lifespan, and anything
    else, passes through to the app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan; the app has no websockets
            await self.app(scope, receive, send)
            return
        await self.handle(scope, receive, send)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError


class SecurityHeadersMiddleware(HttpMiddleware):
    """Adds the security headers to every HTTP response."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers.update(SECURITY_HEADERS)
            await send(message)

        await self.app(scope, receive, send_with_headers)


class AccessLogMiddleware(HttpMiddleware):
    """One line per request, once it has ended: method, path and query, status, time, the client's address
    and port, HTTP version (`POST '/api/trace' 499 812.4 ms from 127.0.0.1:53122 HTTP/1.1`): what uvicorn's
    access log wrote, which `headscope serve` turns off (app/server.py). The path is logged with %r so a %0A
    in a URL cannot start a forged line; bodies (the user's text) are never logged. A client that hung up
    before the last byte of its answer is logged as 499 (CLIENT_CLOSED), whatever status the answer began
    with: a stream cut short is not an answer given (uvicorn's own access log has the status it sent at the
    start, and no line at all for an answer that began after the client left)."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        status = 500  # if the app dies before answering, that is what the client sees
        complete = gone = False

        async def receive_watched() -> Message:
            nonlocal gone
            message = await receive()
            gone = gone or message["type"] == "http.disconnect"
            return message

        async def send_status(message: Message) -> None:
            nonlocal status, complete
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                complete = True
            await send(message)

        try:
            await self.app(scope, receive_watched, send_status)
        finally:
            if gone and not complete:
                status = CLIENT_CLOSED
            access_logger.info(
                "%s %r %d %.1f ms from %s HTTP/%s",
                scope["method"][:16],
                _target(scope)[:1000],  # bounds a line (h11 takes heads of up to 16 KiB)
                status,
                1000 * (time.perf_counter() - started),
                _client(scope),
                scope.get("http_version", "1.1"),
            )


def _target(scope: Scope) -> str:
    """The request's path and query, as the client sent them (the path percent-decoded, as routes see it)."""
    query = scope.get("query_string", b"")
    return f"{scope['path']}?{query.decode('latin-1')}" if query else str(scope["path"])


def _client(scope: Scope) -> str:
    """host:port of the client (X-Forwarded-For's when uvicorn trusts the proxy), or - when unknown."""
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "-"


class UnexpectedErrorMiddleware(HttpMiddleware):
    """500 as JSON, inside the security headers, for an exception no handler maps; logged with its
    traceback. Starlette's own answer is plain text from outside every middleware, and uvicorn then closes
    the connection; this keeps a keep-alive connection usable. A failure after the answer has started
    cannot be answered: it propagates, and uvicorn closes the connection."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def send_started(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_started)
        except Exception:
            logger.exception("unhandled error in %s %r", scope["method"][:16], scope["path"][:200])
            if started:
                raise
            detail = "internal server error (a bug: the server log has the details)"
            await _refuse(scope, receive, send, 500, detail)


class AllowedHostsMiddleware(HttpMiddleware):
    """400 (JSON) for a request whose Host header names none of the served hosts.

    A page on another domain can make its name resolve to 127.0.0.1 (DNS rebinding) and then read this
    server's answers from the browser of someone running it locally; its requests still carry its own
    name in Host. So only local names, loopback addresses and configured names are served (as Jupyter's
    host check). Ports are not compared: the name is what a rebinding page cannot fake.
    """

    def __init__(self, app: ASGIApp, *, hosts: Iterable[str]) -> None:
        super().__init__(app)
        names = {normalize_host(host) for host in hosts}
        self.any = "*" in names
        self.names = names | set(LOCAL_HOSTS)
        self.suffixes = tuple(name[1:] for name in names if name.startswith("*."))  # "*.a.org" -> ".a.org"

    def allowed(self, host: str) -> bool:
        name = host_name(host)
        if self.any or name in self.names or (self.suffixes and name.endswith(self.suffixes)):
            return True
        try:
            return ipaddress.ip_address(name).is_loopback
        except ValueError:
            return False

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        host = Headers(scope=scope).get("host")
        if host is not None and self.allowed(host):
            await self.app(scope, receive, send)
            return
        detail = (
            "request has no Host header"
            if host is None
            else f"host {host_name(host)[:100]!r} is not served here; the operator can add it to "
            "HEADSCOPE_ALLOWED_HOSTS"
        )
        await _refuse(scope, receive, send, 400, detail)


def host_name(host: str) -> str:
    """The name part of a Host header ("[::1]:8000" -> "::1", "Example.org:80" -> "example.org")."""
    host = host.strip()
    if host.startswith("["):  # an IPv6 literal: its colons are not the port's
        host = host[: host.find("]") + 1]
    else:
        host = host.partition(":")[0]
    return normalize_host(host)


class RequestBodyMiddleware(HttpMiddleware):
    """Reads the request body once, before any parsing, and refuses what the app cannot take.

    - 415 for a body in a Content-Encoding other than identity (a gzip body is not JSON);
    - 413 for a body over the limit: a declared Content-Length over it is refused without reading a
      byte; otherwise the body is counted as it streams (chunked bodies have no Content-Length);
    - 408 for a body that has not arrived `timeout` seconds after the head (a client that stops half-way
      would otherwise hold its connection and a task as long as it likes); the connection is closed.
    A body within the limit (64 KiB by default) is then replayed to the app. FastAPI's own
    `max_body_size` is not used: it answers a declared oversize in plain text, from outside our
    middleware, so without the security headers. (After a 413 or 415 uvicorn reads and drops the rest
    of the body, so the connection stays usable.)
    """

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, timeout: float) -> None:
        super().__init__(app)
        self.max_body_bytes = max_body_bytes
        self.timeout = timeout

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope=scope)
        encoding = headers.get("content-encoding", "")
        if any(coding.strip().lower() not in ("", "identity") for coding in encoding.split(",")):
            detail = f"Content-Encoding {encoding[:100]!r} is not accepted: send the body uncompressed"
            await _refuse(scope, receive, send, 415, detail, {"Accept-Encoding": "identity"})
            return
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            await self._refuse_size(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                detail = f"request body not received within {self.timeout:g} s"
                await _refuse(scope, receive, send, 408, detail, {"Connection": "close"})
                return
            if message["type"] != "http.request":  # client went away: let the app see it
                replay: list[Message] = [message]
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await self._refuse_size(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]
                break

        async def replay_receive() -> Message:
            return replay.pop() if replay else await receive()

        await self.app(scope, replay_receive, send)

    async def _refuse_size(self, scope: Scope, receive: Receive, send: Send) -> None:
        detail = f"request body is larger than the limit of {self.max_body_bytes} bytes"
        await _refuse(scope, receive, send, 413, detail)


async def _refuse(
    scope: Scope,
    receive: Receive,
    send: Send,
    status: int,
    detail: str,
    headers: dict[str, str] | None = None,
) -> None:
    await JSONResponse({"detail": detail}, status_code=status, headers=headers)(scope, receive, send)
