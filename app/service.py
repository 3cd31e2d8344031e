"""The one module of app/ that uses `mha`: models, inference off the event loop, caching, encoding.

Routes call `AttentionService`; it resolves the model by registered name and hands the text to that
model's `Batcher`: `max_concurrency` worker threads per model, each taking every request waiting at that
moment (up to `max_batch`) into one padded forward (`model.attend_batch`) under `torch.inference_mode()`.
The event loop only awaits. Finished answers (the result tensor, the JSON bytes, the gzipped compact bytes)
are cached by (model, text, pair), and identical requests in flight share one computation.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import torch
from anyio import to_thread

import mha
from app import compact
from app.cache import LRUCache
from app.errors import InvalidInputError, ServiceError
from app.registry import Registry, scan_models_dir
from app.schemas import AttentionRequest, HeadRequest, Health, ModelEntry, ModelList
from app.settings import DEFAULT_MODEL, Settings

logger = logging.getLogger(__name__)

# Texts longer than this (in characters, both segments) run alone: padding a short text to a long one's
# length would cost more than batching saves.
BATCH_CHARS = 600
# The size of the "random" model (our layers, untrained weights), documented in /api/models and README.
RANDOM_MODEL = "random"
RANDOM_SIZE = {"layers": 4, "heads": 8, "embed_dim": 256}


@dataclass(frozen=True)
class Computed:
    """What the service keeps of an `mha.AttentionResult`: the header fields and the attention."""

    header: dict[str, Any]
    attentions: torch.Tensor  # float32 CPU [L, H, n, n]


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
    paths = scan_models_dir(settings.models_dir) if settings.models_dir is not None else {}
    paths.update(settings.models)
    for name, path in paths.items():
        loaders[name] = partial(
            mha.load_pretrained, str(path), device=settings.device, dtype=dtype, name=name
        )
    return loaders


class AttentionService:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.registry: Registry[Any] = Registry(build_loaders(settings), default=settings.default_model)
        self.cache = LRUCache(max_entries=settings.cache_size, max_bytes=settings.cache_max_bytes)
        self._batchers = {
            name: Batcher(
                partial(self._run_batch, name),
                workers=settings.max_concurrency,
                max_batch=settings.max_batch,
                name=name,
            )
            for name in self.registry.names
        }
        self._inflight: dict[Hashable, Future[Computed]] = {}
        # The JSON of a 512-token answer is ~200 MB of text built from ~19 M Python floats: bound how many
        # encodings run at once so a burst of long requests cannot exhaust memory.
        self._encode_slots = threading.BoundedSemaphore(settings.max_concurrency)
        self._inflight_lock = threading.Lock()

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Called from the lifespan: thread settings and the default model."""
        # One pool of intra-op threads for the whole process; with max_concurrency forwards in flight
        # more threads than cores only adds contention.
        torch.set_num_threads(self.settings.threads)
        started = time.perf_counter()
        try:
            await to_thread.run_sync(self.registry.get, None)
        except Exception:
            # Reported by /api/health and /api/models; the rest of the service still answers.
            logger.exception("default model %r failed to load", self.registry.default)
        else:
            logger.info("default model ready in %.1f s", time.perf_counter() - started)

    def stop(self) -> None:
        for batcher in self._batchers.values():
            batcher.close()

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

    # -- answers ---------------------------------------------------------------------------------

    async def attention_json(self, request: AttentionRequest) -> bytes:
        return await self._encoded("json", request, self._encode_json)

    async def attention_compact(self, request: AttentionRequest, *, gzipped: bool, scheme: str) -> bytes:
        body = await self._encoded(f"hsa1.gz:{scheme}", request, partial(self._encode_compact, scheme=scheme))
        # Almost every client accepts gzip; the rare one that does not pays for one decompression.
        return body if gzipped else gzip.decompress(body)

    async def head(self, request: HeadRequest) -> dict[str, Any]:
        name = self.registry.resolve(request.model)
        computed = await self._computed(name, request.text, request.text_pair)
        layers, heads = computed.header["layers"], computed.header["heads"]
        if request.layer >= layers:
            raise InvalidInputError(
                f"layer {request.layer} is out of range: {name!r} has layers 0..{layers - 1}"
            )
        if request.head >= heads:
            raise InvalidInputError(f"head {request.head} is out of range: {name!r} has heads 0..{heads - 1}")
        return {
            "model": name,
            "tokens": computed.header["tokens"],
            "layer": request.layer,
            "head": request.head,
            # float32 -> Python float is exact, so this is the model's full precision.
            "attention": computed.attentions[request.layer, request.head].tolist(),
        }

    # -- internals -------------------------------------------------------------------------------

    async def _encoded(
        self, kind: str, request: AttentionRequest, encode: Callable[[Computed], bytes]
    ) -> bytes:
        name = self.registry.resolve(request.model)
        key = (kind, name, request.text, request.text_pair)
        hit = self.cache.get(key)
        if hit is not None:
            return hit  # type: ignore[no-any-return]
        computed = await self._computed(name, request.text, request.text_pair)
        body = await to_thread.run_sync(self._bounded, encode, computed)  # CPU work, off the loop
        self.cache.put(key, body, size=len(body))
        return body

    async def _computed(self, name: str, text: str, pair: str | None) -> Computed:
        key = ("result", name, text, pair)
        hit = self.cache.get(key)
        if hit is not None:
            return hit  # type: ignore[no-any-return]
        with self._inflight_lock:
            future = self._inflight.get(key)
            if future is None:  # first of its kind: queue it; later identical requests share the answer
                future = self._batchers[name].submit(text, pair)
                self._inflight[key] = future
                future.add_done_callback(lambda _f: self._forget(key))
        # shield: one client going away must not cancel the answer others with the same text await.
        return await asyncio.shield(asyncio.wrap_future(future))

    def _bounded(self, encode: Callable[[Computed], bytes], computed: Computed) -> bytes:
        with self._encode_slots:
            return encode(computed)

    def _forget(self, key: Hashable) -> None:
        with self._inflight_lock:
            self._inflight.pop(key, None)

    def _run_batch(self, name: str, jobs: list[Job]) -> None:
        """Worker thread: load the model if needed, then run the jobs in as few forwards as sensible."""
        try:
            _, model = self.registry.get(name)
        except ServiceError as exc:
            for job in jobs:
                job.future.set_exception(exc)
            return
        short = [j for j in jobs if len(j.text) + len(j.pair or "") <= BATCH_CHARS]
        groups = ([short] if short else []) + [[j] for j in jobs if j not in short]
        for group in groups:
            self._forward(name, model, group)

    def _forward(self, name: str, model: Any, group: list[Job]) -> None:
        limit = min(self.settings.max_tokens, model.info.max_tokens)
        started = time.perf_counter()
        try:
            with torch.inference_mode():
                results = model.attend_batch([(j.text, j.pair) for j in group], max_tokens=limit)
        except Exception as exc:
            if len(group) > 1:  # one bad input must not fail its batch-mates: run each alone
                for job in group:
                    self._forward(name, model, [job])
                return
            if isinstance(exc, mha.EmptyInputError):
                exc = InvalidInputError(f"{exc}; give text the tokenizer turns into at least one token")
            group[0].future.set_exception(exc)
            return
        # Never log the texts: only sizes and cost.
        logger.debug(
            "model %r: batch of %d in %.1f ms", name, len(group), 1000 * (time.perf_counter() - started)
        )
        for job, result in zip(group, results, strict=True):
            computed = self._to_computed(name, model, result)
            self.cache.put(
                ("result", name, job.text, job.pair), computed, size=computed.attentions.numel() * 4
            )
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
        return Computed(header, attentions)

    @staticmethod
    def _encode_json(computed: Computed) -> bytes:
        rounded = np.round(computed.attentions.numpy().astype(np.float64), 6)
        body = {**computed.header, "attention": rounded.tolist()}
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")

    @staticmethod
    def _encode_compact(computed: Computed, *, scheme: str) -> bytes:
        return compact.compress(compact.encode(computed.header, computed.attentions, scheme=scheme))


