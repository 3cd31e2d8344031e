"""`AttentionService`: what the routes call. The core (core.py: forwards, cache, flights, encoding threads)
and the insight's answers (insight.py) below it; here the attention's answers (every head as JSON, streamed
when large, or compact; one head), the health and models list, the turns to stream a large answer, and the
other route families' own parts: `traces` (traces.py), `effects` (effects.py), `corpus` (corpus.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from functools import partial

import mha
from app import encoders
from app.registry import Entry
from app.schemas.attention import AttentionRequest, HeadRequest, Health, ModelEntry, ModelList, ModelSource
from app.schemas.trace import TraceOverviewRequest
from app.service import bodies
from app.service.core import BATCH_CHARS, TooManyWaitingError, cache_key, chars
from app.service.corpus import CorpusRuns
from app.service.effects import HeadAblations
from app.service.flights import STREAM_VALUES, Stream
from app.service.insight import InsightAnswers
from app.service.traces import Traces
from app.settings import Settings
from mha.loading.sources import SOURCES

logger = logging.getLogger(__name__)


def _facts(found: object) -> mha.CheckpointFacts | None:
    """What an entry's passing startup check read (mha.describe_checkpoint), if it read a file."""
    return found if isinstance(found, mha.CheckpointFacts) else None


def _differs(value: int | None, base: int) -> int | None:
    return value if value is not None and value != base else None


