"""`EncodingThreads`: the pool that builds and encodes answers off the event loop (see the package
docstring). Threads of its own, apart from anyio's pool (which sync routes such as /api/health use) and at
a lower CPU priority, like the workers: a burst of encodings queues here and never takes the CPU or the
threads that the event loop and the health check need. Models load elsewhere (loads.py), never here."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from app.service.batcher import background

T = TypeVar("T")


class EncodingThreads:
    """`threads` encoding threads, made at first use (or again after a stop: a restarted lifespan)."""

    def __init__(self, threads: int) -> None:
        self._threads = threads
        self._pool: ThreadPoolExecutor | None = None

    def start(self) -> None:
        self._executor()

    def stop(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    async def off_loop(self, work: Callable[..., T], *args: Any) -> T:
        """CPU work in an encoding thread; waiting for a free one happens in the pool's queue, and work
        still queued when its caller is cancelled never runs."""
        return await asyncio.get_running_loop().run_in_executor(self._executor(), partial(work, *args))

    async def gunzipped_unless(self, gzipped: bool, body: bytes) -> bytes:
        # Almost every client accepts gzip; the rare one that does not pays for one decompression.
        return body if gzipped else await self.off_loop(gzip.decompress, body)

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                self._threads, thread_name_prefix="headscope-encode", initializer=background
            )
        return self._pool
