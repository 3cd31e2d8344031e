"""Large CPU buffers backed by transparent huge pages where the kernel offers them (Linux, THP "madvise").

The stacked attention tensor is big ([L, H, n, n]: 75 MB for MiniLM at n = 512) and freshly allocated
on every call, since the caller keeps it. Above glibc's mmap threshold each call gets new pages, and
faulting them in 4 KiB at a time costs more than the softmax that fills them; advising 2 MiB pages
before the first touch cuts that cost several times. Advice only: where it is unavailable nothing changes.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import sys
from collections.abc import Iterable
from functools import lru_cache
from typing import Any, cast

import torch

logger = logging.getLogger(__name__)

_HUGE_PAGE = 2 << 20
_MIN_BYTES = 4 * _HUGE_PAGE  # below this the fault cost is small and the advice not worth a syscall


@lru_cache(maxsize=1)
def _madvise() -> Any | None:
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        func = libc.madvise
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    func.restype = ctypes.c_int
    return func


def empty_buffer(*shape: int, like: torch.Tensor) -> torch.Tensor:
    """torch.empty(shape) with like's dtype and device; on the CPU, huge-page advised when large."""
    buffer = like.new_empty(shape)
    size = buffer.numel() * buffer.element_size()
    if buffer.device.type != "cpu" or size < _MIN_BYTES:
        return buffer
    madvise = _madvise()
    if madvise is None:
        return buffer
    address = buffer.data_ptr()
    start = -(-address // _HUGE_PAGE) * _HUGE_PAGE  # only whole huge pages inside the buffer
    end = (address + size) // _HUGE_PAGE * _HUGE_PAGE
    if end > start and madvise(start, end - start, mmap.MADV_HUGEPAGE) != 0:
        logger.debug("madvise(MADV_HUGEPAGE) failed with errno %d", ctypes.get_errno())
    return buffer


@lru_cache(maxsize=1)
def _malloc_trim() -> Any | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        func = ctypes.CDLL(None).malloc_trim  # glibc; absent under musl
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_size_t]
    func.restype = ctypes.c_int
    return func


def release_free_memory() -> None:
    """Give the C heap's free pages back to the system (glibc malloc_trim): a long job of many batches of
    varying shapes otherwise keeps the high-water mark of every arena, and its resident memory creeps up."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def resident_bytes() -> int | None:
    """This process's resident memory in bytes (Linux: /proc/self/statm); None where it cannot be read."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * mmap.PAGESIZE
    except (OSError, ValueError, IndexError):
        return None


class HeapReleaser:
    """``release_free_memory`` once resident memory has grown ``slack`` bytes past its level after the
    round of work that followed the last release; call it after each round (a corpus batch).

    A release is not free: the next round faults in again every page it gave back (its buffers and
    activations; for a corpus batch of MiniLM, tens of ms, ~5 % of a run when done after every batch).
    Measured one round after a release, the level holds the live data and one round's working memory, so
    what grows past it is the heap's creep, and the bound stays: memory does not grow with the number of
    rounds. Where resident memory cannot be read, every call releases."""

    def __init__(self, slack: int) -> None:
        self.slack = slack
        self._level: int | None = None  # resident bytes one round after the last release
        self._released = False  # released by the last call: its next call sets the level

    def __call__(self) -> bool:
        """Whether this call released."""
        resident = resident_bytes()
        if resident is not None and self._released:
            self._level, self._released = resident, False
            return False
        if resident is not None and self._level is not None and resident <= self._level + self.slack:
            return False
        release_free_memory()
        self._released = True
        return True


def held_nbytes(module: torch.nn.Module, extra: Iterable[torch.Tensor | None] = ()) -> int:
    """The bytes `module` holds: its parameters and buffers and the `extra` tensors, each storage once
    (tied weights and views share one; a GGUF's packed blocks count as the file's bytes they map), plus
    what its layers may keep besides: a layer's `budget` (a packed layer's DequantBudget, shared by a
    model's layers: counted once) at what it can ever keep, the smaller of its `limit` and every layer of it
    dequantized (`dequantized_nbytes`): a 10 MB file's model does not count a 768 MiB cache it cannot fill
    (issue 48 E4; mha.loading.gguf.memory.held_nbytes predicts this from the header)."""
    tensors = [*module.parameters(), *module.buffers(), *(t for t in extra if t is not None)]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    limits: dict[int, int] = {}
    fills: dict[int, int] = {}
    for layer in module.modules():
        if (budget := getattr(layer, "budget", None)) is not None:
            limits[id(budget)] = budget.limit
            fills[id(budget)] = fills.get(id(budget), 0) + cast(int, layer.dequantized_nbytes)
    return sum(storages.values()) + sum(min(limit, fills[key]) for key, limit in limits.items())
