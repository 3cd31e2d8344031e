"""Long inputs: `Traces` runs a model's trace (mha.trace) on the model's own workers, keeps it in an
LRU bounded by `Trace.nbytes` (HEADSCOPE_TRACE_CACHE_BYTES), shares one in flight among all who ask for it,
and reports its progress, a line per layer, to every client streaming it. Windows, rows and the overview are
then read from the kept trace; one evicted is traced again, transparently, by the next request needing it.

A trace is found by content: (model, text, pair, chat). Inputs longer than the model's `trace_max_tokens`
(its own limit, capped by what fits HEADSCOPE_TRACE_MAX_BYTES: the trace and its forward's scratch) get 413
before any work. Every trace alive and every forward in flight is counted against one budget (TraceBudget),
so together they stay within HEADSCOPE_TRACE_CACHE_BYTES + HEADSCOPE_MAX_CONCURRENCY x TRACE_MAX_BYTES.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import AsyncIterator, Callable, Hashable
from functools import partial
from typing import Any, Protocol

import torch

import mha
from app import compact
from app.cache import LRUCache
from app.encoders import Floats
from app.errors import InputTooLongError, InvalidInputError
from app.schemas.trace import (
    TraceDone,
    TraceOverviewRequest,
    TraceRequest,
    TraceRowRequest,
    TraceTokens,
    TraceWindowRequest,
)
from app.service import bodies
from app.service.flights import Flights, settled
from app.service.forwards import TooManyWaitingError
from app.service.parts import Parts
from app.service.streamed_work import StreamedWork
from app.service.templates import prerender
from app.service.trace_budget import TraceBudget
from mha.trace import OVERVIEW_SIZE, Pooled, Trace, bytes_per_token, expected_nbytes, peak_nbytes

# Traces kept at most, whatever their size (the byte budget is the real bound; tiny traces are KBs).
MAX_TRACES = 1024
# The tokenizer's limit when counting an input's tokens uncut (count_tokens: /api/trace/tokens, a 413).
COUNT_ALL = 10**9

Source = tuple[str, str, str | None, int, bool]  # answers.Input: (model, text, pair, new tokens = 0, chat)


def trace_bytes_per_token(model: mha.AttentionModel) -> int:
    """What one more token adds to a trace of `model` (mha.trace.blocked.bytes_per_token)."""
    return bytes_per_token(model.network.config, next(model.network.parameters()).element_size())


def trace_nbytes(model: mha.AttentionModel, n: int) -> int:
    """Trace.nbytes of an n-token input, at most (mha.trace.blocked.expected_nbytes)."""
    return expected_nbytes(model.network.config, n, next(model.network.parameters()).element_size())


def trace_peak_nbytes(model: mha.AttentionModel, n: int, threads: int = 1) -> int:
    """The most an n-token trace's forward holds on `threads` torch threads: the trace and its scratch
    (mha.trace.blocked.peak_nbytes)."""
    itemsize = next(model.network.parameters()).element_size()
    return peak_nbytes(model.network.config, n, itemsize, threads=threads)


def trace_max_tokens(model: mha.AttentionModel, max_bytes: int, threads: int = 1) -> int:
    """The longest input whose trace's forward fits max_bytes (trace_peak_nbytes, which grows with n),
    capped by the model's own limit (0: none fits)."""

    def fits(n: int) -> bool:
        return trace_peak_nbytes(model, n, threads) <= max_bytes

    low, high = 0, model.info.max_tokens  # fits(low) or low == 0; the answer is in low..high
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low


def count_tokens(model: mha.AttentionModel, text: str, pair: str | None, chat: bool) -> int:
    """An input's tokens, uncut (the tokenizer alone): what /api/trace/tokens and a 413's detail say."""
    return len(model.encoder.encode_batch([(text, pair)], COUNT_ALL, chat=chat)[0].ids)


def _label(tokens: list[str], start: int, stop: int) -> str:
    """A block's axis label: its token, or its first and last."""
    return tokens[start] if stop - start == 1 else f"{tokens[start]}…{tokens[stop - 1]}"


def _read(what: Callable[[], Any]) -> Any:
    """Worker thread: a read of a trace, its out-of-range arguments the client's to fix (422)."""
    try:
        with torch.inference_mode():
            return what()
    except (IndexError, ValueError) as exc:  # mha.trace's checks of layer, head, spans, reduce, size
        raise InvalidInputError(str(exc)) from None


