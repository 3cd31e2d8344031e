"""`Answers`: the answer cache and the flights. Finished answers (the result tensor, the views of it, the
JSON bytes of answers of moderate size, the gzipped compact bytes) are kept in one LRU, bounded in entries
and bytes, by one key builder (`cache_key`: what it is, then what it is computed from); identical work in
flight, forwards and answers alike, runs once for all who ask (flights.py `Flights`), and is dropped when
every one of them has gone."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from typing import Any, TypeVar

from app.cache import LRUCache
from app.service.computed import Computed
from app.service.flights import Flights
from app.settings import Settings

T = TypeVar("T")
V = TypeVar("V", bytes, Computed)
# (registered model name, text, pair, tokens to write (None: the model's default), chat template, an
# encoder-decoder's target, the head probe's (seed, length) when its first sequence is the input): what a
# forward depends on
Probe = tuple[int, int] | None
Input = tuple[str, str, str | None, int | None, bool, str | None, Probe]


def cache_key(kind: str, *inputs: Input, extra: tuple[Hashable, ...] = ()) -> tuple[Hashable, ...]:
    """The one key of everything cached or shared in flight: what it is, then what it is computed from."""
    return (kind, *(part for one in inputs for part in one), *extra)


def result_key(source: Input, *, norms: bool) -> tuple[Hashable, ...]:
    """The key a forward's result is cached and shared in flight under: one with the value norms kept
    (weighting "norm") apart from one without."""
    return cache_key("result.norms" if norms else "result", source)


class Answers:
    """The LRU of finished answers and the flights of those being computed (module docstring)."""

    def __init__(self, settings: Settings) -> None:
        self.cache = LRUCache(max_entries=settings.cache_size, max_bytes=settings.cache_max_bytes)
        self.flights = Flights()

    @property
    def busy(self) -> bool:
        """Work is in flight (the idle trim waits for it)."""
        return bool(len(self.flights))

    def in_flight(self, key: Hashable) -> bool:
        return key in self.flights

    def get(self, key: Hashable) -> Any:
        """A plain look-up in the cache (None: not there)."""
        return self.cache.get(key)

    def keep(self, key: Hashable, value: bytes | Computed) -> None:
        """`value` cached under `key`, counted by its size (bytes, or the view's tensors)."""
        self.cache.put(key, value, size=len(value) if isinstance(value, bytes) else value.nbytes)

    async def cached(self, key: Hashable, compute: Callable[[threading.Event], Awaitable[V]]) -> V:
        """The cached value of `key`, else computed once for all identical requests in flight and cached."""
        hit = self.cache.get(key)
        if hit is not None:
            return hit  # type: ignore[no-any-return]
        return await self.once(key, compute)

    async def once(self, key: Hashable, compute: Callable[[threading.Event], Awaitable[V]]) -> V:
        """compute(abandoned) run once for all identical requests in flight, its value cached under `key`."""

        async def run(abandoned: threading.Event) -> V:
            value = await compute(abandoned)
            self.keep(key, value)
            return value

        return await self.flights.join(key, run)

    async def shared(self, key: Hashable, compute: Callable[[threading.Event], Coroutine[Any, Any, T]]) -> T:
        """compute(abandoned) run once for all identical requests in flight, not cached (cheap to redo)."""
        return await self.flights.join(key, compute)
