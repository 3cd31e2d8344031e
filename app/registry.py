"""Name -> model: allowlisted, loaded lazily, once, thread-safe; a broken model is reported, not fatal.

The registry knows nothing about `mha`: app/service.py hands it one loader per name. Requests name models
only by these registered names; a path or an unknown name is a `UnknownModelError` that lists the known
names, so no request ever reaches the filesystem.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

from app.errors import ModelUnavailableError, UnknownModelError

logger = logging.getLogger(__name__)

M = TypeVar("M")


@dataclass
class Entry(Generic[M]):
    name: str
    loader: Callable[[], M]
    model: M | None = None
    error: str | None = None
    # One lock per name: loading model A never waits for model B, and A is never loaded twice.
    lock: threading.Lock = field(default_factory=threading.Lock)


class Registry(Generic[M]):
    def __init__(self, loaders: dict[str, Callable[[], M]], *, default: str) -> None:
        if default not in loaders:
            raise ValueError(f"default model {default!r} is not registered; registered: {sorted(loaders)}")
        self.default = default
        self._entries = {name: Entry(name, loader) for name, loader in loaders.items()}

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

    def get(self, name: str | None) -> tuple[str, M]:
        """(name, loaded model), loading it on first use; blocking, so call it off the event loop."""
        entry = self._entries[self.resolve(name)]
        if entry.model is not None:  # fast path without the lock once loaded
            return entry.name, entry.model
        with entry.lock:
            if entry.model is None and entry.error is None:
                logger.info("loading model %r", entry.name)
                try:
                    entry.model = entry.loader()
                except Exception as exc:  # any failure of an operator's checkpoint must not kill the service
                    entry.error = f"{type(exc).__name__}: {exc}"
                    logger.error("model %r failed to load: %s", entry.name, entry.error)
                else:
                    logger.info("model %r loaded", entry.name)
        if entry.model is None:
            raise ModelUnavailableError(entry.name, entry.error or "unknown error")
        return entry.name, entry.model

    def loaded(self, name: str) -> M | None:
        return self._entries[name].model


def scan_models_dir(directory: Path) -> dict[str, Path]:
    """Each subfolder of `directory` holding a config.json, by folder name (sorted, non-recursive)."""
    if not directory.is_dir():
        raise ValueError(f"models_dir {str(directory)!r} is not a directory")
    return {
        child.name: child
        for child in sorted(directory.iterdir())
        if child.is_dir() and (child / "config.json").is_file()
    }
