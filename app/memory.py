"""Giving freed memory back to the system (glibc): fewer malloc arenas, and malloc_trim.

glibc gives each thread that allocates an arena of its own, up to 8 per core, and keeps what is freed in
them for reuse. The service's threads (torch's, the batcher's, anyio's pool) free hundreds of MB after
a long answer, and without help the process keeps that as RSS for good. `limit_arenas` caps the arenas
(mallopt M_ARENA_MAX) before those threads start; `trim` (malloc_trim(0)) returns the free pages of
every arena. docs/benchmarks.md, "Memory and load", has the figures that chose these settings.

Everything here is a no-op (returning False) where glibc is not the allocator.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

M_ARENA_MAX = -8  # from glibc's malloc.h


@lru_cache(maxsize=1)
def _libc() -> Any | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
        libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    except (OSError, AttributeError):  # musl and others have no malloc_trim
        return None
    return libc


def limit_arenas(arenas: int) -> bool:
    """Cap glibc's malloc arenas; threads that start later share them. 0 leaves glibc's default."""
    libc = _libc()
    return bool(arenas and libc is not None and libc.mallopt(M_ARENA_MAX, arenas) == 1)


def trim() -> bool:
    """Return every arena's free pages to the system. Blocking (a few ms per GB): call off the loop.
    ctypes releases the GIL for the call, so other threads run meanwhile."""
    libc = _libc()
    return libc is not None and bool(libc.malloc_trim(0))


def rss_bytes() -> int:
    """This process's resident set size, 0 where /proc is not available."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0
