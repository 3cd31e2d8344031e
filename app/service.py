"""The one module of app/ that uses `mha`: models, inference off the event loop, caching, encoding.

Routes call `AttentionService`; it resolves the model by registered name and hands the text to that
model's `Batcher`: `max_concurrency` worker threads per model, each taking every request waiting at that
moment (up to `max_batch`) into one padded forward (`model.attend_batch`) under `torch.inference_mode()`.
At most `max_queue` requests wait per model; beyond that a request gets 503 with Retry-After at once.

The event loop only awaits: every answer is encoded in worker threads in short pieces (app/encoders.py),
so the GIL, and with it the loop, is never held for long; the largest (every head as JSON) is streamed a
chunk at a time and never held whole. Finished answers (the result tensor, the JSON bytes of answers of
moderate size, the gzipped compact bytes) are cached by (model, text, pair), and identical requests in
flight, forwards and insight answers alike, share one computation (`Flights`). When every client waiting
for a computation has hung up, it is dropped before its forward or stopped between layers.

With `words` the token-level result is merged to words (`mha.analysis`) once and cached under its own key
in the same LRU; every answer (attention, head, compact, analysis, rollout, flow, compare) is then built
from that word-level view exactly as from the token-level one.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Hashable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import torch
from anyio import to_thread
from starlette.exceptions import HTTPException

import mha
from app import compact, encoders, memory
from app.cache import LRUCache
from app.encoders import Floats
from app.errors import InvalidInputError, ServiceError
from app.registry import Registry, scan_models_dir
from app.schemas import (
    AttentionRequest,
    CompareHeadRequest,
    CompareRequest,
    HeadRequest,
    Health,
    InputText,
    ModelEntry,
    ModelList,
)
from app.settings import DEFAULT_MODEL, Settings
from mha import analysis
from mha.errors import Cancelled

logger = logging.getLogger(__name__)

# Texts longer than this (in characters, both segments) run alone: padding a short text to a long one's
# length would cost more than batching saves.
BATCH_CHARS = 600
# The size of the "random" model (our layers, untrained weights), documented in /api/models and README.
RANDOM_MODEL = "random"
RANDOM_SIZE = {"layers": 4, "heads": 8, "embed_dim": 256}
# Rollout mixes this much identity into each layer (Abnar & Zuidema's 0.5); stated in every answer.
ROLLOUT_RESIDUAL = 0.5
SIMILAR_HEADS = 5  # "heads like this one" per head in /api/analysis
# /api/attention answers with more values than this (~7.5 MB of JSON, ~120 tokens on MiniLM) are streamed
# as they are encoded and not cached as bytes (the tensor is): a 512-token answer is ~140 MB of JSON.
STREAM_VALUES = 2**20
CHUNK_BYTES = 1 << 20  # a streamed answer is sent in chunks of about this size
# After answers whose tensor is at least this large, freed memory is handed back to the system once the
# service is idle for IDLE_TRIM_SECONDS (or at once under continuous load, at most every TRIM_INTERVAL).
LARGE_BYTES = 16 << 20
IDLE_TRIM_SECONDS = 1.0
TRIM_INTERVAL = 10.0

T = TypeVar("T")


class ModelBusyError(HTTPException):
    """503 with Retry-After: too many requests already wait (for a model, or to stream a large answer).
    An HTTPException rather than a ServiceError because app/errors.py's ServiceError handler does not
    pass headers; its HTTPException handler does."""

    def __init__(self, detail: str, retry_after: int) -> None:
        super().__init__(
            503, f"{detail}; try again in {retry_after} s", headers={"Retry-After": str(retry_after)}
        )


@dataclass(frozen=True)
class Computed:
    """What the service keeps of an `mha.AttentionResult`: the header fields and the attention.

    `word_ids` and `offsets` are the tokenizer's, kept to merge pieces into words; empty for a view that is
    already word-level."""

    header: dict[str, Any]
    attentions: torch.Tensor  # float32 CPU [L, H, n, n]
    word_ids: tuple[int | None, ...] = ()
    offsets: tuple[tuple[int, int], ...] = ()

    @property
    def nbytes(self) -> int:
        return self.attentions.numel() * self.attentions.element_size()


def _dtype(name: str) -> torch.dtype | None:
    return None if name == "auto" else getattr(torch, name)


def build_loaders(settings: Settings) -> dict[str, Callable[[], Any]]:
    """name -> zero-argument loader. Operator entries override scanned ones, which override built-ins."""
    dtype = _dtype(settings.dtype)
    loaders: dict[str, Callable[[], Any]] = {
        DEFAULT_MODEL: partial(mha.load_pretrained, device=settings.device, dtype=dtype, name=DEFAULT_MODEL)
    }
    if settings.random_model:
        loaders[RANDOM_MODEL] = partial(
            mha.random_model, **RANDOM_SIZE, causal=False, seed=0, device=settings.device, name=RANDOM_MODEL
        )
    for name, path in _operator_paths(settings).items():
        loaders[name] = partial(
            mha.load_pretrained, str(path), device=settings.device, dtype=dtype, name=name
        )
    return loaders


def build_checks(settings: Settings) -> dict[str, Callable[[], None]]:
    """name -> the cheap file check of an operator's checkpoint (milliseconds, no weights read), run at
    startup so /api/models names a missing config, weights file or vocabulary before any request loads it."""
    paths = _operator_paths(settings)
    return {name: partial(mha.check_checkpoint, str(path)) for name, path in paths.items()}


def _operator_paths(settings: Settings) -> dict[str, str | Path]:
    paths: dict[str, str | Path] = {}
    if settings.models_dir is not None:
        paths.update(scan_models_dir(settings.models_dir))
    paths.update(settings.models)  # operator entries override scanned ones
    return paths


@dataclass(eq=False)
class _Flight:
    task: asyncio.Task[Any]
    abandoned: threading.Event
    waiters: int = 0


class Flights:
    """Identical work in flight runs once for all who ask. When the last of them leaves (its client hung
    up), the work is cancelled: its task, and through `abandoned` whatever worker thread runs it; a later
    identical request then starts afresh rather than joining abandoned work. Loop-side only: no lock."""

    def __init__(self) -> None:
        self._flights: dict[Hashable, _Flight] = {}

    def __len__(self) -> int:
        return len(self._flights)

    async def join(self, key: Hashable, start: Callable[[threading.Event], Coroutine[Any, Any, T]]) -> T:
        loop = asyncio.get_running_loop()
        flight = self._flights.get(key)
        if flight is None or flight.task.get_loop() is not loop:  # (a stale one of a finished loop)
            abandoned = threading.Event()
            flight = _Flight(loop.create_task(start(abandoned)), abandoned)
            self._flights[key] = flight
            flight.task.add_done_callback(partial(self._remove, key, flight))
        flight.waiters += 1
        try:
            # shield: one waiter leaving must not cancel what the others still wait for.
            result: T = await asyncio.shield(flight.task)
            return result
        finally:
            flight.waiters -= 1
            if flight.waiters == 0 and not flight.task.done():
                flight.abandoned.set()
                flight.task.cancel()
                self._remove(key, flight)

    def _remove(self, key: Hashable, flight: _Flight, _task: object = None) -> None:
        if self._flights.get(key) is flight:
            del self._flights[key]


async def _result(future: Future[T]) -> T:
    """Await a worker thread's future without ever cancelling it (the Flight decides that)."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[T] = loop.create_future()

    def settle(done: Future[T]) -> None:
        if waiter.done():
            return
        if done.cancelled():
            waiter.cancel()
        elif (exc := done.exception()) is not None:
            waiter.set_exception(exc)
        else:
            waiter.set_result(done.result())

    def notify(done: Future[T]) -> None:
        try:
            loop.call_soon_threadsafe(settle, done)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    future.add_done_callback(notify)
    return await waiter