class AttentionService(InsightAnswers):
    """The service (module docstring): one per app, made in create_app() and started by its lifespan."""

    def __init__(self, settings: Settings) -> None:
        self._streams = 0  # streamed answers in progress
        self._stream_slots: asyncio.Semaphore | None = None  # made on the running loop
        self._stream_waiting = 0
        super().__init__(settings)
        self.traces = Traces(
            settings,
            self.registry,
            self.hooks(),
            freed=self._trimmer.large_answer_done,  # a trace's forward ended, or a trace was freed
            busy=TooManyWaitingError,
        )
        self.corpus = CorpusRuns(settings.runs_dir, served=lambda: self.registry.names)
        key = partial(cache_key, "head-effects")
        self.effects = HeadAblations(settings, self.registry, self.hooks(), key=key)

    async def start(self) -> None:
        self._stream_slots = asyncio.Semaphore(self.settings.max_streams)  # on this loop
        await super().start()

    def _busy(self) -> bool:
        return super()._busy() or bool(self._streams or self.traces.busy)

    # -- descriptions ----------------------------------------------------------------------------

    def health(self) -> tuple[bool, Health]:
        """(answering, body): "ok" once the default model is loaded; "loading" while its load is in flight
        (or the startup has yet to begin it); "unavailable" (503) once that load has failed; "unloaded" when
        the memory budget has unloaded it and nothing loads it now (it loads again on its next request).
        Each says what the server is doing, never what it is not (issue 48 E5)."""
        default = self.registry.default
        model = self.registry.loaded(default)
        states = {entry.name: self._state(entry) for entry in self.registry}
        loading = [name for name, state in states.items() if state == "loading"]
        if model is not None:
            status = "ok"
        elif default in loading:
            status = "loading"
        elif states[default] == "failed":
            status = "unavailable"
        else:
            status = "loading" if not self.loads.started.is_set() else "unloaded"
        return status != "unavailable", Health(
            status=status,
            model=default,
            device=str(model.info.device) if model is not None else None,
            loading=loading,
            checking=[name for name, state in states.items() if state == "checking"],
        )

    def _state(self, entry: Entry[mha.AttentionModel]) -> str:
        """The entry's state as /api/models and health say it: the registry's, but "loading" from the moment
        a load is asked for (it may wait for the loads' one-time preparation before the registry sees it)."""
        state = self.registry.state(entry)
        return "loading" if state != "loaded" and self.loads.loading(entry.name) else state

    def models(self) -> ModelList:
        entries = []
        for entry in self.registry:
            info = entry.model.info if entry.model is not None else None
            facts = _facts(entry.found)
            entries.append(
                ModelEntry(
                    name=entry.name,
                    family=info.family if info else None,
                    layers=info.layers if info else None,
                    heads=info.heads if info else None,
                    kv_heads=info.kv_heads if info else None,
                    chat_template=info.chat_template if info else None,
                    byte_level=info.byte_level if info else None,
                    max_tokens=info.max_tokens if info else None,
                    # unloaded: what its startup check read from the config (None for a hub id)
                    architecture=info.architecture if info else facts.architecture if facts else None,
                    # the decoder's own shape, when it differs from the encoder's
                    decoder_layers=_differs(info.decoder_layers, info.layers) if info else None,
                    decoder_heads=_differs(info.decoder_heads, info.heads) if info else None,
                    trace_max_tokens=self.traces.max_tokens(entry.model) if entry.model is not None else None,
                    causal=info.causal if info else None,
                    pretrained=info.pretrained if info else None,
                    loaded=info is not None,
                    error=entry.error,
                    source=self.sources.get(entry.name, "bundled"),
                    header_family=facts.family if facts else None,
                    parameters=facts.parameters if facts else None,
                    quantization=facts.quantization if facts else None,
                    size_bytes=facts.size_bytes if facts else None,
                    state=self._state(entry),
                    memory_bytes=entry.nbytes if entry.model is not None else None,
                )
            )
        return ModelList(
            default=self.registry.default,
            models=entries,
            sources=[ModelSource(id=source.id, label=source.label) for source in SOURCES],
            memory_budget_bytes=self.registry.max_bytes,
            memory_held_bytes=self.registry.held_bytes(),
        )

    @property
    def streams_waiting(self) -> int:
        """Large answers waiting for their turn to be streamed (`max_streams`)."""
        return self._stream_waiting

    # -- answers ---------------------------------------------------------------------------------

    async def attention_json(self, request: AttentionRequest) -> bytes | AsyncIterator[bytes]:
        """The JSON bytes, or (more than STREAM_VALUES values) a `Stream` of chunks encoded as sent.

        A streamed answer keeps its tensor (75 MB at 512 tokens) until its client has read the last byte,
        at the client's pace: at most `max_streams` are streamed at once, so memory stays bounded however
        many clients ask. A long text takes its turn before its forward; a short one that still makes a
        large answer (512 tokens of CJK, say) lets go of its tensor while it waits."""
        source = self._input(request)
        key = cache_key("json", source, extra=(request.words, request.weighting))
        # Looked up before anything else: a cached answer never waits for a turn to stream.
        hit = self.cache.get(key)
        if hit is not None:
            return hit  # type: ignore[no-any-return]
        view_of = partial(self._view, source, words=request.words, weighting=request.weighting)
        slot = None
        if chars(request.text, request.text_pair, request.target) > BATCH_CHARS:
            slot = await self._stream_slot()
        streaming = False
        try:
            view = await view_of()
            if view.nbytes // view.maps.element_size() <= STREAM_VALUES:
                make_body = partial(bodies.attention_body, view)
                return await self._once(
                    key, lambda abandoned: self._off_loop(bodies.encode_pieces, make_body, abandoned)
                )
            if slot is None:
                del view  # not held while waiting for a turn
                slot = await self._stream_slot()
                view = await view_of()  # from the cache, unless evicted meanwhile
            stream = Stream(
                encoders.pieces(bodies.attention_body(view)),
                self._off_loop,
                partial(self._stream_closed, f"/api/attention ({view.n} tokens)", slot),
            )
            streaming = True
        finally:
            if slot is not None and not streaming:  # the stream releases its turn when it closes
                slot.release()
        self._streams += 1
        return stream

    async def attention_compact(
        self, request: AttentionRequest, *, gzipped: bool, scheme: str, bits: str = "8"
    ) -> bytes:
        """Every head in `scheme`, its q in `bits` bits ("auto": by the answer's n, compact.AUTO_BITS)."""
        body = await self._encoded(
            f"hsa1.gz:{scheme}:{bits}", request, partial(bodies.encode_compact, scheme=scheme, bits=bits)
        )
        return await self._gunzipped_unless(gzipped, body)

    async def attention_progress(self, request: AttentionRequest) -> AsyncIterator[bytes]:
        """The progress of the work in flight for `request`'s input (work_watch.py), as NDJSON lines;
        an unknown model or a bad input is raised here, before the stream, for a plain 4xx."""
        source = self._input(request)
        return self.progress.watch(source[0], source, partial(self.in_flight, source))

    async def head(self, request: HeadRequest) -> bytes:
        view = await self._view(self._input(request), words=request.words, weighting=request.weighting)
        make_body = partial(bodies.head_body, view, request.layer, request.head, kind=request.kind)
        return await self._off_loop(bodies.encode_pieces, make_body)

    async def head_compact(self, request: HeadRequest, *, gzipped: bool) -> bytes:
        """One head at full float32 precision as HSA1 (scheme float32-shuffled, layers = heads = 1), gzipped
        once off the loop and cached as bytes like the compact attention."""
        kind = f"head.hsa1.gz:{request.kind}:{request.layer}:{request.head}"
        encode = partial(
            bodies.encode_head_compact, layer=request.layer, head=request.head, kind=request.kind
        )
        return await self._gunzipped_unless(gzipped, await self._encoded(kind, request, encode))

    async def trace_overview(self, request: TraceOverviewRequest, *, gzipped: bool, scheme: str) -> bytes:
        body = await self.traces.overview(request, scheme=scheme)
        return await self._gunzipped_unless(gzipped, body)

    # -- streaming -------------------------------------------------------------------------------

    async def _stream_slot(self) -> asyncio.Semaphore:
        """Wait for a turn to stream a large answer (on the loop, holding nothing large)."""
        if self._stream_slots is None:
            self._stream_slots = asyncio.Semaphore(self.settings.max_streams)
        if self._stream_waiting >= self.settings.max_queue:
            raise TooManyWaitingError(
                f"{self._stream_waiting} large answers are already waiting to be streamed (the limit); "
                "the compact route (/api/attention/compact) and one head (/api/attention/head) are lighter",
                max(1, self._stream_waiting // self.settings.max_streams),
            )
        self._stream_waiting += 1
        try:
            await self._stream_slots.acquire()
        finally:
            self._stream_waiting -= 1
        return self._stream_slots

    def _stream_closed(
        self, what: str, slot: asyncio.Semaphore, done: bool, sent: int, seconds: float
    ) -> None:
        self._streams -= 1
        slot.release()
        if not done:
            logger.info(
                "client closed the connection during %s after %.1f MB in %.1f s; encoding stopped",
                what,
                sent / 1e6,
                seconds,
            )
        self._trimmer.large_answer_done()
