"""The insight API: head statistics, rollout, flow, comparison. Thin: the work is in the service."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from app import compact
from app.deps import ServiceDep
from app.routes.api import ERRORS, TRUNCATION, Scheme, compact_response, json_answer
from app.schemas import (
    AnalysisResponse,
    AttentionRequest,
    CompareHeadRequest,
    CompareHeadResponse,
    CompareRequest,
    CompareResponse,
    FlowResponse,
    RolloutResponse,
)

router = APIRouter(prefix="/api", tags=["insight"])

WORDS = " With `words: true` the attention is merged to words first and `tokens` are the words."


@router.post(
    "/analysis",
    response_model=AnalysisResponse,
    responses=ERRORS,
    summary="Head statistics, labels and similar heads",
    description="What each head does, without the n×n maps (after Clark et al. 2019): per-head statistics "
    "(entropy, distance, weight on self / previous / next / special / punctuation tokens, ...), a label "
    "per head from stated thresholds, and each head's most similar heads. Cached with the attention."
    + WORDS
    + TRUNCATION,
)
async def analysis(body: AttentionRequest, request: Request, service: ServiceDep) -> Response:
    return await json_answer(request, service.analysis(body))


@router.post(
    "/rollout",
    response_model=RolloutResponse,
    responses=ERRORS,
    summary="Attention rollout through all layers",
    description="Attention rollout (Abnar & Zuidema 2020): per layer the heads' mean, mixed with the "
    "identity (`residual`), rows renormalised, multiplied from the first layer to the last. Row i says how "
    "output token i draws on each input token; `per_layer` is the cumulative product after each layer. "
    "Rounded to 6 decimals." + WORDS + TRUNCATION,
)
async def rollout(body: AttentionRequest, request: Request, service: ServiceDep) -> Response:
    return await json_answer(request, service.rollout(body))


@router.post(
    "/rollout/compact",
    response_class=Response,
    responses={
        200: {"content": {compact.MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}}},
        **ERRORS,
    },
    summary="Attention rollout in the compact binary transport",
    description="`per_layer` of `POST /api/rollout` as an HSA1 buffer (the layout of "
    "`POST /api/attention/compact`) with `layers` = L cumulative rollouts and `heads` = 1; the header adds "
    "`residual`. The same decoder reads both." + WORDS,
)
async def rollout_compact(
    body: AttentionRequest, request: Request, service: ServiceDep, scheme: Scheme = "row-max-uint8"
) -> Response:
    return await compact_response(
        request, lambda gzipped: service.rollout_compact(body, gzipped=gzipped, scheme=scheme)
    )


@router.post(
    "/flow",
    response_model=FlowResponse,
    responses=ERRORS,
    summary="Attention flow (max-flow) for short inputs",
    description="Attention flow (Abnar & Zuidema 2020): entry [i][j] is the maximum flow from output "
    "token i to input token j through the layered graph whose capacities are the rollout's per-layer "
    "matrices. It solves n² max-flow problems, so inputs longer than the service's limit (14 tokens by "
    "default) get 422 naming the limit; use `/api/rollout` for long inputs. Rounded to 6 decimals." + WORDS,
)
async def flow(body: AttentionRequest, request: Request, service: ServiceDep) -> Response:
    return await json_answer(request, service.flow(body))


@router.post(
    "/compare",
    response_model=CompareResponse,
    responses=ERRORS,
    summary="Which heads change between two inputs or two models",
    description="Runs `a` and `b` (two texts, or one text on two models of the same shape: else 422 naming "
    "both shapes), aligns their tokens, keeps the aligned tokens of each head's map with rows renormalised, "
    "and scores each head by the mean Jensen-Shannon divergence of its rows (nats, 0 = unchanged, at most "
    "ln 2). `kept_a`/`kept_b` say how much weight the alignment kept. Tokens are aligned as spelled, so "
    "compare two tokenizers with `words: true`." + WORDS,
)
async def compare_inputs(body: CompareRequest, request: Request, service: ServiceDep) -> Response:
    return await json_answer(request, service.compare(body))


@router.post(
    "/compare/head",
    response_model=CompareHeadResponse,
    responses=ERRORS,
    summary="One head of a comparison: both maps and their difference",
    description="For one head, a's and b's maps on the aligned tokens (rows renormalised, as scored by "
    "`POST /api/compare`) and `diff` = a − b, at full float32 precision." + WORDS,
)
async def compare_head(body: CompareHeadRequest, request: Request, service: ServiceDep) -> Response:
    return await json_answer(request, service.compare_head(body))
