"""`WorkWatch`: how far each model's load and each input's forward have come, as the loader and worker
threads report it, streamed as NDJSON to a client watching one input (POST /api/attention/progress).

The page asks for an input's answer as it always does; when that answer is slow, it opens this stream for
the same input and shows the load's and then the forward's progress, with a Cancel that aborts its request
(the forward then stops before its next layer, app/service/flights.py). The stream neither starts nor holds
any work: it watches the work in flight under the input's key, and ends when that work ends.

Threads only write the latest (step, steps) of their key and, when someone listens to that key, hand the
line to the event loop (progress.Listeners): a forward nobody watches pays a dictionary store a layer.
The loop reads and subscribes; single dictionary operations are atomic under the GIL, so no lock."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable, Hashable
from typing import Any

from app.service.progress import Listeners, line
from mha.loading import Progress

# How often a watcher looks whether the work it watches is still in flight (its lines come at once).
POLL_SECONDS = 0.2
Event = dict[str, Any]


def load_event(name: str, step: int, steps: int) -> Event:
    return {"event": "load", "model": name, "step": step, "steps": steps}


def layer_event(step: int, layers: int) -> Event:
    """The forward's progress as layer `layer` (0-based) of `layers` starts; a continuation or an
    encoder-decoder runs several passes over its layers, counted by `pass` (checks between new tokens
    count as steps too)."""
    return {"event": "progress", "layer": step % layers, "layers": layers, "pass": step // layers}


class WorkWatch:
    """The latest progress of each load and forward in flight, and the clients watching them (module
    docstring)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._latest: dict[Hashable, Event] = {}  # ("load", name) or an input's key -> its latest line
        self._listeners: Listeners[Event] = Listeners()
        self.watching = 0  # streams open

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop the watchers run on (the service's start)."""
        self._loop = loop

    # -- thread side -----------------------------------------------------------------------------

    def load_reporter(self, name: str) -> Progress:
        """progress(step, steps) for model `name`'s loader (mha.load_pretrained's `progress`)."""

        def report(step: int, steps: int) -> None:
            self._tell(("load", name), load_event(name, step, steps))

        return report

    def load_ended(self, name: str) -> None:
        self._latest.pop(("load", name), None)

    def forward(self, keys: list[Hashable], layers: int) -> Callable[[], None]:
        """step(), for the worker to call as each layer starts: a line for every input of the batch."""
        started = itertools.count()
        layers = max(layers, 1)

        def step() -> None:
            event = layer_event(next(started), layers)
            for key in keys:
                self._tell(key, event)

        return step

    def forward_ended(self, keys: list[Hashable]) -> None:
        for key in keys:
            self._latest.pop(key, None)

    def _tell(self, key: Hashable, event: Event) -> None:
        self._latest[key] = event
        if self._loop is not None:
            self._listeners.tell(self._loop, key, event)

    # -- loop side -------------------------------------------------------------------------------

    async def watch(self, name: str, key: Hashable, in_flight: Callable[[], bool]) -> AsyncIterator[bytes]:
        """Lines for the input `key` of model `name`: the load's ({"event": "load", ...}) while the model
        loads, then the forward's ({"event": "progress", ...}) as each layer starts, the latest of each
        first; {"event": "done"} once `in_flight()` says nothing is (at once when nothing is)."""
        queue: asyncio.Queue[Event] = asyncio.Queue()
        keys = [("load", name), key]
        self.watching += 1
        for each in keys:  # before reading the latest: a line told in between comes twice, never missed
            self._listeners.add(each, queue)
        try:
            for each in keys:
                if (latest := self._latest.get(each)) is not None:
                    yield line(latest)
            while in_flight():
                try:
                    event = await asyncio.wait_for(queue.get(), POLL_SECONDS)
                except TimeoutError:
                    continue
                yield line(event)
            # What the work told before it ended: handed to the loop before its end was (FIFO); a load's end
            # is read from its thread, so one turn of the loop first runs what is already handed over.
            await asyncio.sleep(0)
            while not queue.empty():
                yield line(queue.get_nowait())
            yield line({"event": "done"})
        finally:
            self.watching -= 1
            for each in keys:
                self._listeners.remove(each, queue)
