"""The JSON API and the compact binary transport. Thin: validation is in schemas, work in the service."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any, Literal

import anyio
from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.types import Send

from app import compact
from app.deps import ServiceDep
from app.schemas import (
    AttentionRequest,
    AttentionResponse,
    ErrorResponse,
    HeadRequest,
    HeadResponse,
    Health,
    ModelList,
)

router = APIRouter(prefix="/api", tags=["api"])
logger = logging.getLogger(__name__)

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

TRUNCATION = (
    " Text longer than the model takes (or than the service's `max_tokens`) is cut to that many tokens and "
    'the answer says `"truncated": true`.'
)

COMPACT_DESCRIPTION = f"""
The same answer as `POST /api/attention` in a compact binary form (the page's transport), with
`Content-Type: {compact.MEDIA_TYPE}` and `Content-Encoding: gzip` when `Accept-Encoding` allows it.

| bytes | content |
|---|---|
| 0..3 | ASCII `HSA1` |
| 4..7 | uint32 little-endian: header length `h` |
| 8..8+h | UTF-8 JSON header: the fields of `/api/attention` except `attention`, plus `quantization` |
| pad | zero bytes up to a multiple of 4 from the start of the buffer |
| next 4·L·H·n | float32 little-endian `scale` per row, row-major [L, H, n] (see `scheme`) |
| next L·H·n·n | uint8 `q`, row-major [L, H, n, n] |

Value = `q / 255 * scale`; every value is within `scale / 510 <= 1/510 ≈ 0.00196` of the model's (stated
in the header as `quantization.max_abs_error`). `scheme=row-max-uint8` (default): `scale` is the row's
maximum, which is then exact, and diffuse rows keep 255 levels. `scheme=abs-uint8`: `scale` is 1 for every
row, the same bound, about half the bytes after gzip. `scheme=abs-uint8-key-major`: abs-uint8 with `q`
stored [L, H, key, query] (the header says `"order": "key-major"`), 7-18% fewer bytes after gzip; the scales
stay per query row. About one byte per value before gzip.
Any single head is available at full precision from `POST /api/attention/head/compact` (binary float32) and
`POST /api/attention/head` (JSON).{TRUNCATION}
"""

HEAD_COMPACT_DESCRIPTION = f"""
One head's attention at full float32 precision, in the framing of `POST /api/attention/compact` (HSA1,
`Content-Type: {compact.MEDIA_TYPE}`, `Content-Encoding: gzip` when `Accept-Encoding` allows it): the page's
transport for the head it shows. The same values as `POST /api/attention/head`, in ~3.3 bytes a value on the
wire instead of ~21 (~55 KB at 128 tokens, ~0.85 MB at 512).

| bytes | content |
|---|---|
| 0..3 | ASCII `HSA1` |
| 4..7 | uint32 little-endian: header length `h` |
| 8..8+h | UTF-8 JSON header: the fields of `/api/attention` except `attention` (see below) |
| pad | zero bytes up to a multiple of 4 from the start of the buffer |
| next 4·n·n | the n·n float32 little-endian values, row-major [query, key], bytes grouped by significance |

The values are the model's own, exactly. Grouped by significance (the shuffle filter of HDF5 and Blosc):
byte 0 of every value, then byte 1, 2 and 3, so gzip finds the repeated exponent bytes; in numpy,
`np.frombuffer(payload, np.uint8).reshape(4, -1).T.copy().view("<f4").reshape(n, n)`. The header has
`layers` = `heads` = 1, the `layer` and `head` asked for, and
`"quantization": {{"scheme": "float32-shuffled", "order": "query-major", "max_abs_error": 0.0}}`.{TRUNCATION}
"""


Scheme = Annotated[
    Literal["row-max-uint8", "abs-uint8", "abs-uint8-key-major"],
    Query(
        description="row-max-uint8: scale = row maximum (contrast); abs-uint8: scale = 1 (fewer bytes); "
        "abs-uint8-key-major: abs-uint8 with q stored [layer][head][key][query] (fewer still)."
    ),
]


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
    logger.info(
        "client closed the connection after %.0f ms, before its answer to %s %r; its work stopped",
        1000 * (time.perf_counter() - started),
        request.method,
        request.url.path[:200],
    )
    return Response(status_code=CLIENT_CLOSED)


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


class ClosingStreamingResponse(StreamingResponse):
    """Closes its iterator however the response ends: Starlette leaves one abandoned by a client that hung
    up (cancelled while sending) to the garbage collector, and the encoder behind it would stop, log and
    free its memory only then."""

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(send)
        finally:
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                with anyio.CancelScope(shield=True):  # runs even in the cancelled response
                    await close()


async def json_answer(request: Request, body: Awaitable[bytes | AsyncIterator[bytes]]) -> Response:
    """The service's JSON, whole or streamed as it is encoded, unless the client hangs up first."""

    async def answer() -> Response:
        data = await body
        if isinstance(data, bytes):
            return Response(data, media_type="application/json")
        return ClosingStreamingResponse(data, media_type="application/json")

    return await watched(request, answer())


async def compact_response(request: Request, encode: Callable[[bool], Awaitable[bytes]]) -> Response:
    """An HSA1 answer, gzipped when the client accepts it (the service caches both forms)."""
    gzipped = compact.accepts_gzip(request.headers.get("accept-encoding"))
    headers = {"Vary": "Accept-Encoding"}
    if gzipped:
        headers["Content-Encoding"] = "gzip"

    async def answer() -> Response:
        return Response(await encode(gzipped), media_type=compact.MEDIA_TYPE, headers=headers)

    return await watched(request, answer())


@router.get("/health", response_model=Health, responses={503: {"model": Health}})
def health(service: ServiceDep) -> Response:
    ready, body = service.health()
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)


@router.get("/models", response_model=ModelList)
def models(service: ServiceDep) -> ModelList:
    return service.models()


@router.post(
    "/attention",
    response_model=AttentionResponse,
    responses=ERRORS,
    description="Every head's attention for a text (and an optional pair), rounded to 6 decimals."
    + TRUNCATION,
)
async def attention(body: AttentionRequest, request: Request, service: ServiceDep) -> Response:
    return await json_answer(request, service.attention_json(body))


@router.post(
    "/attention/head",
    response_model=HeadResponse,
    responses=ERRORS,
    description="One head's attention at full float32 precision." + TRUNCATION,
)
async def attention_head(body: HeadRequest, request: Request, service: ServiceDep) -> Response:
    return await json_answer(request, service.head(body))


@router.post(
    "/attention/compact",
    response_class=Response,
    responses={
        200: {"content": {compact.MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}}},
        **ERRORS,
    },
    description=COMPACT_DESCRIPTION,
)
async def attention_compact(
    body: AttentionRequest,
    request: Request,
    service: ServiceDep,
    scheme: Scheme = "row-max-uint8",
) -> Response:
    return await compact_response(
        request, lambda gzipped: service.attention_compact(body, gzipped=gzipped, scheme=scheme)
    )


@router.post(
    "/attention/head/compact",
    response_class=Response,
    responses={
        200: {"content": {compact.MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}}},
        **ERRORS,
    },
    description=HEAD_COMPACT_DESCRIPTION,
)
async def attention_head_compact(body: HeadRequest, request: Request, service: ServiceDep) -> Response:
    return await compact_response(request, lambda gzipped: service.head_compact(body, gzipped=gzipped))
