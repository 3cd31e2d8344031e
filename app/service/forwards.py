"""`Forwards`: each model's forwards, run by its `Batcher` (batcher.py) on `max_concurrency` worker threads
per model under `torch.inference_mode()`: short texts waiting together go in one padded forward
(`model.attend_batch`), long ones, continuations, chat texts, an encoder-decoder's inputs and other work (a
trace, a head ablation) alone. At most `max_queue` requests wait per model; beyond that a request gets 503
with Retry-After at once (`TooManyWaitingError`). A forward whose clients have all gone is dropped before it
starts, or stopped between layers; each layer's start is told to whoever watches the input (work_watch.py).

Results are cached (answers.py) under `result_key`, a batch-mate's too, and identical forwards in flight
share one computation."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from functools import partial
from typing import Any

import torch
from starlette.exceptions import HTTPException

import mha
from app.errors import InvalidInputError, ServiceError
from app.service.answers import Answers, Input, result_key
from app.service.batcher import Batcher, Job, QueueFull, drop_if_abandoned
from app.service.computed import Computed, article, from_result
from app.service.flights import settled
from app.service.model_access import ModelAccess
from app.service.probe_size import check_probe_length
from app.service.work_watch import WorkWatch
from app.settings import Settings
from mha.errors import Cancelled
from mha.networks import DEFAULT_NEW_TOKENS

logger = logging.getLogger(__name__)

# Texts longer than this (in characters, both segments) run alone: padding a short text to a long one's
# length would cost more than batching saves.
BATCH_CHARS = 600
GENERATE = ""  # the target of a request with generate: true (a real target is never blank)


class TooManyWaitingError(HTTPException):
    """503 with Retry-After: too many requests already wait (for a model, or to stream a large answer).
    An HTTPException rather than a ServiceError because app/errors.py's ServiceError handler does not
    pass headers; its HTTPException handler does."""

    def __init__(self, detail: str, retry_after: int) -> None:
        super().__init__(
            503, f"{detail}; try again in {retry_after} s", headers={"Retry-After": str(retry_after)}
        )


def chars(text: str, pair: str | None, target: str | None = None) -> int:
    """An input's length in characters, both segments and the target (what BATCH_CHARS counts)."""
    return len(text) + len(pair or "") + len(target or "")


def _source(name: str, job: Job) -> Input:
    """The input a forward's job is of, as `Views.input` made it."""
    return (name, job.text, job.pair, job.new_tokens, job.chat, job.target, job.probe)


def _is_long(job: Job) -> bool:
    # A continuation runs its own forwards, one per new token: never batched with others; so does an
    # encoder-decoder's target (`_forward` runs an encoder-decoder's batch one job at a time anyway).
    # A chat-templated text too: a batch is all one way (attend_batch's chat flag).
    # Other work (a trace) runs alone as well, and so does the probe's input (ids, not a text).
    long = job.work is not None or bool(job.new_tokens) or job.target is not None or job.chat
    long = long or job.probe is not None
    return long or chars(job.text, job.pair, job.target) > BATCH_CHARS


