"""What the API routers share: documented errors, the compact transport's query and answer, JSON answers
whole or streamed, the one NDJSON progress stream, and dropping the work of a client that hung up."""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from enum import Enum
from functools import partial
from typing import Annotated, Any, Literal, TypeVar

import anyio
from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from starlette.requests import ClientDisconnect
from starlette.responses import ContentStream
from starlette.types import Receive, Scope, Send

from app import compact
from app.schemas.common import ErrorResponse

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

ERRORS: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorResponse, "description": "Unknown model; the detail lists the registered names."},
    413: {"model": ErrorResponse, "description": "Request body larger than the service's limit."},
    422: {"model": ErrorResponse, "description": "Invalid input: blank text, wrong types, malformed JSON."},
    503: {
        "model": ErrorResponse,
        "description": "The named model failed to load (it is tried again after a back-off), or too many "
        "requests wait for it (with a Retry-After header).",
    },
}
NDJSON = "application/x-ndjson"
# The responses of a route answering a progress stream (ndjson_stream).
NDJSON_RESPONSES: dict[int | str, dict[str, Any]] = {200: {"content": {NDJSON: {}}}, **ERRORS}
# The responses of a route answering in the compact binary transport (HSA1).
COMPACT_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": {compact.MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}}},
    **ERRORS,
}

TRUNCATION = (
    " Text longer than the model takes (or than the service's `max_tokens`) is cut to that many tokens and "
    'the answer says `"truncated": true`.'
)

Scheme = Annotated[
    Literal["row-max-uint8", "abs-uint8", "abs-uint8-key-major"],
    Query(
        description="row-max-uint8: scale = row maximum (contrast); abs-uint8: scale = 1 (fewer bytes); "
        "abs-uint8-key-major: abs-uint8 with q stored [layer][head][key][query] (fewer still)."
    ),
]

Bits = Annotated[
    Literal["auto", "2", "3", "4", "5", "6", "7", "8"],
    Query(
        description="The bits of each quantized value: q takes 2**bits - 1 levels, within "
        "1/(2·(2**bits - 1)) of the model's (1/510 at 8). auto (the page's first view): 8 from 128 tokens, "
        "7 from 88, 6 from 64, 8 below 64, so that every head fits the first view's 0.3 bytes a value."
    ),
]


class ApiRouter(APIRouter):
    """A router under /api whose JSON operations document the errors every one can answer."""

    def __init__(self, *, tags: list[str | Enum]) -> None:
        super().__init__(prefix="/api", tags=tags)

    def post_json(
        self, path: str, response_model: type[BaseModel], summary: str | None = None
    ) -> Callable[[F], F]:
        """POST `path`, answering `response_model` as JSON, with the documented ERRORS."""
        return self.post(path, response_model=response_model, responses=ERRORS, summary=summary)

    def post_compact(
        self, path: str, *, summary: str | None = None, description: str | None = None
    ) -> Callable[[F], F]:
        """POST `path`, answering the compact binary transport (HSA1), with the documented ERRORS."""
        return self.post(
            path,
            response_class=Response,
            responses=COMPACT_RESPONSES,
            summary=summary,
            description=description,
        )

    def post_ndjson(
        self,
        path: str,
        *,
        description: str,
        summary: str | None = None,
        responses: dict[int | str, dict[str, Any]] | None = None,
    ) -> Callable[[F], F]:
        """POST `path`, answering a progress stream (ndjson_stream), with the documented ERRORS and
        `responses` besides."""
        return self.post(
            path,
            response_class=ClosingStreamingResponse,
            responses={**NDJSON_RESPONSES, **(responses or {})},
            summary=summary,
            description=description,
        )


def described(*notes: str, **values: object) -> Callable[[F], F]:
    """Make an endpoint's docstring its OpenAPI description (as FastAPI reads it): lines of a paragraph
    joined, `{name}` fields filled from `values` (so a limit is quoted from its constant), then the shared
    `notes` appended."""

    def describe(endpoint: F) -> F:
        text = re.sub(r"(?<!\n)\n(?!\n)", " ", inspect.cleandoc(endpoint.__doc__ or ""))
        endpoint.__doc__ = text.format(**values) + "".join(notes)
        return endpoint

    return describe