# Worker and encoding threads run at this nice level (Linux: per thread): on a busy machine the kernel
# then gives the event loop the CPU first, so health checks and small requests are answered between the
# pieces of a large one.
BACKGROUND_NICE = 10


def background() -> None:
    """Lower the calling thread's CPU priority (it cannot be raised again without privileges)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
    except (AttributeError, OSError):  # not Linux, or not allowed: run at the normal priority
        pass


def _encode_pieces(make_body: Callable[[], Any], abandoned: threading.Event | None = None) -> bytes:
    """Worker thread: build an answer's body and encode it piece by piece, stopping when abandoned."""
    body = make_body()
    parts = []
    for piece in encoders.pieces(body):
        if abandoned is not None and abandoned.is_set():
            raise Cancelled("encoding cancelled: nobody waits for this answer any more")
        parts.append(piece)
    return b"".join(parts)


def _next_chunk(parts: Iterator[bytes], size: int) -> bytes:
    """Worker thread: the next ~size bytes of a streamed answer (b"" at its end)."""
    chunk = []
    total = 0
    for piece in parts:
        chunk.append(piece)
        total += len(piece)
        if total >= size:
            break
    return b"".join(chunk)


class Stream:
    """A large answer's JSON, a chunk at a time, each encoded in a worker thread just before it is sent:
    memory stays at one chunk beside the tensor. `aclose()` (the response ends early: its client hung up)
    stops it; either way `on_close(done, bytes_sent, seconds)` is called exactly once."""

    def __init__(
        self,
        parts: Iterator[bytes],
        off_loop: Callable[..., Coroutine[Any, Any, bytes]],
        on_close: Callable[[bool, int, float], None],
    ) -> None:
        self._parts = parts
        self._off_loop = off_loop
        self._on_close: Callable[[bool, int, float], None] | None = on_close
        self._started = time.perf_counter()
        self.sent = 0

    def __aiter__(self) -> Stream:
        return self

    async def __anext__(self) -> bytes:
        if self._on_close is None:
            raise StopAsyncIteration
        try:
            chunk = await self._off_loop(_next_chunk, self._parts, CHUNK_BYTES)
        except BaseException:
            self._close(done=False)
            raise
        if not chunk:
            self._close(done=True)
            raise StopAsyncIteration
        self.sent += len(chunk)
        return chunk

    async def aclose(self) -> None:
        self._close(done=False)

    def _close(self, *, done: bool) -> None:
        if self._on_close is not None:
            on_close, self._on_close = self._on_close, None
            on_close(done, self.sent, time.perf_counter() - self._started)


