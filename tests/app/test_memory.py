"""Freed memory goes back to the system: glibc's arenas capped, and trimmed after large answers."""

from __future__ import annotations

import ctypes.util
import sys
import threading
import time

import pytest

import app.service.trim as service_module
from app import memory
from app.main import create_app
from tests.app.started import serving

glibc = pytest.mark.skipif(
    not sys.platform.startswith("linux") or "libc.so" not in (ctypes.util.find_library("c") or ""),
    reason="glibc's malloc_trim and mallopt",
)


@glibc
def test_trim_and_arena_limit_reach_glibc() -> None:
    assert memory.limit_arenas(8) is True  # glibc's own default on 1 core; harmless to set in a test
    assert memory.limit_arenas(0) is False  # 0: leave glibc's default alone

    # Free a few hundred MB from another thread's arena, then trim: malloc_trim says it released memory.
    def churn() -> None:
        blocks = [bytearray(64 << 10) for _ in range(4096)]  # 256 MiB of 64 KiB blocks (below mmap's)
        del blocks

    thread = threading.Thread(target=churn)
    thread.start()
    thread.join()
    assert memory.trim() is True
    assert memory.rss_bytes() > 0


@pytest.mark.parametrize("enabled", [True, False])
def test_the_service_trims_once_idle_after_a_large_answer(
    make_settings, monkeypatch: pytest.MonkeyPatch, enabled: bool
) -> None:  # type: ignore[no-untyped-def]
    trims: list[float] = []
    monkeypatch.setattr(service_module.memory, "trim", lambda: trims.append(time.monotonic()) or True)
    monkeypatch.setattr(service_module, "IDLE_TRIM_SECONDS", 0.05)
    monkeypatch.setattr(service_module, "TRIM_INTERVAL", 3600.0)  # only the idle trim in this test
    app = create_app(make_settings(malloc_trim=enabled))
    with serving(app) as client:
        monkeypatch.setattr(service_module, "LARGE_BYTES", 10**9)  # nothing is large...
        client.post("/api/attention", json={"text": "A small answer."})
        time.sleep(0.3)
        assert trims == []  # ...so nothing is trimmed
        monkeypatch.setattr(service_module, "LARGE_BYTES", 1)  # everything is large
        client.post("/api/attention", json={"text": "A large answer."})
        deadline = time.monotonic() + 10
        while enabled and not trims and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # idle on: one trim, not one per idle interval
        assert len(trims) == (1 if enabled else 0)
