"""The attention's answers (app/routes/api.py, AttentionService.attention): every head as JSON, streamed
when large, or compact; one head; the progress of the work in flight for an input; and the turns to stream a
large answer (`max_streams` at once, `max_queue` waiting)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from functools import partial

from app import encoders
from app.schemas.attention import AttentionRequest, HeadRequest
from app.service import bodies
from app.service.answers import Answers, cache_key
from app.service.encoding import EncodingThreads
from app.service.flights import STREAM_VALUES, Stream
from app.service.forwards import BATCH_CHARS, Forwards, TooManyWaitingError, chars
from app.service.views import Views
from app.service.work_watch import WorkWatch
from app.settings import Settings

logger = logging.getLogger(__name__)


class Attention:
    """The attention routes' answers, made with the views, the answers' cache, the encoding threads, the
    forwards (what is in flight) and the watch of the work; `done` is told when a large answer's stream
    ends (the C heap's trimmer)."""

    def __init__(
        self,
        settings: Settings,
        views: Views,
        answers: Answers,
        encoders: EncodingThreads,
        forwards: Forwards,
        watch: WorkWatch,
        *,
        done: Callable[[], None] = lambda: None,
    ) -> None:
        self.settings = settings
        self._views, self._answers, self._forwards, self._watch = views, answers, forwards, watch
        self._off_loop, self._gunzipped_unless = encoders.off_loop, encoders.gunzipped_unless
        self._done = done
        self._streams = 0  # streamed answers in progress
        self._stream_slots: asyncio.Semaphore | None = None  # made on the running loop
        self._stream_waiting = 0

    def start(self) -> None:
        self._stream_slots = asyncio.Semaphore(self.settings.max_streams)  # on this loop

    @property
    def streaming(self) -> bool:
        """A large answer is being streamed (the idle trim waits for it)."""
        return bool(self._streams)

    @property
    def streams_waiting(self) -> int:
        """Large answers waiting for their turn to be streamed (`max_streams`)."""
        return self._stream_waiting

    # -- answers ---------------------------------------------------------------------------------

    async def json(self, request: AttentionRequest) -> bytes | AsyncIterator[bytes]:
        """The JSON bytes, or (more than STREAM_VALUES values) a `Stream` of chunks encoded as sent.

        A streamed answer keeps its tensor (75 MB at 512 tokens) until its client has read the last byte,
        at the client's pace: at most `max_streams` are streamed at once, so memory stays bounded however
        many clients ask. A long text takes its turn before its forward; a short one that still makes a
        large answer (512 tokens of CJK, say) lets go of its tensor while it waits."""
        source = self._views.input(request)
        key = cache_key("json", source, extra=(request.words, request.weighting))
        # Looked up before anything else: a cached answer never waits for a turn to stream.
        hit = self._answers.get(key)
        if hit is not None:
            return hit  # type: ignore[no-any-return]
        view_of = partial(self._views.view, source, words=request.words, weighting=request.weighting)
        slot = None
        if chars(request.text, request.text_pair, request.target) > BATCH_CHARS:
            slot = await self._stream_slot()
        streaming = False
        try:
            view = await view_of()
            if view.nbytes // view.maps.element_size() <= STREAM_VALUES:
                make_body = partial(bodies.attention_body, view)
                return await self._answers.once(
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

    async def compact(
        self, request: AttentionRequest, *, gzipped: bool, scheme: str, bits: str = "8"
    ) -> bytes:
        """Every head in `scheme`, its q in `bits` bits ("auto": by the answer's n, compact.AUTO_BITS)."""
        body = await self._views.encoded(
            f"hsa1.gz:{scheme}:{bits}", request, partial(bodies.encode_compact, scheme=scheme, bits=bits)
        )
        return await self._gunzipped_unless(gzipped, body)

    async def progress(self, request: AttentionRequest) -> AsyncIterator[bytes]:
        """The progress of the work in flight for `request`'s input (work_watch.py), as NDJSON lines;
        an unknown model or a bad input is raised here, before the stream, for a plain 4xx."""
        source = self._views.input(request)
        return self._watch.watch(source[0], source, partial(self._forwards.in_flight, source))

    async def head(self, request: HeadRequest) -> bytes:
        view = await self._views.view(
            self._views.input(request), words=request.words, weighting=request.weighting
        )
        make_body = partial(bodies.head_body, view, request.layer, request.head, kind=request.kind)
        return await self._off_loop(bodies.encode_pieces, make_body)

    async def head_compact(self, request: HeadRequest, *, gzipped: bool) -> bytes:
        """One head at full float32 precision as HSA1 (scheme float32-shuffled, layers = heads = 1), gzipped
        once off the loop and cached as bytes like the compact attention."""
        kind = f"head.hsa1.gz:{request.kind}:{request.layer}:{request.head}"
        encode = partial(
            bodies.encode_head_compact, layer=request.layer, head=request.head, kind=request.kind
        )
        return await self._gunzipped_unless(gzipped, await self._views.encoded(kind, request, encode))

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
        self._done()