class AttentionService:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.registry: Registry[Any] = Registry(
            build_loaders(settings),
            default=settings.default_model,
            checks=build_checks(settings),
            retry_seconds=settings.load_retry_seconds,
            retry_max_seconds=settings.load_retry_max_seconds,
        )
        self.cache = LRUCache(max_entries=settings.cache_size, max_bytes=settings.cache_max_bytes)
        self._batchers = {
            name: Batcher(
                partial(self._run_batch, name),
                workers=settings.max_concurrency,
                max_batch=settings.max_batch,
                max_queue=settings.max_queue,
                is_long=_is_long,
                name=name,
            )
            for name in self.registry.names
        }
        self._flights = Flights()
        # Encoding threads of their own, apart from anyio's pool (which sync routes such as /api/health
        # use) and at a lower CPU priority, like the workers: a burst of encodings queues here and never
        # takes the CPU or the threads that the event loop and the health check need.
        self._encoder: ThreadPoolExecutor | None = None
        self._streams = 0  # streamed answers in progress
        self._stream_slots: asyncio.Semaphore | None = None  # made on the running loop
        self._stream_waiting = 0
        self._trim_handle: asyncio.TimerHandle | None = None
        self._last_trim = time.monotonic()

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Called from the lifespan: allocator and thread settings, startup checks, the default model."""
        if self.settings.malloc_arena_max:
            memory.limit_arenas(self.settings.malloc_arena_max)  # before the workers' threads allocate
        # One pool of intra-op threads for the whole process; with max_concurrency forwards in flight
        # more threads than cores only adds contention.
        torch.set_num_threads(self.settings.threads)
        self._encoder_pool()
        self._stream_slots = asyncio.Semaphore(self.settings.max_streams)  # on this loop
        started = time.perf_counter()
        await to_thread.run_sync(self.registry.check_all)  # cheap; /api/models shows failures at once
        try:
            await to_thread.run_sync(self.registry.get, None)
        except Exception:
            # Reported by /api/health and /api/models; the rest of the service still answers.
            logger.exception("default model %r failed to load", self.registry.default)
        else:
            logger.info("default model ready in %.1f s", time.perf_counter() - started)

    def stop(self) -> None:
        if self._trim_handle is not None:
            self._trim_handle.cancel()
            self._trim_handle = None
        for batcher in self._batchers.values():
            batcher.close()
        if self._encoder is not None:
            self._encoder.shutdown(wait=False, cancel_futures=True)
            self._encoder = None

    # -- descriptions ----------------------------------------------------------------------------

    def health(self) -> tuple[bool, Health]:
        model = self.registry.loaded(self.registry.default)
        device = str(model.info.device) if model is not None else None
        return model is not None, Health(
            status="ok" if model is not None else "unavailable", model=self.registry.default, device=device
        )

    def models(self) -> ModelList:
        entries = []
        for entry in self.registry:
            info = entry.model.info if entry.model is not None else None
            entries.append(
                ModelEntry(
                    name=entry.name,
                    family=info.family if info else None,
                    layers=info.layers if info else None,
                    heads=info.heads if info else None,
                    max_tokens=info.max_tokens if info else None,
                    causal=info.causal if info else None,
                    pretrained=info.pretrained if info else None,
                    loaded=info is not None,
                    error=entry.error,
                )
            )
        return ModelList(default=self.registry.default, models=entries)

    @property
    def streams_waiting(self) -> int:
        """Large answers waiting for their turn to be streamed (`max_streams`)."""
        return self._stream_waiting

    def queued(self, name: str) -> int:
        """Requests waiting for a worker of model `name` (abandoned ones not counted)."""
        return self._batchers[name].queued

    # -- answers ---------------------------------------------------------------------------------

    async def attention_json(self, request: AttentionRequest) -> bytes | AsyncIterator[bytes]:
        """The JSON bytes, or (more than STREAM_VALUES values) a `Stream` of chunks encoded as sent.

        A streamed answer keeps its tensor (75 MB at 512 tokens) until its client has read the last byte,
        at the client's pace: at most `max_streams` are streamed at once, so memory stays bounded however
        many clients ask. A long text takes its turn before its forward; a short one that still makes a
        large answer (512 tokens of CJK, say) lets go of its tensor while it waits."""
        name = self.registry.resolve(request.model)
        key = ("json", *_input_key(name, request), request.words)
        hit = self.cache.get(key)
        if hit is not None:
            return hit  # type: ignore[no-any-return]
        view_of = partial(self._view, name, request.text, request.text_pair, words=request.words)
        slot = None
        if _chars(request.text, request.text_pair) > BATCH_CHARS:
            slot = await self._stream_slot()
        try:
            view = await view_of()
            if view.attentions.numel() <= STREAM_VALUES:
                return await self._encoded_once(key, partial(_attention_body, view))
            if slot is None:
                del view  # not held while waiting for a turn
                slot = await self._stream_slot()
                view = await view_of()  # from the cache, unless evicted meanwhile
            stream = Stream(
                encoders.pieces(_attention_body(view)),
                self._off_loop,
                partial(self._stream_closed, f"/api/attention ({view.header['n']} tokens)", slot),
            )
        except BaseException:
            if slot is not None:
                slot.release()
            raise
        self._streams += 1
        return stream

    async def attention_compact(self, request: AttentionRequest, *, gzipped: bool, scheme: str) -> bytes:
        body = await self._encoded(f"hsa1.gz:{scheme}", request, partial(_encode_compact, scheme=scheme))
        # Almost every client accepts gzip; the rare one that does not pays for one decompression.
        return body if gzipped else await self._off_loop(gzip.decompress, body)

    async def head(self, request: HeadRequest) -> bytes:
        name = self.registry.resolve(request.model)
        computed = await self._view(name, request.text, request.text_pair, words=request.words)
        _check_head(name, computed, request.layer, request.head)
        body = {
            "model": name,
            "tokens": computed.header["tokens"],
            "layer": request.layer,
            "head": request.head,
            # float32 -> Python float is exact, so this is the model's full precision.
            "attention": Floats(computed.attentions[request.layer, request.head], decimals=None),
        }
        return await self._off_loop(_encode_pieces, lambda: body)

    async def head_compact(self, request: HeadRequest, *, gzipped: bool) -> bytes:
        """One head at full float32 precision as HSA1 (scheme float32-shuffled, layers = heads = 1), gzipped
        once off the loop and cached as bytes like the compact attention."""
        kind = f"head.hsa1.gz:{request.layer}:{request.head}"
        body = await self._encoded(kind, request, partial(_encode_head_compact, request=request))
        return body if gzipped else await self._off_loop(gzip.decompress, body)

    # -- insight ---------------------------------------------------------------------------------

    async def analysis(self, request: AttentionRequest) -> bytes:
        body = partial(_analysis_body, words=request.words)
        return await self._encoded("analysis", request, _json_of(body))

    async def rollout(self, request: AttentionRequest) -> bytes:
        return await self._encoded("rollout", request, _json_of(_rollout_body))

    async def rollout_compact(self, request: AttentionRequest, *, gzipped: bool, scheme: str) -> bytes:
        body = await self._encoded(
            f"rollout.gz:{scheme}", request, partial(_encode_rollout_compact, scheme=scheme)
        )
        return body if gzipped else await self._off_loop(gzip.decompress, body)

    async def flow(self, request: AttentionRequest) -> bytes:
        limit = self.settings.flow_max_tokens or analysis.FLOW_MAX_TOKENS
        name = self.registry.resolve(request.model)
        view = await self._view(name, request.text, request.text_pair, words=request.words)
        n = view.header["n"]
        if n > limit:  # refused before any work: the cost grows as n⁴
            unit = "words" if request.words else "tokens"
            raise InvalidInputError(
                f"attention flow is limited to {limit} {unit} (it solves n² max-flow problems), this input "
                f"has {n}; shorten the text or use /api/rollout"
            )
        return await self._encoded("flow", request, _json_of(partial(_flow_body, max_tokens=limit)))

    async def compare(self, request: CompareRequest) -> bytes:
        names = (self.registry.resolve(request.a.model), self.registry.resolve(request.b.model))
        key = ("compare", *_input_key(names[0], request.a), *_input_key(names[1], request.b), request.words)
        hit = self.cache.get(key)
        if hit is not None:
            return hit  # type: ignore[no-any-return]
        view_a, view_b = await self._compare_views(names, request)
        return await self._encoded_once(key, partial(_compare_body, view_a, view_b))

    async def compare_head(self, request: CompareHeadRequest) -> bytes:
        names = (self.registry.resolve(request.a.model), self.registry.resolve(request.b.model))
        view_a, view_b = await self._compare_views(names, request)
        _check_head(names[0], view_a, request.layer, request.head)
        key = (
            "compare/head",
            *_input_key(names[0], request.a),
            *_input_key(names[1], request.b),
            request.words,
            request.layer,
            request.head,
        )
        make_body = partial(_compare_head_body, view_a, view_b, request.layer, request.head)
        return await self._flights.join(
            key, lambda abandoned: self._off_loop(_encode_pieces, make_body, abandoned)
        )

    async def _compare_views(
        self, names: tuple[str, str], request: CompareRequest
    ) -> tuple[Computed, Computed]:
        view_a, view_b = await asyncio.gather(
            self._view(names[0], request.a.text, request.a.text_pair, words=request.words),
            self._view(names[1], request.b.text, request.b.text_pair, words=request.words),
        )
        shape_a = (view_a.header["layers"], view_a.header["heads"])
        shape_b = (view_b.header["layers"], view_b.header["heads"])
        if shape_a != shape_b:
            raise InvalidInputError(
                f"models are not comparable: a ({names[0]!r}) has {shape_a[0]} layers x {shape_a[1]} heads, "
                f"b ({names[1]!r}) has {shape_b[0]} layers x {shape_b[1]} heads; they must match"
            )
        return view_a, view_b

    # -- internals -------------------------------------------------------------------------------

    async def _off_loop(self, work: Callable[..., T], *args: Any) -> T:
        """CPU work in an encoding thread; waiting for a free one happens in the pool's queue, and work
        still queued when its caller is cancelled never runs."""
        return await asyncio.get_running_loop().run_in_executor(self._encoder_pool(), partial(work, *args))

    def _encoder_pool(self) -> ThreadPoolExecutor:
        if self._encoder is None:  # at start(), or after a stop() (a restarted lifespan)
            self._encoder = ThreadPoolExecutor(
                self.settings.max_concurrency, thread_name_prefix="headscope-encode", initializer=background
            )
        return self._encoder

    async def _encoded(
        self, kind: str, request: AttentionRequest, encode: Callable[[Computed, threading.Event], bytes]
    ) -> bytes:
        """A cached answer of `kind`, computed once for all identical requests in flight."""
        name = self.registry.resolve(request.model)
        key = (kind, *_input_key(name, request), request.words)
        hit = self.cache.get(key)
        if hit is not None:
            return hit  # type: ignore[no-any-return]

        async def compute(abandoned: threading.Event) -> bytes:
            computed = await self._view(name, request.text, request.text_pair, words=request.words)
            body = await self._off_loop(encode, computed, abandoned)
            self.cache.put(key, body, size=len(body))
            return body

        return await self._flights.join(key, compute)

    async def _encoded_once(self, key: Hashable, make_body: Callable[[], Any]) -> bytes:
        """JSON of make_body(), encoded once for all identical requests in flight, then cached."""

        async def compute(abandoned: threading.Event) -> bytes:
            body = await self._off_loop(_encode_pieces, make_body, abandoned)
            self.cache.put(key, body, size=len(body))
            return body

        return await self._flights.join(key, compute)

    async def _stream_slot(self) -> asyncio.Semaphore:
        """Wait for a turn to stream a large answer (on the loop, holding nothing large)."""
        if self._stream_slots is None:
            self._stream_slots = asyncio.Semaphore(self.settings.max_streams)
        if self._stream_waiting >= self.settings.max_queue:
            raise ModelBusyError(
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
        self._large_answer_done()

    async def _view(self, name: str, text: str, pair: str | None, *, words: bool) -> Computed:
        """The token-level result, or (words) its word-level merge, cached apart in the same LRU."""
        computed = await self._computed(name, text, pair)
        if not words:
            return computed
        key = ("words", name, text, pair)
        hit = self.cache.get(key)
        if hit is not None:
            return hit  # type: ignore[no-any-return]

        async def merge(_abandoned: threading.Event) -> Computed:
            merged = await self._off_loop(_merge_words, computed, (text, pair))
            self.cache.put(key, merged, size=merged.nbytes)
            return merged

        return await self._flights.join(key, merge)

    async def _computed(self, name: str, text: str, pair: str | None) -> Computed:
        key = ("result", name, text, pair)
        hit = self.cache.get(key)
        if hit is not None:
            return hit  # type: ignore[no-any-return]

        async def forward(abandoned: threading.Event) -> Computed:
            try:
                future = self._batchers[name].submit(text, pair, abandoned=abandoned)
            except QueueFull as full:
                raise ModelBusyError(
                    f"model {name!r} is busy: {full.queued} requests are already waiting for it (the limit)",
                    full.retry_after,
                ) from None
            return await _result(future)

        computed = await self._flights.join(key, forward)
        if computed.nbytes >= LARGE_BYTES:
            self._large_answer_done()
        return computed

    # -- memory ----------------------------------------------------------------------------------

    def _large_answer_done(self) -> None:
        """After a large answer: trim now if the last trim is long past (continuous load), else once the
        service has been idle for IDLE_TRIM_SECONDS."""
        if not self.settings.malloc_trim:
            return
        loop = asyncio.get_running_loop()
        if time.monotonic() - self._last_trim >= TRIM_INTERVAL:
            self._start_trim(loop)
        if self._trim_handle is not None:
            self._trim_handle.cancel()
        self._trim_handle = loop.call_later(IDLE_TRIM_SECONDS, self._trim_if_idle, loop)

    def _trim_if_idle(self, loop: asyncio.AbstractEventLoop) -> None:
        self._trim_handle = None
        if len(self._flights) or self._streams:  # still busy: look again later
            self._trim_handle = loop.call_later(IDLE_TRIM_SECONDS, self._trim_if_idle, loop)
            return
        self._start_trim(loop)

    def _start_trim(self, loop: asyncio.AbstractEventLoop) -> None:
        self._last_trim = time.monotonic()
        # malloc_trim releases the GIL (ctypes) and takes a few ms per GB: a default-pool thread.
        loop.run_in_executor(None, memory.trim)

    # -- worker threads --------------------------------------------------------------------------

    def _run_batch(self, name: str, jobs: list[Job]) -> None:
        """Worker thread: load the model if needed, then run the jobs in as few forwards as sensible."""
        try:
            _, model = self.registry.get(name)
        except ServiceError as exc:
            for job in jobs:
                job.future.set_exception(exc)
            return
        self._forward(name, model, jobs)  # the Batcher's batches are short texts, or one long one

    def _forward(self, name: str, model: Any, group: list[Job]) -> None:
        live = [job for job in group if not _drop_if_abandoned(job)]
        if not live:
            return
        limit = min(self.settings.max_tokens, model.info.max_tokens)
        started = time.perf_counter()
        try:
            with torch.inference_mode():
                results = model.attend_batch(
                    [(j.text, j.pair) for j in live],
                    max_tokens=limit,
                    hidden_state=False,
                    # Between layers: stop once every client of this batch has gone.
                    cancel=lambda: all(job.abandoned.is_set() for job in live),
                )
        except Cancelled as exc:
            logger.info("model %r: forward of %d stopped, their clients have gone: %s", name, len(live), exc)
            for job in live:
                job.future.set_exception(exc)
            return
        except Exception as exc:
            if len(live) > 1:  # one bad input must not fail its batch-mates: run each alone
                for job in live:
                    self._forward(name, model, [job])
                return
            # Every input mha refuses is the client's to fix (422); only the empty case needs a hint.
            if isinstance(exc, mha.EmptyInputError):
                exc = InvalidInputError(f"{exc}; give text the tokenizer turns into at least one token")
            elif isinstance(exc, mha.InputError):
                exc = InvalidInputError(str(exc))
            live[0].future.set_exception(exc)
            return
        # Never log the texts: only sizes and cost.
        logger.debug(
            "model %r: batch of %d in %.1f ms", name, len(live), 1000 * (time.perf_counter() - started)
        )
        for job, result in zip(live, results, strict=True):
            computed = self._to_computed(name, model, result)
            self.cache.put(("result", name, job.text, job.pair), computed, size=computed.nbytes)
            job.future.set_result(computed)

    @staticmethod
    def _to_computed(name: str, model: Any, result: Any) -> Computed:
        attentions = result.attentions.to(device="cpu", dtype=torch.float32)
        if not attentions.is_contiguous() or attentions.untyped_storage().nbytes() > 4 * attentions.numel():
            # A row of a padded batch: copy it, so the cache never keeps a whole batch's buffer alive.
            attentions = attentions.clone(memory_format=torch.contiguous_format)
        L, H, n, _ = attentions.shape
        header = {
            "model": name,
            "tokens": list(result.tokens),
            "segments": list(result.segments),
            "special": [bool(s) for s in result.special],
            "layers": int(L),
            "heads": int(H),
            "n": int(n),
            "truncated": bool(result.truncated),
            "causal": bool(model.info.causal),
        }
        return Computed(
            header,
            attentions,
            word_ids=tuple(result.word_ids),
            offsets=tuple((int(start), int(end)) for start, end in result.offsets),
        )


def _input_key(name: str, request: InputText) -> tuple[str, str, str | None]:
    return (name, request.text, request.text_pair)


def _check_head(name: str, computed: Computed, layer: int, head: int) -> None:
    layers, heads = computed.header["layers"], computed.header["heads"]
    if layer >= layers:
        raise InvalidInputError(f"layer {layer} is out of range: {name!r} has layers 0..{layers - 1}")
    if head >= heads:
        raise InvalidInputError(f"head {head} is out of range: {name!r} has heads 0..{heads - 1}")


def _attention_body(view: Computed) -> dict[str, Any]:
    return {**view.header, "attention": Floats(view.attentions)}  # 6 decimals (float64 first)


def _json_of(make_body: Callable[[Computed], Any]) -> Callable[[Computed, threading.Event], bytes]:
    """An encoder for `AttentionService._encoded`: the JSON of make_body(computed), in pieces."""
    return lambda computed, abandoned: _encode_pieces(partial(make_body, computed), abandoned)


def _merge_words(computed: Computed, texts: tuple[str, str | None]) -> Computed:
    """Word-level view: pieces grouped by the tokenizer's word ids, labels sliced from the text by offsets."""
    header = computed.header
    groups = analysis.word_groups_from(computed.word_ids, header["segments"], header["special"]).groups
    labels = analysis.word_labels(
        header["tokens"], groups, offsets=computed.offsets, segments=header["segments"], texts=texts
    )
    merged = analysis.merge_to_words(computed.attentions, groups).contiguous()
    word_header = {
        **header,
        "tokens": labels,
        # A group never mixes segments, and special tokens are groups of their own.
        "segments": [header["segments"][group[0]] for group in groups],
        "special": [header["special"][group[0]] for group in groups],
        "n": len(groups),
    }
    return Computed(word_header, merged)


