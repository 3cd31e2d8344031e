"""gguf's GGUFReader and get_tensor_name_map shared within one reading of a GGUF file's config, names
and tokenizer (mha.loading.gguf.cache), where transformers would build each anew many times; the
reader itself at a quarter of gguf's memory (lean_reader).
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

__all__ = ["lean_reader", "one_reading"]

# What the reading running in this thread shares: its readers by (path, mode) and its name maps by
# arguments; None outside a reading (see one_reading).
_SHARED: ContextVar[dict[tuple[Any, ...], Any] | None] = ContextVar("gguf_shared", default=None)
_PATCH_GUARD = threading.Lock()
_patched = 0  # readings in progress, which keep gguf's stand-ins installed


@contextmanager
def one_reading() -> Iterator[None]:
    """Within it, gguf's GGUFReader and get_tensor_name_map answer each question of this thread's
    reading once.

    transformers' GGUF loader parses the file's metadata anew for the config, for the tensors and for the
    tokenizer's config (a GGUFReader each: seconds for a 49,152-token vocabulary, read field by field),
    and builds a fresh gguf name map for every submodule of the model (hundreds). The same file gives the
    same reader and the same arguments the same map, so sharing them is the same reading in under half
    the time.

    Why a patch of gguf's module: transformers takes a path, never a reader, and looks both names up in
    gguf at each call (`from gguf import GGUFReader` inside load_gguf_checkpoint, which AutoTokenizer
    calls too), so there is nothing to pass them through. The stand-ins are installed while any reading
    runs and each looks up the calling thread's own cache (_SHARED, a ContextVar): readings of
    different files run at once, each sharing only its own readings, and any other caller (a header check
    in another thread) gets gguf's own answer."""
    import gguf

    global _patched
    token = _SHARED.set({})
    with _PATCH_GUARD:
        if _patched == 0:
            _install(gguf)
        _patched += 1
    try:
        yield
    finally:
        _SHARED.reset(token)
        with _PATCH_GUARD:
            _patched -= 1
            if _patched == 0:
                gguf.GGUFReader, gguf.get_tensor_name_map = _ORIGINAL  # type: ignore[misc]


_ORIGINAL: tuple[Any, Any] = (None, None)  # gguf's own GGUFReader and get_tensor_name_map


def _install(gguf: Any) -> None:
    """gguf's GGUFReader and get_tensor_name_map replaced by stand-ins that share within a reading."""
    global _ORIGINAL
    reader, name_map = _ORIGINAL = gguf.GGUFReader, gguf.get_tensor_name_map

    def shared(key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        cache = _SHARED.get()
        if cache is None:  # not this thread's reading
            return make()
        if key not in cache:
            cache[key] = make()
        return cache[key]

    lean = lean_reader(reader)  # what load_gguf_checkpoint reads, at a quarter of the memory

    def shared_reader(path: str | os.PathLike[str], mode: str = "r") -> Any:
        return shared(("reader", os.fspath(path), mode), lambda: lean(path, mode))

    @functools.wraps(name_map)
    def shared_name_map(*args: Any, **kwargs: Any) -> Any:
        return shared(("names", args, tuple(sorted(kwargs.items()))), lambda: name_map(*args, **kwargs))

    gguf.GGUFReader, gguf.get_tensor_name_map = shared_reader, shared_name_map


def lean_reader(reader: Any) -> Any:
    """gguf's GGUFReader, its values read as plain numpy views: what load_gguf_checkpoint reads, at a
    quarter of the memory and half the time.

    GGUFReader keeps every value of every array as an array of its own (a string: its length and its
    bytes), each a slice of its np.memmap: a memmap slice is a Python-level subclass instance (its
    __array_finalize__ copies the map's attributes) with a fresh byte-order dtype, about 2 KB a
    vocabulary entry (2.0 GB and minutes for 2^20 entries). Here the map is viewed as a
    plain ndarray and, in a file of the host's byte order, a value is the plain view itself: the same
    parts, types and offsets, about 0.45 KB an entry. Parsing stays gguf's own."""
    import numpy as np

    class LeanReader(reader):  # type: ignore[misc, valid-type]
        @property
        def data(self) -> Any:
            return self._plain

        @data.setter
        def data(self, value: Any) -> None:
            self._plain = value.view(np.ndarray)  # the mapping stays alive as its base

        def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None) -> Any:
            if override_order is not None or self.byte_order != "I":
                return super()._get(offset, dtype, count, override_order)
            kind = np.dtype(dtype)  # a cached descriptor, not a new one per value
            return self.data[offset : offset + kind.itemsize * int(count)].view(kind)

    return LeanReader
