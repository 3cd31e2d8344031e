"""The page's "Save as HTML": one run as a self-contained file (docs/snapshots.md). Thin: the file is built
by app/snapshot/served.py with the service's parts."""

from __future__ import annotations

from typing import Any

from fastapi import Request, Response

from app.deps import SnapshotsDep
from app.routes.common import ERRORS, TRUNCATION, ApiRouter, compact_response
from app.schemas.snapshot import MAX_MAX_BYTES, MIN_MAX_BYTES, SnapshotRequest
from app.snapshot.served import MEDIA_TYPE

router = ApiRouter(tags=["snapshot"])

DESCRIPTION = f"""
One run as one self-contained `.html` file, the file the page's "Save as HTML" downloads: the page itself
(its template, CSS, modules and plotly.js) with the run's answers inside, opening from disk in a browser
with no server and making no request of any kind (its Content-Security-Policy allows only its own inline
scripts, by hash, and `connect-src 'none'`). It carries every head at 8 bits, the statistics, the rollout
and, as its budget allows, exact float32 heads, the selected one first (docs/snapshots.md says what, and
in which form); it opens on `layer`, `head` and `kind`.

The body names the input as `POST /api/attention/head` does: the same forward (cached: the run the page
drew is not run again), weighted and merged to words as it asks. The answer is `{MEDIA_TYPE}` with
`Content-Disposition: attachment; filename="headscope-<model>-<8 hex digits>.html"` (the model's name in
`[A-Za-z0-9._-]`), and `Content-Encoding: gzip` when `Accept-Encoding` allows it. `max_bytes` (from
{MIN_MAX_BYTES:,} to {MAX_MAX_BYTES:,}) bounds the file: past it the grid is pooled and the file says so;
a limit below what the run needs at all, an encoder-decoder's run that does not fit, or a layer or head
beyond the model's is refused with 422.{TRUNCATION}
"""

RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The snapshot file, as an attachment.",
        "content": {"text/html": {"schema": {"type": "string"}}},
        "headers": {
            "Content-Disposition": {
                "description": 'attachment; filename="headscope-<model>-<8 hex digits>.html"',
                "schema": {"type": "string"},
            }
        },
    },
    **ERRORS,
}


@router.post(
    "/snapshot",
    response_class=Response,
    responses=RESPONSES,
    summary="One run as a self-contained HTML file",
    description=DESCRIPTION,
)
async def snapshot(body: SnapshotRequest, request: Request, snapshots: SnapshotsDep) -> Response:
    disposition = {"Content-Disposition": f'attachment; filename="{snapshots.filename(body)}"'}
    return await compact_response(
        request,
        lambda gzipped: snapshots.html(body, gzipped=gzipped),
        media_type=MEDIA_TYPE,
        headers=disposition,
    )