def _encode_compact(computed: Computed, _abandoned: threading.Event, *, scheme: str) -> bytes:
    # numpy and zlib release the GIL for nearly all of this.
    return compact.compress(compact.encode(computed.header, computed.attentions, scheme=scheme))


def _encode_head_compact(computed: Computed, _abandoned: threading.Event, *, request: HeadRequest) -> bytes:
    layer, head = request.layer, request.head
    _check_head(computed.header["model"], computed, layer, head)
    header = {**computed.header, "layers": 1, "heads": 1, "layer": layer, "head": head}
    one = computed.attentions[layer : layer + 1, head : head + 1]  # [1, 1, n, n]
    return compact.compress(compact.encode(header, one, scheme="float32-shuffled"))


def _analysis_body(computed: Computed, *, words: bool) -> dict[str, Any]:
    header = computed.header
    layers, heads = header["layers"], header["heads"]
    stats = analysis.head_stats(
        computed.attentions, header["tokens"], special=header["special"], causal=header["causal"]
    )
    k = min(SIMILAR_HEADS, layers * heads - 1)
    # Statistics and distances to 6 decimals, as every JSON answer: the full float repr doubled the bytes.
    similar = [
        [
            [[ly, hd, round(float(d), 6)] for ly, hd, d in analysis.similar_heads(stats, layer, head, k=k)]
            if k > 0
            else []
            for head in range(heads)
        ]
        for layer in range(layers)
    ]
    return {
        "model": header["model"],
        "tokens": header["tokens"],
        "n": header["n"],
        "layers": layers,
        "heads": heads,
        "words": words,
        "stats": {name: Floats(value) for name, value in stats.items()},
        "stat_descriptions": {name: analysis.STAT_DESCRIPTIONS[name] for name in stats},
        "labels": analysis.head_labels(stats),
        "thresholds": {
            "pointer": analysis.POINTER_THRESHOLD,
            "broad": analysis.BROAD_THRESHOLD,
            "local": analysis.LOCAL_THRESHOLD,
        },
        "similar": similar,
    }


