"""Identical work in flight runs once (`Flights`); a worker thread's future awaited without cancelling it
(`settled`); a large JSON answer sent a chunk at a time as it is encoded (`Stream`)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine, Hashable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

T = TypeVar("T")

# /api/attention answers with more values than this (~7.5 MB of JSON, ~120 tokens on MiniLM) are streamed
# as they are encoded and not cached as bytes (the tensor is): a 512-token answer is ~140 MB of JSON.
STREAM_VALUES = 2**20
CHUNK_BYTES = 1 << 20  # a streamed answer is sent in chunks of about this size


@dataclass(eq=False)
class _Flight:
    task: asyncio.Task[Any]
    abandoned: threading.Event
    waiters: int = 0


class Flights:
    """Identical work in flight runs once for all who ask. When the last of them leaves (its client hung
    up), the work is cancelled: its task, and through `abandoned` whatever worker thread runs it; a later
    identical request then starts afresh rather than joining abandoned work. Loop-side only: no lock."""

    def __init__(self) -> None:
        self._flights: dict[Hashable, _Flight] = {}

    def __len__(self) -> int:
        return len(self._flights)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._flights

    async def join(self, key: Hashable, start: Callable[[threading.Event], Coroutine[Any, Any, T]]) -> T:
        loop = asyncio.get_running_loop()
        flight = self._flights.get(key)
        if flight is None or flight.task.get_loop() is not loop:  # (a stale one of a finished loop)
            abandoned = threading.Event()
            flight = _Flight(loop.create_task(start(abandoned)), abandoned)
            self._flights[key] = flight
            flight.task.add_done_callback(partial(self._remove, key, flight))
        flight.waiters += 1
        try:
            # shield: one waiter leaving must not cancel what the others still wait for.
            result: T = await asyncio.shield(flight.task)
            return result
        finally:
            flight.waiters -= 1
            if flight.waiters == 0 and not flight.task.done():
                flight.abandoned.set()
                flight.task.cancel()
                self._remove(key, flight)

    def _remove(self, key: Hashable, flight: _Flight, _task: object = None) -> None:
        if self._flights.get(key) is flight:
            del self._flights[key]


async def settled(future: Future[T]) -> T:
    """Await a worker thread's future without ever cancelling it (the Flight decides that)."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[T] = loop.create_future()

    def settle(done: Future[T]) -> None:
        if waiter.done():
            return
        if done.cancelled():
            waiter.cancel()
        elif (exc := done.exception()) is not None:
            waiter.set_exception(exc)
        else:
            waiter.set_result(done.result())

    def notify(done: Future[T]) -> None:
        try:
            loop.call_soon_threadsafe(settle, done)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    future.add_done_callback(notify)
    return await waiter


def _next_chunk(parts: Iterator[bytes], size: int) -> bytes:
    """Worker thread: the next ~size bytes of a streamed answer (b"" at its end)."""
    chunk = []
    total = 0
    for piece in parts:
        chunk.append(piece)
        total += len(piece)
        if total >= size:
            break
    return b"".join(chunk)


class Stream:
    """A large answer's JSON, a chunk at a time, each encoded in a worker thread just before it is sent:
    memory stays at one chunk beside the tensor. `aclose()` (the response ends early: its client hung up)
    stops it; either way `on_close(done, bytes_sent, seconds)` is called exactly once."""

    def __init__(
        self,
        parts: Iterator[bytes],
        off_loop: Callable[..., Coroutine[Any, Any, bytes]],
        on_close: Callable[[bool, int, float], None],
    ) -> None:
        self._parts = parts
        self._off_loop = off_loop
        self._on_close: Callable[[bool, int, float], None] | None = on_close
        self._started = time.perf_counter()
        self.sent = 0

    def __aiter__(self) -> Stream:
        return self

    async def __anext__(self) -> bytes:
        if self._on_close is None:
            raise StopAsyncIteration
        try:
            chunk = await self._off_loop(_next_chunk, self._parts, CHUNK_BYTES)
        except BaseException:
            self._close(done=False)
            raise
        if not chunk:
            self._close(done=True)
            raise StopAsyncIteration
        self.sent += len(chunk)
        return chunk

    async def aclose(self) -> None:
        self._close(done=False)

    def _close(self, *, done: bool) -> None:
        if self._on_close is not None:
            on_close, self._on_close = self._on_close, None
            on_close(done, self.sent, time.perf_counter() - self._started)
