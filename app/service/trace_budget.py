"""The bytes of every trace in the process, bounded: the long-input traces row of docs/memory-and-load.md.

A trace is counted from the moment its forward is admitted until its last reference goes, wherever that is:
its declared peak (mha.trace.blocked.peak_nbytes: the trace and its forward's scratch) while it is computed,
then its own bytes (Trace.nbytes) for as long as it lives, in the cache or in a request still reading one the
cache has dropped. A forward starts only when its peak fits beside what is already counted, so the total
never passes `limit` (HEADSCOPE_TRACE_CACHE_BYTES + HEADSCOPE_MAX_CONCURRENCY x HEADSCOPE_TRACE_MAX_BYTES);
one that would waits, on the event loop and holding no trace, for others to finish or be freed.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable

from mha.trace import Trace


class TraceBudget:
    """Admission by bytes (module docstring). `freed` runs on the loop whenever bytes are given back (the
    service's trim of the C heap after large work)."""

    def __init__(self, limit: int, *, freed: Callable[[], None] = lambda: None) -> None:
        self.limit = limit
        self._freed = freed
        self._counted = 0  # reserved peaks of forwards in flight, and the bytes of live traces
        self._lock = threading.Lock()  # finalizers and worker threads give bytes back too
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: list[asyncio.Future[None]] = []

    @property
    def counted(self) -> int:
        return self._counted

    @property
    def waiting(self) -> int:
        """Forwards waiting for room."""
        return len(self._waiters)

    async def reserve(self, nbytes: int) -> None:
        """Wait until `nbytes` fit beside what is counted, then count them (cancellable while waiting).
        With nothing counted a reservation is always admitted, so one larger than the limit cannot wait
        for ever (the service never asks for one: its traces are at most HEADSCOPE_TRACE_MAX_BYTES)."""
        self._loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                if self._counted == 0 or self._counted + nbytes <= self.limit:
                    self._counted += nbytes
                    return
            waiter = self._loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)

    def release(self, nbytes: int) -> None:
        """Give back `nbytes` (a forward's reservation, a freed trace's bytes); any thread."""
        with self._lock:
            self._counted -= nbytes
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(self._wake)
        except RuntimeError:  # the loop closed meanwhile: nobody waits any more
            pass

    def keep(self, trace: Trace) -> None:
        """Count `trace` (its Trace.nbytes) until it is freed; any thread. Call it before the reservation
        of the forward that made it is released, so the two overlap rather than leave a gap."""
        nbytes = trace.nbytes
        with self._lock:
            self._counted += nbytes
        weakref.finalize(trace, self.release, nbytes)

    def _wake(self) -> None:
        """Loop side: every waiter looks again (the first that fits takes the room), and the C heap is
        trimmed."""
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._freed()