def _rollout_body(computed: Computed) -> dict[str, Any]:
    per_layer = analysis.rollout_per_layer(computed.attentions, residual=ROLLOUT_RESIDUAL)
    header = computed.header
    return {
        "model": header["model"],
        "tokens": header["tokens"],
        "n": header["n"],
        "layers": header["layers"],
        "residual": ROLLOUT_RESIDUAL,
        "rollout": Floats(per_layer[-1]),
        "per_layer": Floats(per_layer),
    }


def _encode_rollout_compact(computed: Computed, _abandoned: threading.Event, *, scheme: str) -> bytes:
    per_layer = analysis.rollout_per_layer(computed.attentions, residual=ROLLOUT_RESIDUAL)  # [L, n, n]
    header = {**computed.header, "heads": 1, "residual": ROLLOUT_RESIDUAL}
    return compact.compress(compact.encode(header, per_layer.unsqueeze(1), scheme=scheme))  # [L, 1, n, n]


def _flow_body(computed: Computed, *, max_tokens: int) -> dict[str, Any]:
    # One max-flow run gives both forms: the raw values and the rows normalised as the paper publishes them.
    flow = analysis.attention_flow(computed.attentions, max_tokens=max_tokens, residual=ROLLOUT_RESIDUAL)
    header = computed.header
    return {
        "model": header["model"],
        "tokens": header["tokens"],
        "n": header["n"],
        "flow": Floats(flow),
        "flow_normalized": Floats(analysis.normalize_flow(flow.double()).float()),
    }


