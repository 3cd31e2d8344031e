"""The JSON API and the compact binary transport. Thin: validation is in schemas, work in the service."""

from __future__ import annotations

from fastapi import Request, Response
from fastapi.responses import JSONResponse

from app import compact
from app.deps import ServiceDep
from app.routes.common import (
    NDJSON,
    TRUNCATION,
    ApiRouter,
    Bits,
    Scheme,
    compact_response,
    described,
    json_answer,
    ndjson_stream,
)
from app.schemas.attention import (
    AttentionRequest,
    AttentionResponse,
    HeadRequest,
    HeadResponse,
    Health,
    ModelList,
)

router = ApiRouter(tags=["api"])

PROGRESS_DESCRIPTION = f"""
How far the work for an input has come while its answer is still being computed: the page asks for the
answer (`POST /api/attention/compact`) as ever and, when it is slow, sends the same body here. The body
names the input as the answer routes do (`words` and `weighting` are read and ignored: the forward is the
same). It starts and holds no work: it watches the forward in flight for that input (shared by every
client asking for it, batched or not) and its model's load (whoever asked for it), and ends when that work
ends. The answer streams as `{NDJSON}`, one
JSON object a line: `{{"event": "load", "model": name, "step": s, "steps": S}}` while the model loads
(s of S: one rising bar over the load's stages), `{{"event": "progress", "layer": i, "layers": L,
"pass": p}}` as layer i (0-based) of the forward starts (p counts the passes of a continuation or an
encoder-decoder; 0 for a plain forward), the latest of each first, then `{{"event": "done"}}` once nothing
for the input is in flight, at once when nothing is (the answer is cached, or not asked for yet). To stop
the work, close the answer's own request: the forward stops before its next layer unless another client
still waits for it.
"""

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

Value = `q / 255 * scale`; every value is within `scale / 510 <= 1/510 ≈ {compact.MAX_ABS_ERROR:.5f}` of the
model's (stated in the header as `quantization.max_abs_error`). `scheme=row-max-uint8` (default): `scale` is
the row's maximum, which is then exact, and diffuse rows keep 255 levels. `scheme=abs-uint8`: `scale` is 1 for
every row, the same bound, about half the bytes after gzip. `scheme=abs-uint8-key-major`: abs-uint8 with `q`
stored [L, H, key, query] (the header says `"order": "key-major"`), 7-18% fewer bytes after gzip; the scales
stay per query row. About one byte per value before gzip.
`bits` (default 8) quantizes to fewer levels in the same byte: value = `q / (2**bits - 1) * scale`, within
`scale / (2 * (2**bits - 1))` (the header's `quantization.bits` and `max_abs_error`); each bit fewer saves
about 30% after gzip. `bits=auto`, the page's first view, takes 8 from 128 tokens, 7 from 88, 6 from 64 and
8 below 64: the most that keeps every head of a first view under its 0.3 bytes a value.
Any single head is available at full precision from `POST /api/attention/head/compact` (binary float32) and
`POST /api/attention/head` (JSON).

An encoder-decoder's answer (header `"architecture": "encoder-decoder"`, with `target_tokens`,
`target_special`, `target_unknown`, `target_truncated`, `generated`) holds three tensors in one buffer,
listed in the header's `sections` as `{{"kind", "layers", "heads", "rows", "cols"}}`: encoder n x n,
decoder m x m, cross m x n (m target tokens). Their payloads follow in that order, each as above with n x n
read as rows x cols, each starting at a multiple of 4 bytes (zero padding between).{TRUNCATION}
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
`"quantization": {{"scheme": "float32-shuffled", "order": "query-major", "max_abs_error": 0.0}}`.
For an encoder-decoder, `kind` picks the encoder's, the decoder's or the cross attention's head: the header
is that model's (with `kind`) and holds one section of that kind (rows x cols: cross is target x source), as
`POST /api/attention/compact` describes.{TRUNCATION}
"""


@router.get("/health", response_model=Health, responses={503: {"model": Health}})
def health(service: ServiceDep) -> Response:
    ready, body = service.models.health()
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)


@router.get("/models", response_model=ModelList)
def models(service: ServiceDep) -> ModelList:
    return service.model_list()


@router.post_json("/attention", AttentionResponse)
@described(TRUNCATION)
async def attention(body: AttentionRequest, request: Request, service: ServiceDep) -> Response:
    """Every head's attention for a text (and an optional pair), rounded to 6 decimals."""
    return await json_answer(request, service.attention.json(body))


@router.post_json("/attention/head", HeadResponse)
@described(TRUNCATION)
async def attention_head(body: HeadRequest, request: Request, service: ServiceDep) -> Response:
    """One head's attention at full float32 precision."""
    return await json_answer(request, service.attention.head(body))


@router.post_compact("/attention/compact", description=COMPACT_DESCRIPTION)
async def attention_compact(
    body: AttentionRequest,
    request: Request,
    service: ServiceDep,
    scheme: Scheme = "row-max-uint8",
    bits: Bits = "8",
) -> Response:
    return await compact_response(
        request, lambda gzipped: service.attention.compact(body, gzipped=gzipped, scheme=scheme, bits=bits)
    )


@router.post_ndjson("/attention/progress", description=PROGRESS_DESCRIPTION)
async def attention_progress(body: AttentionRequest, request: Request, service: ServiceDep) -> Response:
    return await ndjson_stream(request, service.attention.progress(body))


@router.post_compact("/attention/head/compact", description=HEAD_COMPACT_DESCRIPTION)
async def attention_head_compact(body: HeadRequest, request: Request, service: ServiceDep) -> Response:
    return await compact_response(
        request, lambda gzipped: service.attention.head_compact(body, gzipped=gzipped)
    )
