"""benchmarks/gpu.py's frame: a row of its table, the run every section reads and adds to (the device, the
sizes, the shared SmolLM2-shaped network), the time cap a section runs under, and the table printed at the
end.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from timing import synchronize

# The SmolLM2-shaped checkpoint's position limit: the trace's largest size.
LONG_POSITIONS = 32768
MiB = 1 << 20


class OutOfTime(Exception):
    """A section ran past its cap."""


class Skipped(Exception):
    """A check this device cannot run; the message says why."""


@dataclass
class Row:
    section: str
    check: str
    ours: str
    reference: str
    ratio: float | None = None  # ours / reference, where both are one number
    note: str = ""
    values: dict[str, float | None] = field(default_factory=dict)  # the raw figures, for the JSON


@dataclass
class Run:
    """What every section reads (the device, the sizes) and adds to (rows, notes)."""

    device: torch.device
    quick: bool
    scratch: Path
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    deadline: float = float("inf")  # the running section's cap, as time.monotonic()
    _smollm2: tuple[str, Any] | None = None

    def add(self, row: Row) -> None:
        self.rows.append(row)
        ratio = "" if row.ratio is None else f" ({row.ratio:.2f})"
        print(f"  {row.check}: {row.ours} | {row.reference}{ratio} {row.note}".rstrip(), flush=True)

    def left(self) -> float:
        """Seconds left of the running section's cap."""
        return self.deadline - time.monotonic()

    def smollm2(self) -> tuple[str, Any]:
        """(checkpoint directory, our network on the device): a random SmolLM2-135M-shaped Llama, built
        once for the trace and attend sections."""
        if self._smollm2 is None:
            from random_llama import llama_checkpoint, load_network

            directory = self.scratch / "smollm2"
            llama_checkpoint(str(directory))
            config = json.loads((directory / "config.json").read_text())
            # Rotary positions have no table: the limit is a number in the config, raised for 32,768.
            config["max_position_embeddings"] = LONG_POSITIONS
            (directory / "config.json").write_text(json.dumps(config))
            self._smollm2 = (str(directory), load_network(str(directory)).to(self.device))
        return self._smollm2


def peak_added_mib(device: torch.device, call: Callable[[], object]) -> float | None:
    """MiB the call's peak allocation adds on an accelerator (None on the CPU: benchmarks/long.py measures
    the resident set there, in fresh processes)."""
    if device.type != "cuda":
        return None
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    result = call()
    synchronize(device)
    del result
    return (torch.cuda.max_memory_allocated(device) - base) / MiB


@contextmanager
def time_cap(seconds: float) -> Iterator[None]:
    """Raise OutOfTime in the section once `seconds` have passed (between Python steps: a kernel running
    on the device finishes first)."""

    def expire(signum: int, frame: object) -> None:
        raise OutOfTime(f"stopped at its {seconds:.0f} s cap")

    previous = signal.signal(signal.SIGALRM, expire)
    # And again every second after: a library's broad `except Exception` may swallow the first one.
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01), 1.0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def table(rows: list[Row]) -> str:
    head = ("section", "check", "headscope", "reference", "ratio", "note")
    cells = [head] + [
        (r.section, r.check, r.ours, r.reference, "" if r.ratio is None else f"{r.ratio:.2f}", r.note)
        for r in rows
    ]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head) - 1)]
    return "\n".join(
        "  ".join(c[i].ljust(w) for i, w in enumerate(widths)) + "  " + c[-1] for c in cells
    ).rstrip()