def _pairs(view_a: Computed, view_b: Computed) -> list[tuple[int, int]]:
    pairs = analysis.align_tokens(view_a.header["tokens"], view_b.header["tokens"], include_replaced=True)
    if not pairs:
        raise InvalidInputError(
            "a and b share no aligned token to compare; with two tokenizers, compare words (words: true)"
        )
    return pairs


def _compare_body(view_a: Computed, view_b: Computed) -> dict[str, Any]:
    pairs = _pairs(view_a, view_b)
    # One layer at a time: the restricted maps of a 512-token input are ~75 MB per copy for all layers.
    scores, kept_a, kept_b = [], [], []
    for layer in range(view_a.header["layers"]):
        result = analysis.compare_aligned(
            view_a.attentions[layer : layer + 1], view_b.attentions[layer : layer + 1], pairs
        )
        scores.append(result.js[0])
        kept_a.append(result.kept_a[0])
        kept_b.append(result.kept_b[0])
    tokens_a = view_a.header["tokens"]
    return {
        "a": {"model": view_a.header["model"], "tokens": tokens_a},
        "b": {"model": view_b.header["model"], "tokens": view_b.header["tokens"]},
        "pairs": [list(pair) for pair in pairs],
        "tokens": [tokens_a[i] for i, _ in pairs],
        "layers": view_a.header["layers"],
        "heads": view_a.header["heads"],
        "score": torch.stack(scores).tolist(),
        "kept_a": torch.stack(kept_a).tolist(),
        "kept_b": torch.stack(kept_b).tolist(),
    }