def done_event(name: str, trace: Trace, stats_max_tokens: int) -> bytes:
    info, encoded = trace.info, trace.encoded
    overview = trace.first_overview
    shape = {field: getattr(info, field) for field in ("layers", "heads", "kv_heads", "causal", "byte_level")}
    done = TraceDone(
        model=name,
        n=trace.n,
        tokens=trace.tokens,
        **{field: getattr(encoded, field) for field in ("segments", "special", "unknown", "truncated")},
        **shape,
        overview_size=0 if overview is None else len(overview.row_edges) - 1,
        stats_available=trace.n <= stats_max_tokens,
        path=trace.path,
    )
    return done.model_dump_json().encode() + b"\n"


def overview_compact(name: str, trace: Trace, *, size: int, reduce: str, scheme: str) -> bytes:
    """Worker thread: every head pooled to s x s as HSA1 (app/compact.py), n = s, one label per block;
    `edges` (the blocks' token boundaries), `reduce` and `input_n` in the header. Gzipped."""
    pooled = _read(lambda: trace.overview(size, reduce))  # type: ignore[arg-type]
    header = pooled_header(name, pooled, trace.info, tokens=trace.tokens, marks=trace.encoded)
    return compact.compress(compact.encode(header, pooled.values, scheme=scheme))


class Marks(Protocol):
    """What a text's tokens carry besides their spelling (a trace's encoding, a snapshot's view)."""

    @property
    def segments(self) -> list[int]: ...
    @property
    def special(self) -> list[bool]: ...
    @property
    def unknown(self) -> list[bool]: ...
    @property
    def truncated(self) -> bool: ...


def pooled_header(
    name: str, pooled: Pooled, info: mha.ModelInfo, *, tokens: list[str], marks: Marks
) -> dict[str, Any]:
    """The HSA1 header of a pooled overview (a trace's, or a snapshot's grid past its byte budget) of model
    `info`: one label a block, a block special (unknown) when all its tokens are, its edges, reduction and
    input length."""
    segments, special, unknown, truncated = marks.segments, marks.special, marks.unknown, marks.truncated
    edges = pooled.row_edges
    blocks = list(itertools.pairwise(edges))
    return {
        "model": name,
        "tokens": [_label(tokens, a, b) for a, b in blocks],
        "segments": [segments[a] for a, _ in blocks],
        "special": [all(special[a:b]) for a, b in blocks],
        "unknown": [all(unknown[a:b]) for a, b in blocks],
        "layers": info.layers,
        "heads": info.heads,
        "kv_heads": info.kv_heads,
        "n": len(blocks),
        "truncated": truncated,
        "causal": info.causal,
        "generated": 0,
        "byte_level": info.byte_level,
        "input_n": edges[-1] - edges[0],
        "edges": edges,
        "reduce": pooled.reduce,
        "exact": pooled.exact,
    }


def window_json(trace: Trace, request: TraceWindowRequest, gzipped: bool = False) -> bytes:
    pooled = _read(
        lambda: trace.window(
            request.layer,
            request.head,
            request.rows,
            request.cols,
            max_cells=request.max_cells,
            reduce=request.reduce,
        )
    )
    body = {
        "values": Floats(pooled.values),  # 6 decimals
        "row_edges": pooled.row_edges,
        "col_edges": pooled.col_edges,
        "exact": pooled.exact,
        "reduce": pooled.reduce,
        "factor": list(pooled.factor),
    }
    return _gzip_if(bodies.encode_pieces(lambda: body), gzipped)


def tokens_json(
    name: str, model: mha.AttentionModel, request: TraceRequest, limits: tuple[int, int]
) -> bytes:
    """Encoding thread: the input's uncut token count (the tokenizer alone) and the limits it meets."""
    max_tokens, trace_max = limits
    n = count_tokens(model, request.text, request.text_pair, request.chat)
    counted = TraceTokens(model=name, n=n, max_tokens=max_tokens, trace_max_tokens=trace_max)
    return counted.model_dump_json().encode()


def row_json(trace: Trace, request: TraceRowRequest, gzipped: bool = False) -> bytes:
    values = _read(lambda: trace.row(request.layer, request.head, request.q))
    return _gzip_if(
        bodies.encode_pieces(lambda: {"q": request.q, "n": trace.n, "values": Floats(values)}), gzipped
    )


