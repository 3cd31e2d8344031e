"""What every progress stream shares (streamed_work.py's computations, work_watch.py's watch of the work in
flight): one NDJSON line writer, and `Listeners`, the queues of the clients listening by key, which worker
and loader threads feed through the event loop. Threads only hand an event to the loop
(`call_soon_threadsafe`); the queues are read and changed on the loop alone, so no lock."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Hashable
from typing import Any, Generic, TypeVar

E = TypeVar("E")


def line(event: dict[str, Any]) -> bytes:
    """One NDJSON line."""
    return json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


class Listeners(Generic[E]):
    """key -> the queues of the clients listening to it."""

    def __init__(self) -> None:
        self._queues: dict[Hashable, list[asyncio.Queue[E]]] = {}

    def __contains__(self, key: Hashable) -> bool:
        return key in self._queues

    def add(self, key: Hashable, queue: asyncio.Queue[E]) -> None:
        self._queues.setdefault(key, []).append(queue)

    def remove(self, key: Hashable, queue: asyncio.Queue[E]) -> None:
        queues = self._queues.get(key, [])
        if queue in queues:
            queues.remove(queue)
        if not queues:
            self._queues.pop(key, None)

    def tell(self, loop: asyncio.AbstractEventLoop, key: Hashable, event: E) -> None:
        """From any thread: `event` to every queue listening to `key`, put there on `loop`."""
        if key not in self._queues:  # nobody listens: the event costs nothing more
            return
        try:
            loop.call_soon_threadsafe(self._deliver, key, event)
        except RuntimeError:  # the loop is closed: nobody listens any more
            pass

    def _deliver(self, key: Hashable, event: E) -> None:
        for queue in self._queues.get(key, ()):
            queue.put_nowait(event)
