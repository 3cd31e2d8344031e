"""The head atlas: every head scored by the field's detection probes. Thin: the work is in the service
(app/service/probe.py)."""

from __future__ import annotations

from fastapi import Request, Response

from app.deps import ServiceDep
from app.routes.common import NDJSON, ApiRouter, ndjson_stream
from app.schemas.probe import MAX_SEQUENCES, ProbeRequest

router = ApiRouter(tags=["insight"])

DESCRIPTION = f"""
Every head's detection scores on the field's probe input (mha's model.probe_heads): `sequences` rows (at
most {MAX_SEQUENCES}), each a start token, then `length` tokens drawn by `seed` from the vocabulary's
ordinary tokens (no special or control token), then the same tokens again, run as one batched forward.
Each head is scored by TransformerLens's patterns, previous token (key i − 1), duplicate token (an earlier
key of the query's token) and induction (the key just after such a copy), in the probe's measure (the
pattern's share of a row's attention, averaged over the rows that have a pattern key: Olsson et al.'s
induction score), with each score's chance level, its spread over the sequences and the labels the probe's
rule gives (a score at least `threshold` and at least chance + `margin`). An encoder-decoder is probed in its
decoder's self-attention (`kind`).

The answer streams as `{NDJSON}`, one JSON object a line: `{{"event": "progress", "done": d, "chunks": c}}`
after each chunk of sequences (a probe runs as few batched forwards as keep one layer's maps within mha's
memory bound: one for the default probe of the bundled models; none when the answer is cached; a client
asking for one already running shares it), then `{{"event": "done", ...}}` (`ProbeDone`
in the schemas), or `{{"event": "error", "detail": ...}}` if it fails after the stream began. Errors found
before (unknown model, a `length` over (limit − 1) // 2 for the model's limit) are plain 4xx. Closing the
connection stops the probe before its next layer, unless another client waits for the same answer. Cached
by (model, seed, sequences, length).
"""


@router.post_ndjson(
    "/probe", summary="The head atlas: every head's detection scores", description=DESCRIPTION
)
async def probe(body: ProbeRequest, request: Request, service: ServiceDep) -> Response:
    return await ndjson_stream(request, service.probes.stream(body))
