"""`ServiceCore`: what every answer of a text is built from. Resolves the model, runs its forwards through
the model's `Batcher` (the worker threads' side is here too), caches the results and the views of them
(words, weighting "norm") and shares identical work in flight under one key builder (`cache_key`), and
runs CPU work in the encoding threads, off the event loop (see the package docstring). Models load on
threads of their own (loads.py), never in the encoding threads, and the startup's work runs in the
background.

The answers are built on it, one module per route family: attention.py (`AttentionService`, the class the
routes call), insight.py; traces.py, effects.py and corpus.py hold their own state and are handed the
core's `_submit_work`, `_off_loop` and `_cached`."""

from __future__ import annotations

import asyncio
import gzip
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import torch
from starlette.exceptions import HTTPException

import mha
from app import memory
from app.cache import LRUCache
from app.errors import InvalidInputError, ServiceError
from app.registry import Registry
from app.schemas.attention import AttentionRequest, InputText
from app.service import bodies
from app.service.batcher import Batcher, Job, QueueFull, background, drop_if_abandoned
from app.service.computed import Computed, article, from_result, merge_words, weigh_by_norm
from app.service.flights import Flights, settled
from app.service.loads import Loads, warm_imports
from app.service.offers import default_model, find_models
from app.service.trim import Trimmer
from app.service.work_watch import WorkWatch
from app.settings import Settings
from mha.errors import Cancelled
from mha.loading import gguf_checkpoint, gguf_packed, load_memory
from mha.networks import translate

logger = logging.getLogger(__name__)

# Texts longer than this (in characters, both segments) run alone: padding a short text to a long one's
# length would cost more than batching saves.
BATCH_CHARS = 600

T = TypeVar("T")
V = TypeVar("V", bytes, Computed)
# (registered model name, text, pair, tokens to write (None: the model's default), chat template, an
# encoder-decoder's target): what a forward depends on
Input = tuple[str, str, str | None, int | None, bool, str | None]


class TooManyWaitingError(HTTPException):
    """503 with Retry-After: too many requests already wait (for a model, or to stream a large answer).
    An HTTPException rather than a ServiceError because app/errors.py's ServiceError handler does not
    pass headers; its HTTPException handler does."""

    def __init__(self, detail: str, retry_after: int) -> None:
        super().__init__(
            503, f"{detail}; try again in {retry_after} s", headers={"Retry-After": str(retry_after)}
        )


def cache_key(kind: str, *inputs: Input, extra: tuple[Hashable, ...] = ()) -> tuple[Hashable, ...]:
    """The one key of everything cached or shared in flight: what it is, then what it is computed from."""
    return (kind, *(part for one in inputs for part in one), *extra)


GENERATE = ""  # the target of a request with generate: true (a real target is never blank)


def chars(text: str, pair: str | None, target: str | None = None) -> int:
    """An input's length in characters, both segments and the target (what BATCH_CHARS counts)."""
    return len(text) + len(pair or "") + len(target or "")


def _load_needs(
    paths: Mapping[str, str | Path], *, dequant_cache_bytes: int | None
) -> Callable[[str, object], int | None]:
    """What loading a registered model needs, read before loading it (Registry's `estimate`): for a GGUF,
    the larger of its predicted first-load memory (mha.loading.load_memory: from its header, milliseconds;
    issue 33's stated model of a load) and what its model holds once loaded, its dequantized-weight cache
    at what it can fill included, as the registry counts it after the load (issue 48 E4: the two agree, so
    a model over the budget is refused before it is loaded); else its weights' size on disk (a lower
    bound: a folder's weights load at least as large); None when its startup check read no file."""
    cache = gguf_packed.DEFAULT_DEQUANT_CACHE_BYTES if dequant_cache_bytes is None else dequant_cache_bytes

    def needs(name: str, found: object) -> int | None:
        if not isinstance(found, mha.CheckpointFacts):
            return None
        gguf = gguf_checkpoint.find_gguf(paths.get(name))
        if gguf is None:
            return found.size_bytes
        return max(found.size_bytes, load_memory.load_need(gguf, cache))

    return needs


def result_key(source: Input, *, norms: bool) -> tuple[Hashable, ...]:
    """The key a forward's result is cached and shared in flight under: one with the value norms kept
    (weighting "norm") apart from one without."""
    return cache_key("result.norms" if norms else "result", source)


def _source(name: str, job: Job) -> Input:
    """The input a forward's job is of, as `ServiceCore._input` made it."""
    return (name, job.text, job.pair, job.new_tokens, job.chat, job.target)


