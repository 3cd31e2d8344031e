"""`StreamedWork`: a long computation whose answer is an NDJSON stream (traces.py, effects.py): a line per
step as the worker thread reports it, then the answer's line, or, once the stream has begun, an error line,
to every client waiting for it. A client that hangs up leaves the computation's flight, which stops it
before its next step unless another client still waits. Loop-side only, as Flights (the worker's reports
reach the loop through progress.Listeners): no lock."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from typing import Any, TypeVar

from app.errors import ServiceError
from app.service.progress import Listeners, line
from mha.errors import Cancelled, InputError

logger = logging.getLogger(__name__)

T = TypeVar("T")
Progress = tuple[int, int]  # (step, steps): what the event's two fields say


class StreamedWork:
    """The clients streaming each computation's progress, by the computation's key. `event(step, steps)` is
    a progress line's JSON; `what` names the work in an error line ("the trace"), `failed` is the line for
    an unexpected error (logged with its traceback)."""

    def __init__(self, event: Callable[[int, int], dict[str, Any]], *, what: str, failed: str) -> None:
        self._event = event
        self._what, self._failed = what, failed
        # key -> the queues of the clients streaming that computation's progress (None: it ended)
        self._listeners: Listeners[Progress | None] = Listeners()

    def reporter(self, key: Hashable) -> Callable[[int, int], None]:
        """report(step, steps), for the worker thread (made on the loop): a progress line to every client
        streaming `key`."""
        loop = asyncio.get_running_loop()

        def report(step: int, steps: int) -> None:
            self._listeners.tell(loop, key, (step, steps))

        return report

    async def events(
        self,
        key: Hashable,
        compute: Callable[[], Awaitable[T]],
        done: Callable[[T], Awaitable[bytes]],
        *,
        hit: T | None = None,
    ) -> AsyncIterator[bytes]:
        """compute()'s progress lines, then done(its value), the last line; with a `hit` (a cached value)
        only done(hit)."""
        value = hit
        if value is None:
            queue: asyncio.Queue[Progress | None] = asyncio.Queue()
            self._listeners.add(key, queue)
            task = asyncio.ensure_future(compute())
            task.add_done_callback(lambda _task: queue.put_nowait(None))
            try:
                while (progress := await queue.get()) is not None:
                    yield line(self._event(*progress))
                value = task.result()
            except Exception as exc:  # the stream has started: the error is its last line
                yield line({"event": "error", "detail": self.detail(exc)})
                return
            finally:
                # Reached too when the client hangs up (the response closes this generator): leaving the
                # flight stops the work before its next step unless another client still waits.
                self._listeners.remove(key, queue)
                task.cancel()
                del task  # it holds its value (a trace: counted against the traces' budget)
        body = await done(value)
        # A client slow to read the last line must not keep the value alive.
        del value, hit
        yield body

    def detail(self, exc: Exception) -> str:
        """An error line's detail: what a person can act on, never a traceback."""
        if isinstance(exc, ServiceError):
            return exc.detail
        if isinstance(exc, InputError):
            return str(exc)
        if isinstance(exc, Cancelled):
            return f"{self._what} stopped: {exc}"
        detail = getattr(exc, "detail", None)  # TooManyWaitingError (503 with Retry-After)
        if isinstance(detail, str):
            return detail
        logger.error("%s failed", self._what, exc_info=exc)
        return self._failed
