"""Worker threads that batch waiting requests: `Batcher`, its `Job`s and its queue. Knows nothing of `mha`:
the service hands it a `run(jobs)` that does the forward and settles each job's future."""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

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


class JobDropped(Exception):
    """The future's exception for a job dropped before its run: every client waiting for it has gone."""


@dataclass(eq=False)
class Job:
    text: str
    pair: str | None
    # write up to this many tokens first (a decoder continues the text, an encoder-decoder writes its
    # target); None: the model's default (none for a decoder)
    new_tokens: int | None = 0
    chat: bool = False  # the text as a user's turn of the model's chat template
    target: str | None = None  # an encoder-decoder's target text (forced decoding)
    probe: tuple[int, int] | None = None  # the head probe's (seed, length): its first sequence, not text
    norms: bool = False  # keep the value norms too (weighting "norm"); a batch keeps them if any job asks
    # Set (by the service) when every client waiting for this job has gone: the job is dropped before
    # its forward, or its forward stops between layers.
    abandoned: threading.Event = field(default_factory=threading.Event)
    future: Future[Any] = field(default_factory=Future)  # settled by the Batcher's `run`
    # Work other than a forward of `text` (a trace): `run` calls it with the loaded model, alone.
    work: Callable[[Any], Any] | None = None
    submitted: float = field(default_factory=time.monotonic)


def drop_if_abandoned(job: Job) -> bool:
    """True (and the job's future failed, if still open) when nobody waits for the job any more."""
    if not job.abandoned.is_set():
        return False
    if not job.future.done():
        job.future.set_exception(JobDropped("dropped before its forward: its clients have gone"))
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
        self._workers, self._max_batch, self._max_queue = workers, max_batch, max_queue
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
        self,
        text: str,
        pair: str | None,
        *,
        new_tokens: int | None = 0,
        chat: bool = False,
        target: str | None = None,
        probe: tuple[int, int] | None = None,
        norms: bool = False,
        abandoned: threading.Event | None = None,
        work: Callable[[Any], Any] | None = None,
    ) -> Future[Any]:
        job = Job(text, pair, new_tokens, chat, target, probe, norms, work=work)
        if abandoned is not None:
            job.abandoned = abandoned
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
        for job in [job for job in q.jobs if drop_if_abandoned(job)]:
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
