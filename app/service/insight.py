"""The insight's answers (app/routes/insight.py): head statistics, rollout, flow, and the comparison of two
inputs, each built from the views (views.py) in the encoding threads and cached like the attention's."""

from __future__ import annotations

import asyncio
import threading
from functools import partial

from app.errors import InvalidInputError
from app.schemas.attention import KindRequest
from app.schemas.insight import CompareHeadRequest, CompareRequest
from app.service import bodies
from app.service.answers import Answers, Input, cache_key
from app.service.computed import Computed
from app.service.encoding import EncodingThreads
from app.service.views import Views
from app.settings import Settings
from mha import analysis
from mha.errors import FlowTooLongError


class Insight:
    """The insight routes' answers (AttentionService.insight), made with the views, the answers' cache and
    the encoding threads."""

    def __init__(self, settings: Settings, views: Views, answers: Answers, encoders: EncodingThreads) -> None:
        self.settings = settings
        self._views, self._answers = views, answers
        self._off_loop, self._gunzipped_unless = encoders.off_loop, encoders.gunzipped_unless

    async def analysis(self, request: KindRequest, *, gzipped: bool = False) -> bytes:
        """The statistics' JSON, gzipped when `gzipped` (the page's first view fetches it: ~17 KB of
        6-decimal digits become ~7 KB). Cached gzipped, as the compact answers."""
        body = partial(bodies.analysis_body, words=request.words, kind=request.kind)
        encoded = await self._views.encoded(
            f"analysis.gz:{request.kind}", request, bodies.gzipped_json_of(body)
        )
        return await self._gunzipped_unless(gzipped, encoded)

    async def rollout(self, request: KindRequest) -> bytes:
        body = partial(bodies.rollout_body, kind=request.kind)
        return await self._views.encoded(f"rollout:{request.kind}", request, bodies.json_of(body))

    async def rollout_compact(self, request: KindRequest, *, gzipped: bool, scheme: str) -> bytes:
        encode = partial(bodies.encode_rollout_compact, scheme=scheme, kind=request.kind)
        return await self._gunzipped_unless(
            gzipped, await self._views.encoded(f"rollout.gz:{scheme}:{request.kind}", request, encode)
        )

    async def flow(self, request: KindRequest) -> bytes:
        limit = self.settings.flow_max_tokens or analysis.FLOW_MAX_TOKENS
        encode = bodies.json_of(partial(bodies.flow_body, max_tokens=limit, kind=request.kind))
        try:
            return await self._views.encoded(f"flow:{request.kind}", request, encode)
        except FlowTooLongError as exc:  # mha refuses before any work: the cost grows as n⁴
            unit = "words" if request.words else "tokens"
            raise InvalidInputError(
                f"attention flow is limited to {exc.limit} {unit} (it solves n² max-flow problems), this "
                f"input has {exc.n}; shorten the text (attention rollout has no such limit)"
            ) from None

    async def compare(self, request: CompareRequest) -> bytes:
        sources = (self._views.input(request.a), self._views.input(request.b))

        async def encode(abandoned: threading.Event) -> bytes:
            view_a, view_b = await self._compare_views(sources, request)
            make_body = partial(bodies.compare_body, view_a, view_b)
            return await self._off_loop(bodies.encode_pieces, make_body, abandoned)

        extra = (request.words, request.weighting, request.kind)
        return await self._answers.cached(cache_key("compare", *sources, extra=extra), encode)

    async def compare_head(self, request: CompareHeadRequest) -> bytes:
        sources = (self._views.input(request.a), self._views.input(request.b))
        view_a, view_b = await self._compare_views(sources, request)
        view_a.check_head(request.layer, request.head)
        extra = (request.words, request.weighting, request.kind, request.layer, request.head)
        key = cache_key("compare/head", *sources, extra=extra)
        make_body = partial(bodies.compare_head_body, view_a, view_b, request.layer, request.head)
        return await self._answers.shared(
            key, lambda abandoned: self._off_loop(bodies.encode_pieces, make_body, abandoned)
        )

    async def _compare_views(
        self, sources: tuple[Input, Input], request: CompareRequest
    ) -> tuple[Computed, Computed]:
        kind = request.kind
        views = await asyncio.gather(
            *(
                self._views.view(source, words=request.words, weighting=request.weighting)
                for source in sources
            )
        )
        view_a, view_b = (view.of_kind(kind) for view in views)
        what = "" if kind == "encoder" else f" ({kind} attention)"
        shape_a, shape_b = (view_a.layers, view_a.heads), (view_b.layers, view_b.heads)
        if shape_a != shape_b:
            raise InvalidInputError(
                f"models are not comparable{what}: a ({view_a.model!r}) has {shape_a[0]} layers x "
                f"{shape_a[1]} heads, b ({view_b.model!r}) has {shape_b[0]} layers x {shape_b[1]} heads; "
                "they must match"
            )
        if kind == "cross" and view_a.attentions.shape != view_b.attentions.shape:
            # Queries and keys are two sequences: no one token alignment serves both axes.
            raise InvalidInputError(
                f"cross attention is compared position by position, so a and b need the same target and "
                f"source lengths: a has {view_a.n} target x {view_a.cols} source tokens, b has {view_b.n} x "
                f"{view_b.cols}"
            )
        return view_a, view_b