def _gzip_if(body: bytes, gzipped: bool) -> bytes:
    # A 512 x 512 window is ~1.7 MB of JSON digits, ~0.4 MB gzipped: compressed here, in the encoding thread.
    return compact.compress_json(body) if gzipped else body


class Traces:
    """The service's traces (module docstring), made with the service's parts: its models, the answers'
    cache (the overview's bytes are kept there, the traces in their own LRU), the forwards (a trace runs on
    its model's workers) and the encoding threads. `freed` runs on the loop whenever a forward ends or a
    trace is freed (the service trims the C heap then, as after large answers)."""

    def __init__(self, parts: Parts, *, freed: Callable[[], None] = lambda: None) -> None:
        settings = self.settings = parts.settings
        self._models = models = parts.models
        answers, forwards, encoders = parts.answers, parts.forwards, parts.encoders
        self.cache = LRUCache(max_entries=MAX_TRACES, max_bytes=settings.trace_cache_bytes)
        # Service-wide, whatever the number of models: the traces row of docs/memory-and-load.md.
        limit = settings.trace_cache_bytes + settings.max_concurrency * settings.trace_max_bytes
        self.budget = TraceBudget(limit, freed=freed)
        self._submit, self._cached, self._model = forwards.submit_work, answers.cached, models.model
        self._off_loop, self._gunzipped_unless = encoders.off_loop, encoders.gunzipped_unless
        self._flights = Flights()
        self._progress = StreamedWork(
            lambda layer, layers: {"event": "progress", "layer": layer, "layers": layers},
            what="the trace",
            failed="the trace failed on the server (logged)",
        )

    @property
    def busy(self) -> bool:
        """A trace is being computed (the service's idle trim waits for it)."""
        return bool(len(self._flights))

    def max_tokens(self, model: mha.AttentionModel) -> int:
        """The longest input a trace of `model` takes; 0 for an encoder-decoder, which has no traces."""
        if model.info.seq2seq:
            return 0
        return trace_max_tokens(model, self.settings.trace_max_bytes, self.settings.threads)

    # -- answers ---------------------------------------------------------------------------------

    async def stream(self, request: TraceRequest) -> AsyncIterator[bytes]:
        """NDJSON lines: {"event": "progress", "layer": i, "layers": L} as layer i starts, then the done
        event (`TraceDone`), or {"event": "error", "detail": ...}. Errors found before the forward (unknown
        model, too long, empty text) are raised here instead, for a plain 4xx."""
        source, key, hit = await self._prepare(request)

        async def done(trace: Trace) -> bytes:
            stats_max_tokens = self.settings.tokens_for(trace.info.max_tokens)
            body: bytes = await self._off_loop(done_event, source[0], trace, stats_max_tokens)
            return body

        return self._progress.events(key, partial(self._trace, source, key), done, hit=hit)

    async def overview(self, request: TraceOverviewRequest, *, gzipped: bool, scheme: str) -> bytes:
        source, key, hit = await self._prepare(request)

        async def encode(_abandoned: threading.Event) -> bytes:
            trace = hit or await self._trace(source, key)
            make = partial(
                overview_compact, source[0], trace, size=request.size, reduce=request.reduce, scheme=scheme
            )
            if request.size == OVERVIEW_SIZE and request.reduce == "max":  # kept from the forward: cheap
                body: bytes = await self._off_loop(make)
            else:  # pooled from every head again: a forward's worth of work, on the model's workers
                body = await self._on_workers(source[0], lambda _model: make())
            return body

        kind = f"trace/overview.gz:{scheme}"
        body = await self._cached((kind, *source, request.size, request.reduce), encode)
        return await self._gunzipped_unless(gzipped, body)

    async def window(self, request: TraceWindowRequest, *, gzipped: bool = False) -> bytes:
        trace = await self._get(request)
        body: bytes = await self._off_loop(window_json, trace, request, gzipped)
        return body

    async def tokens(self, request: TraceRequest) -> bytes:
        """How long an input is, without a forward: the page's choice between /api/attention and a trace."""
        name = self._models.resolve(request.model)
        model = await self._model(name)
        await prerender(model, request.text, request.chat)
        limits = (self.settings.tokens_for(model.info.max_tokens), self.max_tokens(model))
        body: bytes = await self._off_loop(tokens_json, name, model, request, limits)
        return body

    async def row(self, request: TraceRowRequest, *, gzipped: bool = False) -> bytes:
        trace = await self._get(request)
        body: bytes = await self._off_loop(row_json, trace, request, gzipped)
        return body

    # -- the trace itself ------------------------------------------------------------------------

    async def _prepare(self, request: TraceRequest) -> tuple[Source, Hashable, Trace | None]:
        """(source, key, the cached trace or None); for an uncached one the model is loaded and the input
        checked (422 for what it cannot take, 413 above the limit) before anything runs."""
        name = self._models.resolve(request.model)
        source: Source = (name, request.text, request.text_pair, 0, request.chat)
        key = ("trace", *source)
        hit = self.cache.get(key)
        if hit is None:
            model = await self._model(name)
            await prerender(model, request.text, request.chat)  # not in the shared encoding threads
            await self._off_loop(self._check_length, model, source)
        return source, key, hit

    def _check_length(self, model: mha.AttentionModel, source: Source) -> int:
        """The input's tokens, or the error that refuses it (encoding thread)."""
        name, text, pair, _, chat = source
        if model.info.seq2seq:
            raise InvalidInputError(
                f"{name!r} is an encoder-decoder model: long-input traces cover encoder and decoder models; "
                "use /api/attention (its source and target are within the model's limits)"
            )
        limit = self.max_tokens(model)
        encoded = model.encoder.encode_batch([(text, pair)], limit, chat=chat)[0]
        if not encoded.truncated:
            return len(encoded.ids)
        n = count_tokens(model, text, pair, chat)
        why = (
            "the model's own limit"
            if limit == model.info.max_tokens
            else f"what a trace of HEADSCOPE_TRACE_MAX_BYTES ({self.settings.trace_max_bytes}) holds"
        )
        raise InputTooLongError(
            f"input has {n} tokens; model {name!r} traces at most {limit} tokens ({why}); shorten the text"
        )

    async def _get(self, request: TraceRequest) -> Trace:
        source, key, hit = await self._prepare(request)
        return hit or await self._trace(source, key)

    async def _trace(self, source: Source, key: Hashable) -> Trace:
        hit = self.cache.get(key)
        if hit is not None:
            return hit  # type: ignore[no-any-return]
        return await self._flights.join(key, partial(self._compute, source, key))

    async def _compute(self, source: Source, key: Hashable, abandoned: threading.Event) -> Trace:
        name, text, pair, _, chat = source
        # Counted from admission (its declared peak) to the worker's end; the trace then on its own.
        loaded = await self._model(name)
        n = await self._off_loop(self._check_length, loaded, source)
        need = trace_peak_nbytes(loaded, n, self.settings.threads)
        if self.budget.waiting >= self.settings.max_queue:  # as a model's queue: 503, not a wait without end
            retry = max(1, self.budget.waiting // self.settings.max_concurrency)
            raise TooManyWaitingError(
                f"{self.budget.waiting} traces already wait for memory (the limit)", retry
            )
        await self.budget.reserve(need)
        report = self._progress.reporter(key)

        def work(model: mha.AttentionModel) -> Trace:
            started = itertools.count()

            def cancel() -> bool:  # asked before each layer: stop if nobody waits, else report it
                if abandoned.is_set():
                    return True
                report(next(started), model.info.layers)
                return False

            with torch.inference_mode():
                trace = model.trace(text, pair, max_tokens=self.max_tokens(model), chat=chat, cancel=cancel)
            self.budget.keep(trace)  # before the reservation is released: counted throughout
            return trace

        try:
            future = self._submit(name, work, abandoned)
        except BaseException:  # refused (the model's queue is full): nothing runs
            self.budget.release(need)
            raise
        # Released when the worker is done, not when this task is: a cancelled forward runs on to its next
        # layer, holding its scratch until then.
        future.add_done_callback(lambda _done: self.budget.release(need))
        trace: Trace = await settled(future)
        self.cache.put(key, trace, size=trace.nbytes)
        return trace

    async def _on_workers(
        self, name: str, work: Callable[..., Any], *, abandoned: threading.Event | None = None
    ) -> Any:
        """work(model) on the model's workers: it queues with the model's long forwards."""
        return await settled(self._submit(name, work, abandoned or threading.Event()))
