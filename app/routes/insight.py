"""The insight API: head statistics, rollout, flow, comparison. Thin: the work is in the service.

Each operation's description is its endpoint's docstring (`described` fills in limits and appends the
shared notes)."""

from __future__ import annotations

from fastapi import Request, Response

from app.deps import ServiceDep
from app.routes.common import TRUNCATION, ApiRouter, Scheme, compact_response, described, json_answer
from app.schemas.attention import KindRequest
from app.schemas.insight import (
    AnalysisResponse,
    CompareHeadRequest,
    CompareHeadResponse,
    CompareRequest,
    CompareResponse,
    FlowResponse,
    RolloutResponse,
)
from app.service import FLOW_MAX_TOKENS

router = ApiRouter(tags=["insight"])

WORDS = " With `words: true` the attention is merged to words first and `tokens` are the words."


@router.post_json("/analysis", AnalysisResponse, "Head statistics, labels and similar heads")
@described(WORDS, TRUNCATION)
async def analysis(body: KindRequest, request: Request, service: ServiceDep) -> Response:
    """What each head does, without the n×n maps (after Clark et al. 2019): per-head statistics (entropy,
    distance, weight on self / previous / next / special / punctuation tokens, ...), a label per head from
    stated thresholds, and each head's most similar heads. Cached with the attention; gzipped
    (`Content-Encoding: gzip`) when `Accept-Encoding` allows it, as the page's first view takes it."""
    return await compact_response(
        request,
        lambda gzipped: service.insight.analysis(body, gzipped=gzipped),
        media_type="application/json",
    )


@router.post_json("/rollout", RolloutResponse, "Attention rollout through all layers")
@described(WORDS, TRUNCATION)
async def rollout(body: KindRequest, request: Request, service: ServiceDep) -> Response:
    """Attention rollout (Abnar & Zuidema 2020): per layer the heads' mean, mixed with the identity
    (`residual`), rows renormalised, multiplied from the first layer to the last. Row i says how output token
    i draws on each input token; `per_layer` is the cumulative product after each layer. Rounded to 6
    decimals."""
    return await json_answer(request, service.insight.rollout(body))


@router.post_compact("/rollout/compact", summary="Attention rollout in the compact binary transport")
@described(WORDS)
async def rollout_compact(
    body: KindRequest, request: Request, service: ServiceDep, scheme: Scheme = "row-max-uint8"
) -> Response:
    """`per_layer` of `POST /api/rollout` as an HSA1 buffer (the layout of `POST /api/attention/compact`)
    with `layers` = L cumulative rollouts and `heads` = 1; the header adds `residual`. The same decoder reads
    both."""
    return await compact_response(
        request, lambda gzipped: service.insight.rollout_compact(body, gzipped=gzipped, scheme=scheme)
    )


@router.post_json("/flow", FlowResponse, "Attention flow (max-flow) for short inputs")
@described(WORDS, limit=FLOW_MAX_TOKENS)
async def flow(body: KindRequest, request: Request, service: ServiceDep) -> Response:
    """Attention flow (Abnar & Zuidema 2020): entry [i][j] is the maximum flow from output token i to input
    token j through the layered graph whose capacities are the rollout's per-layer matrices. It solves n²
    max-flow problems, so inputs longer than the service's limit ({limit} tokens by default) get 422 naming
    the limit; use `/api/rollout` for long inputs. Rounded to 6 decimals."""
    return await json_answer(request, service.insight.flow(body))


@router.post_json("/compare", CompareResponse, "Which heads change between two inputs or two models")
@described(WORDS)
async def compare_inputs(body: CompareRequest, request: Request, service: ServiceDep) -> Response:
    """Runs `a` and `b` (two texts, or one text on two models of the same shape: else 422 naming both
    shapes), aligns their tokens, keeps the aligned tokens of each head's map with rows renormalised, and
    scores each head by the mean Jensen-Shannon divergence of its rows (nats, 0 = unchanged, at most ln 2).
    `kept_a`/`kept_b` say how much weight the alignment kept. Tokens are aligned as spelled, so compare two
    tokenizers with `words: true`."""
    return await json_answer(request, service.insight.compare(body))


@router.post_json(
    "/compare/head", CompareHeadResponse, "One head of a comparison: both maps and their difference"
)
@described(WORDS)
async def compare_head(body: CompareHeadRequest, request: Request, service: ServiceDep) -> Response:
    """For one head, a's and b's maps on the aligned tokens (rows renormalised, as scored by
    `POST /api/compare`) and `diff` = a − b, at full float32 precision."""
    return await json_answer(request, service.insight.compare_head(body))