def _compare_head_body(view_a: Computed, view_b: Computed, layer: int, head: int) -> dict[str, Any]:
    pairs = _pairs(view_a, view_b)
    one = (slice(layer, layer + 1), slice(head, head + 1))
    result = analysis.compare_aligned(view_a.attentions[one], view_b.attentions[one], pairs)
    tokens_a = view_a.header["tokens"]
    return {
        "tokens": [tokens_a[i] for i, _ in pairs],
        "layer": layer,
        "head": head,
        # float32 -> Python float is exact: full precision, as /api/attention/head.
        "a": Floats(result.a[0, 0], decimals=None),
        "b": Floats(result.b[0, 0], decimals=None),
        "diff": Floats(result.difference[0, 0], decimals=None),
    }


def _chars(text: str, pair: str | None) -> int:
    return len(text) + len(pair or "")


def _is_long(job: Job) -> bool:
    return _chars(job.text, job.pair) > BATCH_CHARS


@dataclass(eq=False)
class Job:
    text: str
    pair: str | None
    # Set (by the service) when every client waiting for this job has gone: the job is dropped before
    # its forward, or its forward stops between layers.
    abandoned: threading.Event = field(default_factory=threading.Event)
    future: Future[Computed] = field(default_factory=Future)
    submitted: float = field(default_factory=time.monotonic)


