"""Handing freed memory back to the system after large answers (glibc keeps it in its arenas)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from app import memory

# After answers whose tensor is at least this large, freed memory is handed back to the system once the
# service is idle for IDLE_TRIM_SECONDS (or at once under continuous load, at most every TRIM_INTERVAL).
LARGE_BYTES = 16 << 20
IDLE_TRIM_SECONDS = 1.0
TRIM_INTERVAL = 10.0


class Trimmer:
    """Loop-side only; `busy()` says whether work is in progress (then an idle trim waits)."""

    def __init__(self, *, enabled: bool, busy: Callable[[], bool]) -> None:
        self._enabled = enabled
        self._busy = busy
        self._handle: asyncio.TimerHandle | None = None
        self._last = time.monotonic()

    def answered(self, nbytes: int) -> None:
        """After an answer whose tensor has `nbytes`."""
        if nbytes >= LARGE_BYTES:
            self.large_answer_done()

    def large_answer_done(self) -> None:
        """Trim now if the last trim is long past (continuous load), else once the service has been idle
        for IDLE_TRIM_SECONDS."""
        if not self._enabled:
            return
        loop = asyncio.get_running_loop()
        if time.monotonic() - self._last >= TRIM_INTERVAL:
            self._start(loop)
        if self._handle is not None:
            self._handle.cancel()
        self._handle = loop.call_later(IDLE_TRIM_SECONDS, self._if_idle, loop)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _if_idle(self, loop: asyncio.AbstractEventLoop) -> None:
        self._handle = None
        if self._busy():  # still busy: look again later
            self._handle = loop.call_later(IDLE_TRIM_SECONDS, self._if_idle, loop)
            return
        self._start(loop)

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._last = time.monotonic()
        # malloc_trim releases the GIL (ctypes) and takes a few ms per GB: a default-pool thread.
        loop.run_in_executor(None, memory.trim)
