"""The one module of app/ that uses `mha`: models, inference off the event loop, caching, encoding.

Routes call `AttentionService`; it resolves the model by registered name and hands the text to that
model's `Batcher`: `max_concurrency` worker threads per model, each taking every request waiting at that
moment (up to `max_batch`) into one padded forward (`model.attend_batch`) under `torch.inference_mode()`.
The event loop only awaits. Finished answers (the result tensor, the JSON bytes, the gzipped compact bytes)
are cached by (model, text, pair), and identical requests in flight share one computation.

With `words` the token-level result is merged to words (`mha.analysis`) once and cached under its own key
in the same LRU; every answer (attention, head, compact, analysis, rollout, flow, compare) is then built
from that word-level view exactly as from the token-level one. The insight answers (issue 6) are encoded
off the loop like the attention's and cached as bytes next to it.
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
from typing import Any, TypeVar

import numpy as np
import torch
from anyio import to_thread

import mha
from app import compact
from app.cache import LRUCache
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

T = TypeVar("T")


@dataclass(frozen=True)
class Computed:
    """What the service keeps of an `mha.AttentionResult`: the header fields and the attention.

    `word_ids` and `offsets` are the tokenizer's, kept to merge pieces into words; empty for a view that is
    already word-level."""

    header: dict[str, Any]
    attentions: torch.Tensor  # float32 CPU [L, H, n, n]
    word_ids: tuple[int | None, ...] = ()
    offsets: tuple[tuple[int, int], ...] = ()


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
        computed = await self._view(name, request.text, request.text_pair, words=request.words)
        _check_head(name, computed, request.layer, request.head)
        return {
            "model": name,
            "tokens": computed.header["tokens"],
            "layer": request.layer,
            "head": request.head,
            # float32 -> Python float is exact, so this is the model's full precision.
            "attention": computed.attentions[request.layer, request.head].tolist(),
        }

    # -- insight (issue 6) -----------------------------------------------------------------------

    async def analysis(self, request: AttentionRequest) -> bytes:
        return await self._encoded("analysis", request, partial(_encode_analysis, words=request.words))

    async def rollout(self, request: AttentionRequest) -> bytes:
        return await self._encoded("rollout", request, _encode_rollout)

    async def rollout_compact(self, request: AttentionRequest, *, gzipped: bool, scheme: str) -> bytes:
        body = await self._encoded(
            f"rollout.gz:{scheme}", request, partial(_encode_rollout_compact, scheme=scheme)
        )
        return body if gzipped else gzip.decompress(body)

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
        return await self._encoded("flow", request, partial(_encode_flow, max_tokens=limit))

    async def compare(self, request: CompareRequest) -> bytes:
        names = (self.registry.resolve(request.a.model), self.registry.resolve(request.b.model))
        key = ("compare", *_input_key(names[0], request.a), *_input_key(names[1], request.b), request.words)
        hit = self.cache.get(key)
        if hit is not None:
            return hit  # type: ignore[no-any-return]
        view_a, view_b = await self._compare_views(names, request)
        body = await to_thread.run_sync(self._bounded, _encode_compare, view_a, view_b)
        self.cache.put(key, body, size=len(body))
        return body

    async def compare_head(self, request: CompareHeadRequest) -> dict[str, Any]:
        names = (self.registry.resolve(request.a.model), self.registry.resolve(request.b.model))
        view_a, view_b = await self._compare_views(names, request)
        _check_head(names[0], view_a, request.layer, request.head)
        return await to_thread.run_sync(
            self._bounded, _compare_one_head, view_a, view_b, request.layer, request.head
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

    async def _encoded(
        self, kind: str, request: AttentionRequest, encode: Callable[[Computed], bytes]
    ) -> bytes:
        name = self.registry.resolve(request.model)
        key = (kind, *_input_key(name, request), request.words)
        hit = self.cache.get(key)
        if hit is not None:
            return hit  # type: ignore[no-any-return]
        computed = await self._view(name, request.text, request.text_pair, words=request.words)
        body = await to_thread.run_sync(self._bounded, encode, computed)  # CPU work, off the loop
        self.cache.put(key, body, size=len(body))
        return body

    async def _view(self, name: str, text: str, pair: str | None, *, words: bool) -> Computed:
        """The token-level result, or (words) its word-level merge, cached apart in the same LRU."""
        computed = await self._computed(name, text, pair)
        if not words:
            return computed
        key = ("words", name, text, pair)
        hit = self.cache.get(key)
        if hit is not None:
            return hit  # type: ignore[no-any-return]
        merged = await to_thread.run_sync(self._bounded, _merge_words, computed, (text, pair))
        self.cache.put(key, merged, size=merged.attentions.numel() * 4)
        return merged

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

    def _bounded(self, work: Callable[..., T], *args: Any) -> T:
        with self._encode_slots:
            return work(*args)

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
                results = model.attend_batch(
                    [(j.text, j.pair) for j in group], max_tokens=limit, hidden_state=False
                )
        except Exception as exc:
            if len(group) > 1:  # one bad input must not fail its batch-mates: run each alone
                for job in group:
                    self._forward(name, model, [job])
                return
            # Every input mha refuses is the client's to fix (422); only the empty case needs a hint.
            if isinstance(exc, mha.EmptyInputError):
                exc = InvalidInputError(f"{exc}; give text the tokenizer turns into at least one token")
            elif isinstance(exc, mha.InputError):
                exc = InvalidInputError(str(exc))
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
        return Computed(
            header,
            attentions,
            word_ids=tuple(result.word_ids),
            offsets=tuple((int(start), int(end)) for start, end in result.offsets),
        )

    @staticmethod
    def _encode_json(computed: Computed) -> bytes:
        rounded = np.round(computed.attentions.numpy().astype(np.float64), 6)
        body = {**computed.header, "attention": rounded.tolist()}
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")

    @staticmethod
    def _encode_compact(computed: Computed, *, scheme: str) -> bytes:
        return compact.compress(compact.encode(computed.header, computed.attentions, scheme=scheme))

    async def head_compact(self, request: HeadRequest, *, gzipped: bool) -> bytes:
        """One head at full float32 precision as an HSA1 buffer (scheme float32-shuffled, layers = heads = 1),
        gzipped once off the loop and cached as bytes like the compact attention."""
        name = self.registry.resolve(request.model)
        key = ("head.hsa1.gz", *_input_key(name, request), request.words, request.layer, request.head)
        body: bytes | None = self.cache.get(key)
        if body is None:
            computed = await self._view(name, request.text, request.text_pair, words=request.words)
            _check_head(name, computed, request.layer, request.head)
            body = await to_thread.run_sync(
                self._bounded, self._encode_head_compact, computed, request.layer, request.head
            )
            self.cache.put(key, body, size=len(body))
        # Almost every client accepts gzip; the rare one that does not gets it undone, off the loop too.
        return body if gzipped else await to_thread.run_sync(gzip.decompress, body)

    @staticmethod
    def _encode_head_compact(computed: Computed, layer: int, head: int) -> bytes:
        header = {**computed.header, "layers": 1, "heads": 1, "layer": layer, "head": head}
        one = computed.attentions[layer : layer + 1, head : head + 1]  # [1, 1, n, n]
        return compact.compress(compact.encode(header, one, scheme="float32-shuffled"))


def _input_key(name: str, request: InputText) -> tuple[str, str, str | None]:
    return (name, request.text, request.text_pair)


def _check_head(name: str, computed: Computed, layer: int, head: int) -> None:
    layers, heads = computed.header["layers"], computed.header["heads"]
    if layer >= layers:
        raise InvalidInputError(f"layer {layer} is out of range: {name!r} has layers 0..{layers - 1}")
    if head >= heads:
        raise InvalidInputError(f"head {head} is out of range: {name!r} has heads 0..{heads - 1}")


def _rounded(values: torch.Tensor) -> Any:
    """Nested lists rounded to 6 decimals, as /api/attention (float64 first: float32 rounds badly)."""
    return np.round(values.numpy().astype(np.float64), 6).tolist()


def _json(body: dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


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


def _encode_analysis(computed: Computed, *, words: bool) -> bytes:
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
    body = {
        "model": header["model"],
        "tokens": header["tokens"],
        "n": header["n"],
        "layers": layers,
        "heads": heads,
        "words": words,
        "stats": {name: _rounded(value) for name, value in stats.items()},
        "stat_descriptions": {name: analysis.STAT_DESCRIPTIONS[name] for name in stats},
        "labels": analysis.head_labels(stats),
        "thresholds": {
            "pointer": analysis.POINTER_THRESHOLD,
            "broad": analysis.BROAD_THRESHOLD,
            "local": analysis.LOCAL_THRESHOLD,
        },
        "similar": similar,
    }
    return _json(body)


def _encode_rollout(computed: Computed) -> bytes:
    per_layer = analysis.rollout_per_layer(computed.attentions, residual=ROLLOUT_RESIDUAL)
    header = computed.header
    body = {
        "model": header["model"],
        "tokens": header["tokens"],
        "n": header["n"],
        "layers": header["layers"],
        "residual": ROLLOUT_RESIDUAL,
        "rollout": _rounded(per_layer[-1]),
        "per_layer": _rounded(per_layer),
    }
    return _json(body)


def _encode_rollout_compact(computed: Computed, *, scheme: str) -> bytes:
    per_layer = analysis.rollout_per_layer(computed.attentions, residual=ROLLOUT_RESIDUAL)  # [L, n, n]
    header = {**computed.header, "heads": 1, "residual": ROLLOUT_RESIDUAL}
    return compact.compress(compact.encode(header, per_layer.unsqueeze(1), scheme=scheme))  # [L, 1, n, n]


def _encode_flow(computed: Computed, *, max_tokens: int) -> bytes:
    flow = analysis.attention_flow(computed.attentions, max_tokens=max_tokens, residual=ROLLOUT_RESIDUAL)
    header = computed.header
    return _json(
        {"model": header["model"], "tokens": header["tokens"], "n": header["n"], "flow": _rounded(flow)}
    )


def _pairs(view_a: Computed, view_b: Computed) -> list[tuple[int, int]]:
    pairs = analysis.align_tokens(view_a.header["tokens"], view_b.header["tokens"], include_replaced=True)
    if not pairs:
        raise InvalidInputError(
            "a and b share no aligned token to compare; with two tokenizers, compare words (words: true)"
        )
    return pairs


def _encode_compare(view_a: Computed, view_b: Computed) -> bytes:
    pairs = _pairs(view_a, view_b)
    # One layer at a time: the restricted maps of a 512-token input are ~75 MB per copy for all layers.
    scores, kept_a, kept_b = [], [], []
    for layer in range(view_a.header["layers"]):
        result = analysis.compare_aligned(
            view_a.attentions[layer : layer + 1], view_b.attentions[layer : layer + 1], pairs
        )
        scores.append(result["js"][0])
        kept_a.append(result["kept_a"][0])
        kept_b.append(result["kept_b"][0])
    tokens_a = view_a.header["tokens"]
    body = {
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
    return _json(body)


def _compare_one_head(view_a: Computed, view_b: Computed, layer: int, head: int) -> dict[str, Any]:
    pairs = _pairs(view_a, view_b)
    one = (slice(layer, layer + 1), slice(head, head + 1))
    result = analysis.compare_aligned(view_a.attentions[one], view_b.attentions[one], pairs)
    tokens_a = view_a.header["tokens"]
    return {
        "tokens": [tokens_a[i] for i, _ in pairs],
        "layer": layer,
        "head": head,
        # float32 -> Python float is exact: full precision, as /api/attention/head.
        "a": result["a"][0, 0].tolist(),
        "b": result["b"][0, 0].tolist(),
        "diff": result["difference"][0, 0].tolist(),
    }


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