def _drop_if_abandoned(job: Job) -> bool:
    if not job.abandoned.is_set():
        return False
    if not job.future.done():
        job.future.set_exception(Cancelled("dropped before its forward: its clients have gone"))
    return True


class QueueFull(Exception):
    def __init__(self, queued: int, retry_after: int) -> None:
        super().__init__(f"{queued} jobs queued")
        self.queued = queued
        self.retry_after = retry_after


@dataclass(eq=False)
class _Queue:
    """One generation of a Batcher's queue: its workers drain it and exit once it is closed and empty."""

    jobs: deque[Job] = field(default_factory=deque)
    ready: threading.Condition = field(default_factory=threading.Condition)
    closed: bool = False


class Batcher:
    """Worker threads for one model. Each takes every short job waiting at that moment (up to `max_batch`)
    and runs them together: under load, many small forwards become a few larger ones, which the CPU runs
    far more efficiently; when idle, a job runs alone at once (no waiting window). Long jobs (`is_long`)
    run one at a time, after the short ones waiting, unless one has waited `long_wait` seconds: a 9-token
    request never queues behind a row of 512-token ones, and those still run under a stream of short ones.
    At most `max_queue` live jobs wait (abandoned ones do not count, and are dropped when a worker meets
    them); `submit` raises `QueueFull` beyond. Threads start on first use."""

    def __init__(
        self,
        run: Callable[[list[Job]], None],
        *,
        workers: int,
        max_batch: int,
        name: str,
        max_queue: int = 64,
        is_long: Callable[[Job], bool] | None = None,
        long_wait: float = 5.0,
    ) -> None:
        if workers < 1 or max_batch < 1 or max_queue < 1:
            raise ValueError(
                f"workers ({workers}), max_batch ({max_batch}) and max_queue ({max_queue}) must be >= 1"
            )
        self._run = run
        self._workers = workers
        self._max_batch = max_batch
        self._max_queue = max_queue
        self._is_long = is_long or (lambda _job: False)
        self._long_wait = long_wait
        self._name = name
        self._queue = _Queue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()  # guards _queue and _threads (each _Queue has its own condition)
        self._seconds_per_job = 1.0  # moving average, for Retry-After

    @property
    def queued(self) -> int:
        """Jobs waiting for a worker whose clients are still there."""
        with self._lock:
            q = self._queue
        with q.ready:
            return sum(not job.abandoned.is_set() for job in q.jobs)

    def submit(
        self, text: str, pair: str | None, *, abandoned: threading.Event | None = None
    ) -> Future[Computed]:
        job = Job(text, pair) if abandoned is None else Job(text, pair, abandoned=abandoned)
        with self._lock:
            if not self._threads:  # first use, or first use after close(): a fresh set of workers
                self._queue = _Queue()
                self._threads = [
                    threading.Thread(
                        target=self._loop,
                        args=(self._queue,),
                        name=f"headscope-{self._name}-{i}",
                        daemon=True,
                    )
                    for i in range(self._workers)
                ]
                for thread in self._threads:
                    thread.start()
            q = self._queue
            with q.ready:
                queued = sum(not waiting.abandoned.is_set() for waiting in q.jobs)
                if queued >= self._max_queue:
                    wait = queued * self._seconds_per_job / self._workers
                    raise QueueFull(queued, retry_after=max(1, min(120, math.ceil(wait))))
                q.jobs.append(job)
                q.ready.notify()
        return job.future

    def close(self) -> None:
        """Workers finish what is queued, then exit; a later submit() starts new ones on a new queue."""
        with self._lock:
            q = self._queue
            with q.ready:
                q.closed = True
                q.ready.notify_all()
            self._threads = []

    def _take(self, q: _Queue) -> list[Job]:
        """Under q.ready: the next batch (abandoned jobs dropped), or [] when nothing is waiting."""
        for job in [job for job in q.jobs if _drop_if_abandoned(job)]:
            q.jobs.remove(job)
        if not q.jobs:
            return []
        longs = [job for job in q.jobs if self._is_long(job)]
        if longs and (len(longs) == len(q.jobs) or time.monotonic() - longs[0].submitted >= self._long_wait):
            q.jobs.remove(longs[0])
            return [longs[0]]
        batch = [job for job in q.jobs if not self._is_long(job)][: self._max_batch]
        for job in batch:
            q.jobs.remove(job)
        return batch

    def _loop(self, q: _Queue) -> None:
        background()
        while True:
            with q.ready:
                while not (jobs := self._take(q)):
                    if q.closed:
                        return
                    q.ready.wait()
            jobs = [job for job in jobs if job.future.set_running_or_notify_cancel()]
            if not jobs:
                continue
            started = time.perf_counter()
            try:
                self._run(jobs)
            except Exception as exc:  # a bug in _run must fail its requests, not kill the worker
                logger.exception("batch failed")
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(exc)
            per_job = (time.perf_counter() - started) / len(jobs)
            self._seconds_per_job = 0.8 * self._seconds_per_job + 0.2 * per_job
