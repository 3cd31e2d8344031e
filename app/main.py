"""The ASGI application: `uvicorn app.main:app`."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import install_handlers
from app.routes import api, insight, pages
from app.service import AttentionService
from app.settings import Settings, get_settings

logger = logging.getLogger("app")
access_logger = logging.getLogger("app.access")

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"

# Plotly styles its SVG inline, hence 'unsafe-inline' for styles only; scripts come from us alone.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)


class SecurityHeadersMiddleware:
    """Adds the security headers to every HTTP response (pure ASGI: no body buffering)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers["Content-Security-Policy"] = CSP
                headers["X-Content-Type-Options"] = "nosniff"
                headers["Referrer-Policy"] = "no-referrer"
                headers["X-Frame-Options"] = "DENY"
            await send(message)

        await self.app(scope, receive, send_with_headers)


class AccessLogMiddleware:
    """One line per request: method, path, status, time. The path is logged with %r so a %0A in a URL
    cannot start a forged line; bodies (the user's text) are never logged."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # if the app dies before answering, that is what the client sees

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            access_logger.info(
                "%s %r %d %.1f ms",
                scope["method"][:16],
                scope["path"][:200],
                status,
                1000 * (time.perf_counter() - started),
            )


class BodyLimitMiddleware:
    """413 (JSON) for a request body over the limit, decided before any parsing.

    A declared Content-Length over the limit is refused without reading a byte; otherwise the body is
    read here, counting as it streams (chunked bodies have no Content-Length), and refused as soon as it
    passes the limit. A body within the limit (64 KiB by default) is then replayed to the app.
    FastAPI's own `max_body_size` is not used: it answers a declared oversize in plain text, from
    outside our middleware, so without the security headers.
    """

    def __init__(self, app: ASGIApp, *, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            await self._refuse(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # client went away: let the app see it
                replay: list[Message] = [message]
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await self._refuse(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]
                break

        async def replay_receive() -> Message:
            return replay.pop() if replay else await receive()

        await self.app(scope, replay_receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        detail = f"request body is larger than the limit of {self.max_body_bytes} bytes"
        await JSONResponse({"detail": detail}, status_code=413)(scope, receive, send)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    service = AttentionService(settings)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await service.start()
        yield
        service.stop()

    app = FastAPI(
        title="headscope",
        version="0.1.0",
        description="What every attention head of a transformer looks at: per-head attention matrices "
        "from our own MultiHeadAttention running real pretrained weights.",
        lifespan=lifespan,
        # /docs is ours (app/routes/pages.py): Swagger UI from our own server, not FastAPI's CDN page.
        docs_url=None,
        redoc_url=None,
    )
    app.state.service = service
    app.dependency_overrides[get_settings] = lambda: settings
    install_handlers(app)

    app.include_router(api.router)
    app.include_router(insight.router)
    app.include_router(pages.router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Content-Type"],
        )
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=settings.max_body_bytes)
    app.add_middleware(SecurityHeadersMiddleware)
    app.add_middleware(AccessLogMiddleware)
    return app


def __getattr__(name: str) -> FastAPI:
    # `uvicorn app.main:app` builds the app on first access, so importing this module (tests, the CLI)
    # reads no environment and loads no model.
    if name == "app":
        application = create_app()
        globals()["app"] = application
        return application
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