@dataclass(eq=False)
class Job:
    text: str
    pair: str | None
    future: Future[Computed] = field(default_factory=Future)


class Batcher:
    """Worker threads for one model. Each takes every job waiting at that moment (up to `max_batch`) and
    runs them together: under load, many small forwards become a few larger ones, which the CPU runs far
    more efficiently; when idle, a job runs alone at once (no waiting window). Threads start on first use."""

    def __init__(self, run: Callable[[list[Job]], None], *, workers: int, max_batch: int, name: str) -> None:
        if workers < 1 or max_batch < 1:
            raise ValueError(f"workers ({workers}) and max_batch ({max_batch}) must be >= 1")
        self._run = run
        self._workers = workers
        self._max_batch = max_batch
        self._name = name
        self._queue: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def submit(self, text: str, pair: str | None) -> Future[Computed]:
        job = Job(text, pair)
        with self._lock:
            if not self._threads:  # first use, or first use after close(): a fresh set of workers
                self._queue = queue.SimpleQueue()
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
            self._queue.put(job)
        return job.future

    def close(self) -> None:
        """Workers finish what is queued, then exit; a later submit() starts new ones on a new queue."""
        with self._lock:
            for _ in self._threads:
                self._queue.put(None)
            self._threads = []

    def _loop(self, jobs_queue: queue.SimpleQueue[Job | None]) -> None:
        while True:
            first = jobs_queue.get()
            if first is None:
                return
            jobs = [first]
            while len(jobs) < self._max_batch:
                try:
                    job = jobs_queue.get_nowait()
                except queue.Empty:
                    break
                if job is None:  # closing: finish this batch, then let a thread see the sentinel
                    jobs_queue.put(None)
                    break
                jobs.append(job)
            # Cancelled futures (never, with the service's shield) are dropped before any work.
            live = [job for job in jobs if job.future.set_running_or_notify_cancel()]
            if not live:
                continue
            try:
                self._run(live)
            except Exception as exc:  # a bug in _run must fail its requests, not kill the worker
                logger.exception("batch failed")
                for job in live:
                    if not job.future.done():
                        job.future.set_exception(exc)
