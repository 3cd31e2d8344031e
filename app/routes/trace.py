"""Long inputs: trace once (streaming progress), then read the overview, windows and rows of the trace.
Thin: validation is in schemas, work in the service (app/service/traces.py)."""

from __future__ import annotations

from typing import Any

from fastapi import Request, Response

from app.deps import ServiceDep
from app.routes.common import (
    COMPACT_RESPONSES,
    ERRORS,
    NDJSON,
    ApiRouter,
    Scheme,
    compact_response,
    described,
    json_answer,
    ndjson_stream,
)
from app.schemas.common import ErrorResponse
from app.schemas.trace import (
    TraceOverviewRequest,
    TraceRequest,
    TraceRowRequest,
    TraceRowResponse,
    TraceTokens,
    TraceWindowRequest,
    TraceWindowResponse,
)

router = ApiRouter(tags=["long inputs"])

JSON = (
    "application/json"  # windows and rows: gzipped when the client accepts it (a 512 x 512 window is 1.7 MB)
)
TOO_LONG: dict[int | str, dict[str, Any]] = {
    413: {
        "model": ErrorResponse,
        "description": "Request body larger than the service's limit, or an input longer than the model's "
        "`trace_max_tokens` (GET /api/models; the detail says the limit).",
    }
}
KEPT = (
    " The trace is kept in the service's cache by (model, text, text_pair, chat); one evicted is traced "
    "again, transparently, first."
)

TRACE_DESCRIPTION = f"""
Trace a long input once: one forward that keeps, per layer, what any window of any head needs (never every
head's n x n). The answer streams as `{NDJSON}`, one JSON object a line:
`{{"event": "progress", "layer": i, "layers": L}}` as layer i starts (none when the trace is already
kept; a client asking for a trace already running shares it and hears from its next layer on), then
`{{"event": "done", ...}}` with the tokens and the model's shape (`TraceDone` in the schemas), or
`{{"event": "error", "detail": ...}}` if it fails after the stream began. Closing the connection stops the
forward before its next layer, unless another client waits for the same trace. Inputs up to the model's
`trace_max_tokens` (GET /api/models) are taken whole; longer ones get 413. Then read it with
`/api/trace/overview`, `/api/trace/window` and `/api/trace/row`.
"""

OVERVIEW_DESCRIPTION = f"""
Every head of a traced input pooled to s x s blocks (s = min(size, n)) in the compact binary transport of
`POST /api/attention/compact` (HSA1, the same `scheme`s), with `n` = s and one label per block in `tokens`
(its token, or "first…last"). The header adds `input_n` (the input's tokens), `edges` (s + 1 token
boundaries: block b covers tokens edges[b] .. edges[b+1]-1, on both axes), `reduce` and `exact`. size 128
with reduce "max" was pooled during the forward and costs nothing more.{KEPT}
"""


@router.post_ndjson("/trace", description=TRACE_DESCRIPTION, responses=TOO_LONG)
async def trace(body: TraceRequest, request: Request, service: ServiceDep) -> Response:
    return await ndjson_stream(request, service.traces.stream(body))


@router.post(
    "/trace/overview",
    response_class=Response,
    responses={**COMPACT_RESPONSES, **TOO_LONG},
    description=OVERVIEW_DESCRIPTION,
)
async def trace_overview(
    body: TraceOverviewRequest, request: Request, service: ServiceDep, scheme: Scheme = "row-max-uint8"
) -> Response:
    return await compact_response(
        request, lambda gzipped: service.traces.overview(body, gzipped=gzipped, scheme=scheme)
    )


@router.post("/trace/window", response_model=TraceWindowResponse, responses={**ERRORS, **TOO_LONG})
@described(KEPT)
async def trace_window(body: TraceWindowRequest, request: Request, service: ServiceDep) -> Response:
    """One head's weights for query tokens rows[0]..rows[1]-1 against keys cols[0]..cols[1]-1: exact on a
    side of at most max_cells tokens, else pooled to max_cells blocks by `reduce` (the edges say which
    tokens each block covers, `factor` the largest block)."""
    return await compact_response(
        request, lambda gzipped: service.traces.window(body, gzipped=gzipped), media_type=JSON
    )


@router.post("/trace/row", response_model=TraceRowResponse, responses={**ERRORS, **TOO_LONG})
@described(KEPT)
async def trace_row(body: TraceRowRequest, request: Request, service: ServiceDep) -> Response:
    """One query token's exact weights on every key of one head (the text view's shading)."""
    return await compact_response(
        request, lambda gzipped: service.traces.row(body, gzipped=gzipped), media_type=JSON
    )


@router.post("/trace/tokens", response_model=TraceTokens, responses=ERRORS)
async def trace_tokens(body: TraceRequest, request: Request, service: ServiceDep) -> Response:
    """How many tokens an input has (the tokenizer alone, no forward: milliseconds) against the two limits:
    `max_tokens`, the most the full-matrix routes read (they cut longer inputs), and `trace_max_tokens`,
    the most `/api/trace` takes. The page asks it to choose between the two for a long text."""
    return await json_answer(request, service.traces.tokens(body))
