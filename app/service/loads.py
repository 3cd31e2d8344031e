"""`Loads`: every model load on threads of its own, and the startup's work in the background.

A load (reading a checkpoint, a GGUF's config and tokenizer: seconds to minutes) never runs in the
threads that encode answers, nor on a model's workers: each runs on a loader thread, at most one in flight
per model, and all who need that model (a request, a worker, the startup) wait for the same one. A slow or
stuck load then holds only the requests for its own model.

`start()` returns at once: the startup checks (registry.check_all, milliseconds a file) and the default
model's warm load run in the background, so /api/health answers from the first moment, saying what is
still loading or being checked; `started` is set once both are done.

Every load, the startup's and a request's, first runs `prepare` (transformers' lazy imports), once for the
process and on one thread: transformers' lazy module is not safe to import from two threads at once, and a
request that came the moment the server answered used to meet the startup's half-done import (issue 48 E1).

A failed load of the default model is tried again by itself once its back-off has passed, so that
/api/health comes back without a request (a monitor that only polls health would otherwise wait forever).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

from app.registry import Registry
from app.service.batcher import background

logger = logging.getLogger(__name__)

M = TypeVar("M")


class Loads(Generic[M]):
    def __init__(
        self,
        registry: Callable[[], Registry[M]],
        *,
        prepare: Callable[[], object] | None = None,
        ended: Callable[[str], None] = lambda _name: None,
    ) -> None:
        self._registry = registry  # the service's registry, looked up at each use
        self._prepare = prepare  # run once, before any load or the startup's checks (_ready)
        self._ended = ended  # told the name when a load ends, however it ends (its progress is over)
        self.started = threading.Event()  # the startup's checks and the default's load are done
        self._pool: ThreadPoolExecutor | None = None
        self._in_flight: dict[str, Future[tuple[str, M]]] = {}
        self._lock = threading.Lock()
        self._prepared = False
        self._preparing = threading.Lock()  # held while `prepare` runs: every load waits for it
        self._retries: dict[str, threading.Timer] = {}  # the default's own retry after a failed load

    @property
    def registry(self) -> Registry[M]:
        return self._registry()

    def start(self) -> None:
        """The startup's work, in the background (module docstring)."""
        self.started.clear()
        self._loader_pool().submit(self._startup)

    def stop(self) -> None:
        # A load in progress cannot be stopped; it ends in its own thread, and nothing waits for it.
        with self._lock:
            retries, self._retries = list(self._retries.values()), {}
        for timer in retries:
            timer.cancel()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        with self._lock:
            self._in_flight.clear()

    def future(self, name: str) -> Future[tuple[str, M]]:
        """(name, model) of the registered model `name`: the load in flight, or a new one."""
        with self._lock:
            future = self._in_flight.get(name)
            if future is not None and not future.done():
                return future
            future = self._loader_pool().submit(self._load, name)
            self._in_flight[name] = future
        # Forgotten once done: a finished future holds the model, which an unload must be able to free.
        future.add_done_callback(lambda done: self._forget(name, done))
        return future

    def _load(self, name: str) -> tuple[str, M]:
        self._ready()
        return self.registry.get(name)

    def _ready(self) -> None:
        """`prepare`, run once, before any load: a load that comes while it runs waits for it."""
        if self._prepared or self._prepare is None:
            return
        with self._preparing:
            if self._prepared:
                return
            try:
                self._prepare()
            except Exception:  # what it prepares is prepared again, one thread at a time, by those who use it
                logger.exception("preparing the loads failed")
            self._prepared = True

    def _forget(self, name: str, done: Future[tuple[str, M]]) -> None:
        with self._lock:
            if self._in_flight.get(name) is done:
                del self._in_flight[name]
        self._ended(name)
        if name == self.registry.default and not done.cancelled() and done.exception() is not None:
            self._retry_later(name)

    def _retry_later(self, name: str) -> None:
        """Load `name` again by itself once its back-off has passed (one timer at a time; none after stop)."""
        delay = self.registry.retry_in(name)
        if delay is None:
            return  # not a failure of the model (the budget was busy, say): the next request tries
        with self._lock:
            if self._pool is None or name in self._retries:
                return
            # A little past the back-off: a timer that fired a hair early would find the entry still waiting.
            timer = threading.Timer(delay + 0.05, self._retry, (name,))
            timer.daemon = True
            self._retries[name] = timer
        timer.start()

    def _retry(self, name: str) -> None:
        with self._lock:
            if self._retries.pop(name, None) is None or self._pool is None:
                return  # stopped meanwhile
        if self.registry.loaded(name) is None:
            logger.info("default model %r: loading it again by itself", name)
            self.future(name)

    def loading(self, name: str) -> bool:
        """A load of `name` is in flight (whoever asked for it)."""
        with self._lock:
            future = self._in_flight.get(name)
        return future is not None and not future.done()

    def get(self, name: str) -> M:
        """The loaded model (blocking: a worker thread waits here for its model's load)."""
        model = self.registry.use(name)
        return model if model is not None else self.future(name).result()[1]

    async def model(self, name: str) -> M:
        """The loaded model, awaited on the loop; a caller that goes away leaves the load running for the
        others (shielded)."""
        model = self.registry.use(name)
        if model is not None:
            return model
        _, loaded = await asyncio.shield(asyncio.wrap_future(self.future(name)))
        return loaded

    def _loader_pool(self) -> ThreadPoolExecutor:
        if self._pool is None:  # at start(), or after a stop() (a restarted lifespan)
            # One thread per model at most (one load in flight each), and one for the startup's checks: a
            # load never waits for a thread while another model loads.
            self._pool = ThreadPoolExecutor(
                len(self.registry.names) + 1, thread_name_prefix="headscope-load", initializer=background
            )
        return self._pool

    def _startup(self) -> None:
        started = time.perf_counter()
        default = self.future(self.registry.default)  # beside the checks, on a thread of its own
        self._ready()  # before the checks, which import transformers too (the default's load waits for it)
        try:
            self.registry.check_all()
            logger.info("startup checks done in %.1f s", time.perf_counter() - started)
            try:
                default.result()
            except Exception:
                # Reported by /api/health and /api/models; the rest of the service still answers.
                logger.exception("default model %r failed to load", self.registry.default)
            else:
                logger.info("default model ready in %.1f s", time.perf_counter() - started)
        finally:
            self.started.set()


def warm_imports() -> None:
    """The `prepare` the service gives Loads: transformers' lazily imported modules that the startup's
    checks and the default's load both use, imported once, on one thread, before those threads start: two
    threads importing them for the first time at once can each meet the other's half-initialised module
    (seen at startup: "ImportError: cannot import name 'AutoConfig' from 'transformers'", the default model
    failed and health stayed 503)."""
    import transformers
    import transformers.integrations.gguf  # noqa: F401 (imported for the checks of GGUF files)
    import transformers.modeling_gguf_pytorch_utils  # noqa: F401

    for name in ("AutoConfig", "AutoTokenizer", "PreTrainedTokenizerFast"):
        getattr(transformers, name)  # a lazy attribute: its module is imported here