def _is_long(job: Job) -> bool:
    # A continuation runs its own forwards, one per new token: never batched with others; so does an
    # encoder-decoder's target (`_forward` runs an encoder-decoder's batch one job at a time anyway).
    # A chat-templated text too: a batch is all one way (attend_batch's chat flag).
    # Other work (a trace) runs alone as well.
    long = job.work is not None or bool(job.new_tokens) or job.target is not None or job.chat
    return long or chars(job.text, job.pair, job.target) > BATCH_CHARS


@dataclass(frozen=True)
class Hooks:
    """What the route families that keep state of their own (traces.py, effects.py) use of the core."""

    # submit(name, work, abandoned): work(model) on the model's workers, queued with its long forwards
    submit: Callable[[str, Callable[[Any], Any], threading.Event], Future[Any]]
    # off_loop(work, *args): short CPU work in the encoding threads
    off_loop: Callable[..., Awaitable[Any]]
    # cached(key, compute): the answers' cache, with identical work in flight shared
    cached: Callable[[Hashable, Callable[[threading.Event], Awaitable[bytes]]], Awaitable[bytes]]
    # cache_get(key): a plain look-up in that cache
    cache_get: Callable[[Hashable], Any]
    # model(name): the loaded model, awaited while it loads on a loader thread (loads.py)
    model: Callable[[str], Awaitable[Any]]


