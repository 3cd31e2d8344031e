"""The ASGI application: `uvicorn app.main:app`, or `headscope serve` (app/cli.py), which adds what only the
server can do (app/server.py)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.staticfiles import StaticFiles

from app.errors import install_handlers
from app.middleware import (
    HTTP_ERRORS,
    AccessLogMiddleware,
    AllowedHostsMiddleware,
    RequestBodyMiddleware,
    SecurityHeadersMiddleware,
    UnexpectedErrorMiddleware,
)
from app.package_data import STATIC, package_dir
from app.routes import api, corpus, effects, insight, pages, probe, snapshot, trace
from app.schemas.common import bound_new_tokens, enumerate_model_names
from app.service import AttentionService
from app.settings import Settings, get_settings
from app.snapshot.served import ServedSnapshots

STATIC_DIR = package_dir(STATIC)  # the installed package's own (app/package_data.py)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    service = AttentionService(settings)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await service.start()  # at once: the checks and the default model's load go on in the background
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
        responses=HTTP_ERRORS,
    )
    app.state.service = service
    app.state.snapshots = ServedSnapshots(service)  # the page's "Save as HTML", made with its parts
    app.dependency_overrides[get_settings] = lambda: settings
    install_handlers(app)

    app.include_router(api.router)
    app.include_router(insight.router)
    app.include_router(effects.router)
    app.include_router(probe.router)
    app.include_router(trace.router)
    app.include_router(snapshot.router)
    app.include_router(corpus.router)
    app.include_router(pages.router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = enumerate_model_names(FastAPI.openapi(app), service.models.names)
            app.openapi_schema = bound_new_tokens(document, settings.max_new_tokens)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Content-Type"],
        )
    app.add_middleware(UnexpectedErrorMiddleware)
    app.add_middleware(
        RequestBodyMiddleware, max_body_bytes=settings.max_body_bytes, timeout=settings.body_timeout
    )
    # Before the body is read: a request from a foreign Host gets nothing else.
    app.add_middleware(AllowedHostsMiddleware, hosts=settings.allowed_hosts)
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
