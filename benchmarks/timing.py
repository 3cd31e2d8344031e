"""The benchmarks' one way to time what they compare: warm every side up, interleave the sides' repeats so
that the machine's load weighs on each alike, and keep each side's median and minimum (the minimum is the
figure least disturbed by other processes on a shared machine). Ratios are ours / reference.

    from timing import interleaved, timed   # a script in benchmarks/ (its own folder)

    got = interleaved({"ours": ours, "theirs": theirs}, repeats=20)
    print(got["ours"].median_ms, got["ours"].min_ms, ratio(got["ours"].median, got["theirs"].median))
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Timing:
    """One side's timed calls, in seconds."""

    seconds: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def min(self) -> float:
        return min(self.seconds)

    @property
    def median_ms(self) -> float:
        return self.median * 1000

    @property
    def min_ms(self) -> float:
        return self.min * 1000


def synchronize(device: torch.device | None) -> None:
    """Wait for an accelerator's queued work (a no-op on the CPU)."""
    if device is not None and device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def interleaved(
    runs: Mapping[str, Callable[[], object]],
    repeats: int,
    *,
    warm: int = 1,
    device: torch.device | None = None,
) -> dict[str, Timing]:
    """{name: Timing} of `repeats` calls of each run, taken in turn, after `warm` untimed calls of each. On an
    accelerator the device is drained before and after every call, so that none pays for the one before it
    and each pays for its own kernels. Each call's result is dropped before the next call starts."""
    for _ in range(warm):
        for run in runs.values():
            run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            synchronize(device)
            start = time.perf_counter()
            result = run()
            synchronize(device)
            times[name].append(time.perf_counter() - start)
            del result
    return {name: Timing(tuple(spent)) for name, spent in times.items()}


def timed(
    call: Callable[[], object], repeats: int, *, warm: int = 1, device: torch.device | None = None
) -> Timing:
    """One side alone, timed as `interleaved` times each (where there is nothing to interleave it with)."""
    return interleaved({"": call}, repeats, warm=warm, device=device)[""]


def ratio(ours: float, reference: float) -> float:
    """ours / reference; nan where the reference took no time at all."""
    return ours / reference if reference else float("nan")
