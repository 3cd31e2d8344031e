"""Name -> model: allowlisted, loaded lazily, once, thread-safe; a broken model is reported, not fatal.

The registry loads and scans nothing itself (it imports no `mha`): app/service hands it one
loader per name, and optionally a cheap check per name (are the checkpoint's files there and
consistent?) that `check_all()` runs at startup, so /api/models names a broken checkpoint before any
request does. Requests name models only by these registered names; a path or an unknown name is a
`UnknownModelError` that lists the known names, so no request ever reaches the filesystem.

Each entry has a `state` for /api/models and /api/health: "checking" (its startup check has not run yet),
"loading", "loaded", "failed" or "available" (checked, loaded on its first request).

With `max_bytes`, loaded models are kept least-recently-used within that many bytes (`size_of` a model,
measured once loaded; `estimate(name, what its check found)`, read before loading: what the load needs,
such as a GGUF's predicted first-load memory or the weights' size on disk). To load one, the models used
least recently are unloaded first: the registry drops its reference, and the memory is freed once the
requests still holding the model have finished (a weak reference tells when; until then its bytes still
count, and a load waits up to `drain_seconds` for them). A model bigger than the whole budget is refused
before loading where its estimate says so, else right after, with both sizes: a 503, never the process
killed for memory.

A failed check or load is kept as the entry's `error` and tried again on the first request after a
back-off (`retry_seconds`, doubled after each further failure up to `retry_max_seconds`): a checkpoint
the operator fixes comes up without a restart, and a broken one costs one attempt per back-off, not one
per request.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Generic, TypeVar

from app.errors import ModelUnavailableError, ServiceError, UnknownModelError

logger = logging.getLogger(__name__)

M = TypeVar("M")


@dataclass
class Entry(Generic[M]):
    name: str
    loader: Callable[[], M]
    check: Callable[[], object] | None = None
    found: object = None  # what the last passing check returned (the checkpoint's architecture)
    model: M | None = None
    error: str | None = None
    failures: int = 0  # consecutive failed attempts (check or load) since the last success
    retry_at: float = 0.0  # clock time before which a failed entry is not tried again
    checked: bool = False  # its check (or a load, which checks first) has run at least once
    loading: bool = False  # a load is in progress
    nbytes: int = 0  # what the model held when last loaded (size_of): counted while loaded
    used_at: float = 0.0  # clock time of its last use: the least recent is unloaded first
    # One lock per name: loading model A never waits for model B, and A is never loaded twice.
    lock: threading.Lock = field(default_factory=threading.Lock)


class Registry(Generic[M]):
    def __init__(
        self,
        loaders: dict[str, Callable[[], M]],
        *,
        default: str,
        checks: dict[str, Callable[[], object]] | None = None,
        retry_seconds: float = 5.0,
        retry_max_seconds: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        max_bytes: int | None = None,
        size_of: Callable[[M], int] | None = None,
        estimate: Callable[[str, object], int | None] | None = None,
        drain_seconds: float = 30.0,
    ) -> None:
        if default not in loaders:
            raise ValueError(f"default model {default!r} is not registered; registered: {sorted(loaders)}")
        checks = checks or {}
        if unknown := sorted(set(checks) - set(loaders)):
            raise ValueError(f"checks for unregistered models {unknown}; registered: {sorted(loaders)}")
        if retry_seconds <= 0 or retry_max_seconds < retry_seconds:
            raise ValueError(
                f"retry_seconds ({retry_seconds}) must be > 0 and <= retry_max_seconds ({retry_max_seconds})"
            )
        self.default = default
        self.retry_seconds = retry_seconds
        self.retry_max_seconds = retry_max_seconds
        self._clock = clock
        if max_bytes is not None and (max_bytes <= 0 or size_of is None):
            raise ValueError(f"max_bytes ({max_bytes}) must be > 0 and comes with size_of")
        self.max_bytes = max_bytes
        self._size_of = size_of
        self._estimate = estimate
        self._drain_seconds = drain_seconds
        # Budget bookkeeping: who holds what, the unloaded models still answering (weak references, with
        # their bytes and names); one condition for all of it.
        self._budget = threading.Condition()
        self._draining: list[tuple[weakref.ref[object], int, str]] = []
        self._reserved: dict[str, int] = {}  # loads in progress: the bytes their estimate made room for
        self._entries = {
            name: Entry(name, loader, check=checks.get(name)) for name, loader in loaders.items()
        }

    @property
    def names(self) -> list[str]:
        return list(self._entries)

    def __iter__(self) -> Iterator[Entry[M]]:
        return iter(list(self._entries.values()))

    def resolve(self, name: str | None) -> str:
        """The registered name a request means (None: the default); anything else is 404."""
        if name is None:
            return self.default
        # Exact dictionary lookup: "../x", "/etc/passwd" or "a/b" can only match if the operator
        # registered that very string as a name.
        if name not in self._entries:
            raise UnknownModelError(name, self._entries)
        return name

    def check_all(self) -> None:
        """Run every entry's check (blocking: call it off the event loop), recording failures as errors.
        An entry whose lock is taken is skipped: it is being loaded, and a load checks first."""
        for entry in self:
            if entry.check is None or not entry.lock.acquire(blocking=False):
                continue
            try:
                if entry.model is None and entry.error is None:
                    self._attempt(entry, partial(self._check, entry), "check")
            finally:
                entry.lock.release()

    def state(self, entry: Entry[M]) -> str:
        """What /api/models says of the entry (module docstring)."""
        if entry.model is not None:
            return "loaded"
        if entry.loading:
            return "loading"
        if entry.error is not None:
            return "failed"
        return "checking" if entry.check is not None and not entry.checked else "available"

    def get(self, name: str | None) -> tuple[str, M]:
        """(name, loaded model), loading it on first use; blocking, so call it off the event loop."""
        entry = self._entries[self.resolve(name)]
        model = entry.model
        if model is not None:  # fast path without the lock once loaded
            entry.used_at = self._clock()
            return entry.name, model
        with entry.lock:
            if entry.model is None and (entry.error is None or self._clock() >= entry.retry_at):
                if entry.error is not None:
                    logger.info("model %r: trying again after failure %d", entry.name, entry.failures)
                entry.loading = True
                try:
                    self._attempt(entry, lambda: self._load(entry), "load")
                finally:
                    entry.loading = False
        model = entry.model  # once: an unload may come between a check and a return
        if model is None:
            raise ModelUnavailableError(entry.name, entry.error or "unknown error")
        return entry.name, model

    def retry_in(self, name: str) -> float | None:
        """Seconds until the failed entry `name` may be tried again (0 once its back-off has passed); None
        when it has not failed or is loaded."""
        entry = self._entries[name]
        if entry.model is not None or entry.error is None:
            return None
        return max(0.0, entry.retry_at - self._clock())

    def loaded(self, name: str) -> M | None:
        """The model if loaded (a look, not a use: /api/models and health read it)."""
        return self._entries[name].model

    def use(self, name: str) -> M | None:
        """The model if loaded, marked as used now (what the least-recently-used unloading reads)."""
        entry = self._entries[name]
        model = entry.model
        if model is not None:
            entry.used_at = self._clock()
        return model

    def _check(self, entry: Entry[M]) -> None:
        if entry.check is not None:
            try:
                entry.found = entry.check()
            finally:
                entry.checked = True

    def held_bytes(self) -> int:
        """What the loaded models hold, and the unloaded ones still answering requests."""
        with self._budget:
            return self._held()

    def _load(self, entry: Entry[M]) -> None:
        self._check(entry)  # the cheap check first: its message is the clearer one
        if self.max_bytes is not None:
            # What it held when last loaded, else a lower bound from its check (0: nothing known yet)
            estimate = self._estimate(entry.name, entry.found) if self._estimate is not None else None
            need = max(entry.nbytes, estimate or 0)
            if need > self.max_bytes:
                raise ModelTooLargeError(entry.name, need, self.max_bytes, "loading it needs")
            self._make_room(entry, need)
        logger.info("loading model %r", entry.name)
        try:
            model = entry.loader()
        finally:
            with self._budget:
                self._reserved.pop(entry.name, None)
        nbytes = self._size_of(model) if self._size_of is not None else 0
        if self.max_bytes is not None and nbytes > self.max_bytes:
            del model  # freed here: nothing else holds it yet
            gc.collect()
            raise ModelTooLargeError(entry.name, nbytes, self.max_bytes, "loaded, it holds")
        with self._budget:
            entry.model, entry.nbytes, entry.used_at = model, nbytes, self._clock()
        logger.info("model %r loaded (%.1f MB)", entry.name, nbytes / 1e6)
        if self.max_bytes is not None:
            self._make_room(entry, 0, wait=False)  # where the estimate fell short of what it holds

    def _held(self) -> int:
        """Bytes held (under self._budget): every loaded model, and the unloaded ones still alive."""
        self._draining = [d for d in self._draining if d[0]() is not None]
        loaded = sum(e.nbytes for e in self._entries.values() if e.model is not None)
        return loaded + sum(nbytes for _, nbytes, _ in self._draining) + sum(self._reserved.values())

    def _make_room(self, entry: Entry[M], need: int, *, wait: bool = True) -> None:
        """Unload the least recently used models until `need` more bytes fit beside `entry`'s and reserve
        them; then (`wait`) wait up to drain_seconds for unloaded ones still answering, BudgetHeldError if
        they do not finish."""
        assert self.max_bytes is not None
        deadline = time.monotonic() + self._drain_seconds  # real time, whatever clock the back-off reads
        with self._budget:
            while self._held() + need > self.max_bytes:
                victims = [e for e in self._entries.values() if e is not entry and e.model is not None]
                if victims:
                    self._unload(min(victims, key=lambda e: e.used_at))
                    continue
                if not wait:
                    return  # loaded already: what drains is freed as its requests end
                gc.collect()  # a model in a reference cycle is freed only by a collection
                if self._held() + need <= self.max_bytes:
                    break
                if time.monotonic() >= deadline:
                    names = sorted({name for _, _, name in self._draining} | set(self._reserved))
                    raise BudgetHeldError(entry.name, self.max_bytes, names)
                self._budget.wait(0.2)
            if need:
                self._reserved[entry.name] = need

    def _unload(self, entry: Entry[M]) -> None:
        """Drop the registry's reference (under self._budget); requests holding the model finish with it."""
        model, entry.model = entry.model, None
        assert model is not None
        self._draining.append((weakref.ref(model), entry.nbytes, entry.name))
        logger.info(
            "model %r unloaded to make room (%.1f MB, used least recently)", entry.name, entry.nbytes / 1e6
        )
        entry.nbytes = 0

    def _attempt(self, entry: Entry[M], work: Callable[[], object], what: str) -> None:
        """Run `work` under the entry's lock; on failure record the error and when to try again."""
        try:
            work()
        except BudgetHeldError:
            raise  # a passing state of the budget, not the model's failure
        except Exception as exc:  # any failure of an operator's checkpoint must not kill the service
            entry.error = f"{type(exc).__name__}: {exc}"
            entry.failures += 1
            delay = min(self.retry_max_seconds, self.retry_seconds * 2 ** (entry.failures - 1))
            entry.retry_at = self._clock() + delay
            logger.error(
                "model %r failed its %s: %r (trying again after %.0f s)", entry.name, what, entry.error, delay
            )
        else:
            if entry.model is not None:  # a passing check alone proves nothing yet: keep the count
                entry.error, entry.failures = None, 0


class ModelTooLargeError(Exception):
    """A model bigger than the whole budget (HEADSCOPE_MODELS_MAX_BYTES): it can never be loaded here."""

    def __init__(self, name: str, nbytes: int, budget: int, what: str) -> None:
        super().__init__(
            f"model {name!r} does not fit the memory budget for models: {what} {_gb(nbytes)}, more than "
            f"the whole budget of {_gb(budget)} (HEADSCOPE_MODELS_MAX_BYTES)"
        )


class BudgetHeldError(ServiceError):
    """The budget is held by unloaded models whose requests are still running: try again shortly. Not the
    model's failure: nothing is recorded against it."""

    status = 503

    def __init__(self, name: str, budget: int, draining: list[str]) -> None:
        super().__init__(
            f"model {name!r} cannot be loaded yet: the memory budget for models ({_gb(budget)}) is held by "
            f"{', '.join(map(repr, draining))}, unloaded but still answering or being loaded; try again soon"
        )


def _gb(nbytes: int) -> str:
    return f"{nbytes / 1e9:.2f} GB"
