"""`Loads`: every model load on threads of its own, and the startup's work in the background.

A load (reading a checkpoint, converting a GGUF: seconds to minutes) never runs in the threads that encode
answers, nor on a model's workers: each runs on a loader thread, at most one in flight per model, and all
who need that model (a request, a worker, the startup) wait for the same one. A slow or stuck load then
holds only the requests for its own model.

`start()` returns at once: the startup checks (registry.check_all, milliseconds a file) and the default
model's warm load run in the background, so /api/health answers from the first moment, saying what is
still loading or being checked; `started` is set once both are done.
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
        self._prepare = prepare  # run first by the startup, before its check and load threads start
        self._ended = ended  # told the name when a load ends, however it ends (its progress is over)
        self.started = threading.Event()  # the startup's checks and the default's load are done
        self._pool: ThreadPoolExecutor | None = None
        self._in_flight: dict[str, Future[tuple[str, M]]] = {}
        self._lock = threading.Lock()

    @property
    def registry(self) -> Registry[M]:
        return self._registry()

    def start(self) -> None:
        """The startup's work, in the background (module docstring)."""
        self.started.clear()
        self._loader_pool().submit(self._startup)

    def stop(self) -> None:
        # A load in progress cannot be stopped; it ends in its own thread, and nothing waits for it.
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
            future = self._loader_pool().submit(self.registry.get, name)
            self._in_flight[name] = future
        # Forgotten once done: a finished future holds the model, which an unload must be able to free.
        future.add_done_callback(lambda done: self._forget(name, done))
        return future

    def _forget(self, name: str, done: Future[tuple[str, M]]) -> None:
        with self._lock:
            if self._in_flight.get(name) is done:
                del self._in_flight[name]
        self._ended(name)

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
        if self._prepare is not None:
            try:
                self._prepare()
            except Exception:  # what it prepares is prepared again, one thread at a time, by those who use it
                logger.exception("preparing the startup failed")
        default = self.future(self.registry.default)  # beside the checks, on a thread of its own
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