class ServiceCore:
    """The state every answer shares: the registry, the cache, each model's Batcher, the flights, the
    encoding threads and the C heap's trimmer."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.progress = WorkWatch()  # loads' and forwards' progress, for those watching (work_watch.py)
        offers = find_models(settings, progress=self.progress.load_reporter)  # every folder and store, once
        self.sources = {name: offer.source for name, offer in offers.items()}  # for /api/models
        self.registry: Registry[mha.AttentionModel] = Registry(
            {name: offer.loader for name, offer in offers.items()},
            default=default_model(settings),
            checks={name: offer.check for name, offer in offers.items() if offer.check is not None},
            retry_seconds=settings.load_retry_seconds,
            retry_max_seconds=settings.load_retry_max_seconds,
            max_bytes=settings.models_budget(),
            size_of=lambda model: model.nbytes,
            estimate=_load_needs(
                {n: o.path for n, o in offers.items() if o.path is not None},
                dequant_cache_bytes=settings.dequant_cache_bytes,
            ),
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
        self.loads = Loads(lambda: self.registry, prepare=warm_imports, ended=self.progress.load_ended)
        self._flights = Flights()
        # Encoding threads of their own, apart from anyio's pool (which sync routes such as /api/health
        # use) and at a lower CPU priority, like the workers: a burst of encodings queues here and never
        # takes the CPU or the threads that the event loop and the health check need.
        self._encoder: ThreadPoolExecutor | None = None
        self._trimmer = Trimmer(enabled=settings.malloc_trim, busy=self._busy)

    def hooks(self) -> Hooks:
        return Hooks(self._submit_work, self._off_loop, self._cached, self.cache.get, self.loads.model)

    def _busy(self) -> bool:
        """Work is in flight (the idle trim waits for it); AttentionService adds its streams and traces."""
        return bool(len(self._flights))

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Called from the lifespan: allocator and thread settings; the startup checks and the default
        model's load start in the background (loads.py), so this returns at once."""
        if self.settings.malloc_arena_max:
            memory.limit_arenas(self.settings.malloc_arena_max)  # before the workers' threads allocate
        # One pool of intra-op threads for the whole process; with max_concurrency forwards in flight
        # more threads than cores only adds contention.
        torch.set_num_threads(self.settings.threads)
        self.progress.bind(asyncio.get_running_loop())
        self._encoder_pool()
        self.loads.start()

    def stop(self) -> None:
        self._trimmer.cancel()
        self.loads.stop()
        for batcher in self._batchers.values():
            batcher.close()
        if self._encoder is not None:
            self._encoder.shutdown(wait=False, cancel_futures=True)
            self._encoder = None

    def queued(self, name: str) -> int:
        """Requests waiting for a worker of model `name` (abandoned ones not counted)."""
        return self._batchers[name].queued

    def in_flight(self, source: Input) -> bool:
        """Work for `source` is in flight: its forward (waiting for its model's load included), or its
        model's load, whoever asked for it (a long input's token count waits for it too)."""
        forward = any(result_key(source, norms=norms) in self._flights for norms in (False, True))
        return forward or self.loads.loading(source[0])

    # -- caching and sharing ---------------------------------------------------------------------

    def _input(self, request: InputText) -> Input:
        name = self.registry.resolve(request.model)
        if request.max_new_tokens is not None and request.max_new_tokens > self.settings.max_new_tokens:
            raise InvalidInputError(
                f"max_new_tokens ({request.max_new_tokens}) is over this service's limit "
                f"({self.settings.max_new_tokens}, HEADSCOPE_MAX_NEW_TOKENS)"
            )
        # generate: "" (a blank target never gets here as one: the schema makes it None), so a model that
        # cannot write a target refuses it in _attend_one, and the cache keeps it apart from a plain request.
        target = GENERATE if request.generate else request.target
        return (name, request.text, request.text_pair, request.max_new_tokens, request.chat, target)

    async def _cached(self, key: Hashable, compute: Callable[[threading.Event], Awaitable[V]]) -> V:
        """The cached value of `key`, else computed once for all identical requests in flight and cached."""
        hit = self.cache.get(key)
        if hit is not None:
            return hit  # type: ignore[no-any-return]
        return await self._once(key, compute)

    async def _once(self, key: Hashable, compute: Callable[[threading.Event], Awaitable[V]]) -> V:
        """compute(abandoned) run once for all identical requests in flight, its value cached under `key`."""

        async def run(abandoned: threading.Event) -> V:
            value = await compute(abandoned)
            self.cache.put(key, value, size=len(value) if isinstance(value, bytes) else value.nbytes)
            return value

        return await self._flights.join(key, run)

    async def _encoded(self, kind: str, request: AttentionRequest, encode: bodies.Encoder) -> bytes:
        """The cached answer of `kind`: encode(view) of the request's view, off the loop."""
        source = self._input(request)

        async def compute(abandoned: threading.Event) -> bytes:
            view = await self._view(source, words=request.words, weighting=request.weighting)
            return await self._off_loop(encode, view, abandoned)

        return await self._cached(cache_key(kind, source, extra=(request.words, request.weighting)), compute)

    async def _view(self, source: Input, *, words: bool, weighting: str = "weight") -> Computed:
        """The token-level result; weighted by norm (computed.weigh_by_norm) for weighting "norm"; then
        (words) merged to words. Each view is cached apart in the same LRU."""
        computed = await self._computed(source, norms=weighting == "norm")
        if weighting == "norm":
            token_level = computed
            computed = await self._cached(
                cache_key("norm", source), lambda _abandoned: self._off_loop(weigh_by_norm, token_level)
            )
        if not words:
            return computed
        weighted = computed
        return await self._cached(
            cache_key("words", source, extra=(weighting,)),
            lambda _abandoned: self._off_loop(merge_words, weighted),
        )

    def _submit(self, name: str, text: str, pair: str | None, **job: Any) -> Future[Any]:
        try:
            return self._batchers[name].submit(text, pair, **job)
        except QueueFull as full:
            raise TooManyWaitingError(
                f"model {name!r} is busy: {full.queued} requests are already waiting for it (the limit)",
                full.retry_after,
            ) from None

    def _submit_work(self, name: str, work: Callable[[Any], Any], abandoned: threading.Event) -> Future[Any]:
        """work(model) on model `name`'s workers, queued with its long forwards (Traces)."""
        return self._submit(name, "", None, work=work, abandoned=abandoned)

    async def _computed(self, source: Input, *, norms: bool = False) -> Computed:
        """The forward's result, cached; `norms` asks for one that kept the value norms too (weighting
        "norm": ~10-20 % more forward, so the first view, which shows weights, does not pay it). A result
        with the norms answers for the weights as well."""
        name, text, pair, new_tokens, chat, target = source
        with_norms = result_key(source, norms=True)
        if not norms:
            hit = self.cache.get(with_norms)
            if hit is not None:
                return hit  # type: ignore[no-any-return]

        async def forward(abandoned: threading.Event) -> Computed:
            job = {"new_tokens": new_tokens, "chat": chat, "target": target, "abandoned": abandoned}
            future = self._submit(name, text, pair, norms=norms, **job)
            computed: Computed = await settled(future)
            self._trimmer.answered(computed.nbytes)
            return computed

        return await self._cached(with_norms if norms else result_key(source, norms=False), forward)

    def _attend_one(
        self, model: mha.AttentionModel, job: Job, limit: int, cancel: Callable[[], bool]
    ) -> mha.AttentionResult:
        """A continuation, or an encoder-decoder's forced or generated target (worker thread)."""
        info = model.info
        if job.target is not None and not info.seq2seq:
            what = "write a target (generate)" if job.target == GENERATE else "take a target"
            raise InvalidInputError(
                f"{info.name!r} is {article(info.architecture)} model: "
                f"only encoder-decoder models {what} (T5, BART, Marian); send no target"
            )
        new_tokens = job.new_tokens
        if info.seq2seq and new_tokens is None:
            new_tokens = min(translate.DEFAULT_NEW_TOKENS, self.settings.max_new_tokens)
        return model.attend(
            job.text,
            job.pair,
            max_tokens=limit,
            target=job.target or None,  # GENERATE: no target, the model writes it
            hidden_state=False,
            max_new_tokens=new_tokens,
            chat=job.chat,
            cancel=cancel,
            norms=job.norms,  # weighting "norm": the value norms from the same pass
        )

    # -- off the loop ----------------------------------------------------------------------------

    async def _off_loop(self, work: Callable[..., T], *args: Any) -> T:
        """CPU work in an encoding thread; waiting for a free one happens in the pool's queue, and work
        still queued when its caller is cancelled never runs."""
        return await asyncio.get_running_loop().run_in_executor(self._encoder_pool(), partial(work, *args))

    async def _gunzipped_unless(self, gzipped: bool, body: bytes) -> bytes:
        # Almost every client accepts gzip; the rare one that does not pays for one decompression.
        return body if gzipped else await self._off_loop(gzip.decompress, body)

    def _encoder_pool(self) -> ThreadPoolExecutor:
        if self._encoder is None:  # at start(), or after a stop() (a restarted lifespan)
            self._encoder = ThreadPoolExecutor(
                self.settings.max_concurrency, thread_name_prefix="headscope-encode", initializer=background
            )
        return self._encoder

    # -- worker threads --------------------------------------------------------------------------

    def _run_batch(self, name: str, jobs: list[Job]) -> None:
        """Worker thread: wait for the model's load if needed, then run the jobs in as few forwards as
        sensible."""
        try:
            model = self.loads.get(name)
        except ServiceError as exc:
            for job in jobs:
                job.future.set_exception(exc)
            return
        if jobs[0].work is not None:  # always alone (`_is_long`)
            self._work(model, jobs[0])
            return
        self._forward(name, model, jobs)  # the Batcher's batches are short texts, or one long one

    def _work(self, model: mha.AttentionModel, job: Job) -> None:
        if drop_if_abandoned(job):
            return
        assert job.work is not None
        try:
            job.future.set_result(job.work(model))
        except Exception as exc:  # Cancelled, an mha.InputError (422), ...: the caller's to map
            job.future.set_exception(exc)

    def _forward(self, name: str, model: mha.AttentionModel, group: list[Job]) -> None:
        live = [job for job in group if not drop_if_abandoned(job)]
        if not live:
            return
        if model.info.seq2seq and len(live) > 1:  # one source at a time (mha translates one at a time)
            for job in live:
                self._forward(name, model, [job])
            return
        limit = self.settings.tokens_for(model.info.max_tokens)
        started = time.perf_counter()
        sources: list[Hashable] = [_source(name, job) for job in live]
        step = self.progress.forward(sources, model.info.layers)

        # Between layers (and between new tokens): told to whoever watches each input (work_watch.py),
        # and stop once every client of this batch has gone.
        def cancel() -> bool:
            if all(job.abandoned.is_set() for job in live):
                return True
            step()
            return False

        try:
            with torch.inference_mode():
                job = live[0]
                if job.new_tokens or job.target is not None or model.info.seq2seq:  # always alone
                    results = [self._attend_one(model, job, limit, cancel)]
                else:
                    results = model.attend_batch(
                        [(j.text, j.pair) for j in live],
                        max_tokens=limit,
                        hidden_state=False,
                        chat=job.chat,  # a chat job runs alone (`_is_long`)
                        cancel=cancel,
                        norms=any(j.norms for j in live),  # one batch, one forward: kept for all
                        # A CUDA model's maps stay on its device: the compact first view is quantized there.
                        on_device=model.device.type == "cuda",
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
            live[0].future.set_exception(exc)  # an mha.InputError is mapped to 422 by app/errors.py
            return
        finally:
            self.progress.forward_ended(sources)  # the forward is over, however it ended
        # Never log the texts: only sizes and cost.
        logger.debug(
            "model %r: batch of %d in %.1f ms", name, len(live), 1000 * (time.perf_counter() - started)
        )
        for job, result in zip(live, results, strict=True):
            computed = from_result(name, model, result)
            # Cached here too: a batch-mate's result is kept even if its own clients have gone.
            key = result_key(_source(name, job), norms=computed.norms is not None)
            self.cache.put(key, computed, size=computed.nbytes)
            job.future.set_result(computed)
