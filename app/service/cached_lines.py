"""`CachedLines`: what a long computation answered as one cached NDJSON line needs from the service's
parts (effects.py's head ablations, probe.py's head probe): the model's workers and the encoding threads to
run it, the answers' cache and flights to share it, and its progress stream (streamed_work.py). Composed
into each part, as the service's parts are."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from functools import partial
from typing import Any

from app.service.parts import Parts
from app.service.streamed_work import StreamedWork


class CachedLines:
    """`parts`' settings, models, submit_work, off_loop and cache look-up, `key(source)` (the service's one
    key builder, for the part's sources), and a StreamedWork of `event`, `what` and `failed` (its arguments)
    whose answer is a result line cached under its key."""

    def __init__(
        self,
        parts: Parts,
        *,
        key: Callable[[Any], Hashable],
        event: Callable[[int, int], dict[str, Any]],
        what: str,
        failed: str,
    ) -> None:
        self.settings, self.models, self.key = parts.settings, parts.models, key
        self.submit, self.off_loop = parts.forwards.submit_work, parts.encoders.off_loop
        self.get = parts.answers.get
        self._cached = parts.answers.cached
        self.progress = StreamedWork(event, what=what, failed=failed)

    def events(
        self,
        key: Hashable,
        compute: Callable[[threading.Event], Awaitable[bytes]],
        *,
        hit: bytes | None,
    ) -> AsyncIterator[bytes]:
        """compute(abandoned)'s progress lines, then its line: computed once for identical requests in flight
        and cached under `key`; a `hit` (the cached line) is answered as it is."""
        return self.progress.events(key, partial(self._cached, key, compute), _as_is, hit=hit)


async def _as_is(body: bytes) -> bytes:
    return body  # the result's line, encoded when it was computed (and cached)