# Answered (to nobody) when the client hung up before its answer: nginx's "client closed request", so the
# access log says what happened.
CLIENT_CLOSED = 499


async def watched(request: Request, work: Awaitable[Response]) -> Response:
    """The work's answer, unless the client hangs up first: then the work is cancelled (a computation
    that other clients share goes on for them) and the disconnect logged. The body has been read by now,
    so the next ASGI message can only be http.disconnect."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    started = time.perf_counter()
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this handler itself cancelled (shutdown): leave nothing running
        gone.cancel()
        task.cancel()
        raise
    gone.cancel()
    if task.done():
        return task.result()  # its answer, or its error for the exception handlers
    task.cancel()
    try:
        await task  # let it unwind: a shared computation learns it has one waiter less
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
    client_closed(request, started)
    return Response(status_code=CLIENT_CLOSED)


def client_closed(request: Request, started: float) -> None:
    """Log a client that hung up before its whole answer (`started`: time.perf_counter() when the route
    began). The access log says 499 for it (app.middleware.AccessLogMiddleware)."""
    logger.info(
        "client closed the connection after %.0f ms, before its answer to %s %r; its work stopped",
        1000 * (time.perf_counter() - started),
        request.method,
        request.url.path[:200],
    )


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


class ClosingStreamingResponse(StreamingResponse):
    """Closes its iterator however the response ends: Starlette leaves one abandoned by a client that hung
    up (cancelled while sending) to the garbage collector, and the encoder behind it would stop, log and
    free its memory only then. `hung_up`, if given, is called when the client left before the last chunk
    (a route logs it with `client_closed`, as `watched` does)."""

    def __init__(
        self,
        content: ContentStream,
        status_code: int = 200,  # (FastAPI reads the default status from this signature, for OpenAPI)
        headers: Mapping[str, str] | None = None,
        media_type: str | None = None,
        *,
        hung_up: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(content, status_code, headers, media_type)
        self.hung_up = hung_up
        self.finished = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except ClientDisconnect:  # servers of ASGI 2.4 and later: a send to a closed connection failed
            self._left()
            raise
        # Returned without its last chunk and without an error: Starlette saw http.disconnect and stopped it.
        if not self.finished:
            self._left()

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(send)
            self.finished = True
        finally:
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                with anyio.CancelScope(shield=True):  # runs even in the cancelled response
                    await close()

    def _left(self) -> None:
        if self.hung_up is not None:
            self.hung_up()


async def json_answer(request: Request, body: Awaitable[bytes | AsyncIterator[bytes]]) -> Response:
    """The service's JSON, whole or streamed as it is encoded, unless the client hangs up first."""

    async def answer() -> Response:
        data = await body
        if isinstance(data, bytes):
            return Response(data, media_type="application/json")
        return ClosingStreamingResponse(data, media_type="application/json")

    return await watched(request, answer())


async def compact_response(
    request: Request,
    encode: Callable[[bool], Awaitable[bytes]],
    media_type: str = compact.MEDIA_TYPE,
    *,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """An HSA1 answer (or `media_type`'s, with `headers` besides), gzipped by `encode(True)` when the
    client accepts it."""
    gzipped = compact.accepts_gzip(request.headers.get("accept-encoding"))
    headers = {**(headers or {}), "Vary": "Accept-Encoding"}
    if gzipped:
        headers["Content-Encoding"] = "gzip"

    async def answer() -> Response:
        return Response(await encode(gzipped), media_type=media_type, headers=headers)

    return await watched(request, answer())


async def ndjson_stream(request: Request, events: Awaitable[AsyncIterator[bytes]]) -> Response:
    """A progress stream: the service's NDJSON lines (app/service/progress.py) sent as they come, unless
    the client hangs up before the stream begins; one that hangs up mid-stream is logged as one that hangs
    up before it (499 in the access log)."""
    started = time.perf_counter()

    async def answer() -> Response:
        lines = await events
        # no-store: a progress stream is never replayed; X-Accel-Buffering: nginx passes each line at once.
        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        hung_up = partial(client_closed, request, started)
        return ClosingStreamingResponse(lines, media_type=NDJSON, headers=headers, hung_up=hung_up)

    return await watched(request, answer())
