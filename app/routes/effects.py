"""Which heads matter: each head's output zeroed in turn, the change in the model's output measured. Thin:
the work is in the service (app/service/effects.py)."""

from __future__ import annotations

from fastapi import Request, Response

from app.deps import ServiceDep
from app.routes.common import NDJSON, ApiRouter, ndjson_stream
from app.schemas.effects import PROGRESS_HEADS, HeadEffectsRequest

router = ApiRouter(tags=["insight"])

DESCRIPTION = f"""
Every head's effect on the model's output: its output (its slice before the output projection) set to
zero, one head at a time, and the change measured (mha.analysis.ablation). Decoders: KL(p_full ‖ p_ablated) of
the next-token distribution at the last position, in nats (and with `max_new_tokens` at each step that wrote a
token); the answer names the output it refers to, the unablated model's most likely next token and its
probability (`top_tokens`, `top_probs`). Encoders: 1 − cosine of the final hidden state of the first token
and, mean-pooled, of all. Encoder-decoders: the decoder's next-token KL at each position of the target
(`target`, or the one the model writes first), for the heads of all three attentions (`sections`). It
costs about L·H/2 forwards, run in batches of H that start from the layer ablated.

The answer streams as `{NDJSON}`, one JSON object a line: for models of more than {PROGRESS_HEADS} heads,
`{{"event": "progress", "done": d, "layers": L}}` after each layer's heads (none when the answer is
cached; a client asking for one already running shares it and hears from its next layer on), then
`{{"event": "done", ...}}` (`HeadEffectsDone` in the schemas), or `{{"event": "error", "detail": ...}}` if it
fails after the stream began. Errors found before (unknown model, a target for a model that is not an
encoder-decoder, a text without tokens) are plain 4xx. Closing the connection stops the work before its
next layer, unless another client waits for the same answer. Cached by (model, text, text_pair,
max_new_tokens, chat, target); text longer than the
service's `max_tokens` is cut (`truncated`).
"""


@router.post_ndjson(
    "/head-effects",
    summary="Which heads matter: the output's change when each head is zeroed",
    description=DESCRIPTION,
)
async def head_effects(body: HeadEffectsRequest, request: Request, service: ServiceDep) -> Response:
    return await ndjson_stream(request, service.effects.stream(body))
