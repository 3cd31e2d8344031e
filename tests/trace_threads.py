"""A trace on one torch thread and then on two: the thread-split checks of tests/mha/test_trace.py and
tests/mha/test_trace_fused.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


def on_one_then_two_threads(run: Callable[[], T]) -> tuple[T, T]:
    """(run() on one torch thread, run() on two), both in inference mode as the service traces; the
    caller's thread count is restored after."""
    threads = torch.get_num_threads()
    try:
        with torch.inference_mode():
            torch.set_num_threads(1)
            alone = run()
            torch.set_num_threads(2)
            split = run()
        assert torch.get_num_threads() == 2  # the trace left the count it found
    finally:
        torch.set_num_threads(threads)
    return alone, split