class Forwards:
    """Each registered model's Batcher and the worker threads' side of it (module docstring); `answered`
    is told each result's size (the C heap's trimmer)."""

    def __init__(
        self,
        settings: Settings,
        models: ModelAccess,
        answers: Answers,
        watch: WorkWatch,
        *,
        answered: Callable[[int], None] = lambda _nbytes: None,
    ) -> None:
        self.settings = settings
        self._models, self._answers, self._watch = models, answers, watch
        self._answered = answered
        self._batchers = {
            name: Batcher(
                partial(self._run_batch, name),
                workers=settings.max_concurrency,
                max_batch=settings.max_batch,
                max_queue=settings.max_queue,
                is_long=_is_long,
                name=name,
            )
            for name in models.names
        }

    def close(self) -> None:
        for batcher in self._batchers.values():
            batcher.close()

    def queued(self, name: str) -> int:
        """Requests waiting for a worker of model `name` (abandoned ones not counted)."""
        return self._batchers[name].queued

    def in_flight(self, source: Input) -> bool:
        """Work for `source` is in flight: its forward (waiting for its model's load included), or its
        model's load, whoever asked for it (a long input's token count waits for it too)."""
        forward = any(self._answers.in_flight(result_key(source, norms=norms)) for norms in (False, True))
        return forward or self._models.loading(source[0])

    def submit(self, name: str, text: str, pair: str | None, **job: Any) -> Future[Any]:
        try:
            return self._batchers[name].submit(text, pair, **job)
        except QueueFull as full:
            raise TooManyWaitingError(
                f"model {name!r} is busy: {full.queued} requests are already waiting for it (the limit)",
                full.retry_after,
            ) from None

    def submit_work(self, name: str, work: Callable[[Any], Any], abandoned: threading.Event) -> Future[Any]:
        """work(model) on model `name`'s workers, queued with its long forwards (traces, head ablations)."""
        return self.submit(name, "", None, work=work, abandoned=abandoned)

    async def computed(self, source: Input, *, norms: bool = False) -> Computed:
        """The forward's result, cached; `norms` asks for one that kept the value norms too (weighting
        "norm": ~10-20 % more forward, so the first view, which shows weights, does not pay it). A result
        with the norms answers for the weights as well."""
        name, text, pair, new_tokens, chat, target, probe = source
        with_norms = result_key(source, norms=True)
        if not norms:
            hit = self._answers.get(with_norms)
            if hit is not None:
                return hit  # type: ignore[no-any-return]

        async def forward(abandoned: threading.Event) -> Computed:
            job: dict[str, Any] = {"new_tokens": new_tokens, "chat": chat, "target": target, "probe": probe}
            future = self.submit(name, text, pair, norms=norms, abandoned=abandoned, **job)
            computed: Computed = await settled(future)
            self._answered(computed.nbytes)
            return computed

        return await self._answers.cached(with_norms if norms else result_key(source, norms=False), forward)

    # -- worker threads --------------------------------------------------------------------------

    def _run_batch(self, name: str, jobs: list[Job]) -> None:
        """Worker thread: wait for the model's load if needed, then run the jobs in as few forwards as
        sensible."""
        try:
            model = self._models.get(name)
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
        started = time.perf_counter()
        sources: list[Hashable] = [_source(name, job) for job in live]
        step = self._watch.forward(sources, model.info.layers)

        # Between layers (and between new tokens): told to whoever watches each input (work_watch.py),
        # and stop once every client of this batch has gone.
        def cancel() -> bool:
            if all(job.abandoned.is_set() for job in live):
                return True
            step()
            return False

        try:
            results = self._attend(model, live, cancel)
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
            self._watch.forward_ended(sources)  # the forward is over, however it ended
        # Never log the texts: only sizes and cost.
        logger.debug(
            "model %r: batch of %d in %.1f ms", name, len(live), 1000 * (time.perf_counter() - started)
        )
        for job, result in zip(live, results, strict=True):
            computed = from_result(name, model.info, result)
            # Cached here too: a batch-mate's result is kept even if its own clients have gone.
            self._answers.keep(result_key(_source(name, job), norms=computed.norms is not None), computed)
            job.future.set_result(computed)

    def _attend(
        self, model: mha.AttentionModel, live: list[Job], cancel: Callable[[], bool]
    ) -> list[mha.AttentionResult]:
        """One forward of the live jobs: a batch of short texts, or one job alone (worker thread)."""
        limit = self.settings.tokens_for(model.info.max_tokens)
        with torch.inference_mode():
            job = live[0]
            if job.probe is not None:  # always alone
                return [self._attend_probe(model, job.probe, cancel)]
            if job.new_tokens or job.target is not None or model.info.seq2seq:  # always alone
                return [self._attend_one(model, job, limit, cancel)]
            return model.attend_batch(
                [(j.text, j.pair) for j in live],
                max_tokens=limit,
                hidden_state=False,
                chat=job.chat,  # a chat job runs alone (`_is_long`)
                cancel=cancel,
                norms=any(j.norms for j in live),  # one batch, one forward: kept for all
                # A CUDA model's maps stay on its device: the compact first view is quantized there.
                on_device=model.device.type == "cuda",
            )

    def _attend_probe(
        self, model: mha.AttentionModel, probe: tuple[int, int], cancel: Callable[[], bool]
    ) -> mha.AttentionResult:
        """The head probe's first sequence (worker thread), its length under the probe's own bound."""
        seed, length = probe
        check_probe_length(model, length, max_tokens=self.settings.max_tokens)
        return model.attend_probe(seed=seed, length=length, cancel=cancel)

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
            new_tokens = min(DEFAULT_NEW_TOKENS, self.settings.max_new_tokens)
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
