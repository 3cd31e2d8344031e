"""Resident memory, read from /proc (Linux): a process's status fields, its peak reset, and the peak one call
adds, measured in a fresh child interpreter so that what earlier calls left resident does not hide it.

    from resident import child_peak_mib, print_peak_added   # a script in benchmarks/ (its own folder)

The child prints, as its last line, what print_peak_added measured; the parent reads it in child_peak_mib.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from collections.abc import Callable


def status_kib(field: str, pid: int | str = "self") -> int:
    """A KiB field (VmRSS, VmHWM, RssAnon, ...) of /proc/<pid>/status."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/{pid}/status")


def reset_peak(pid: int | str = "self") -> bool:
    """Reset the process's peak (VmHWM) to its current RSS (Linux >= 4.0); False where that is refused."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        return False
    return True


def available_bytes() -> int:
    """The memory the machine has free for a new process (MemAvailable)."""
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("MemAvailable not in /proc/meminfo")


def print_peak_added(call: Callable[[], object]) -> None:
    """Print, as one JSON line, the resident set before `call` and the peak during it (a child's answer)."""
    gc.collect()
    base = status_kib("VmRSS")
    # The peak below is then the call's own, not the model loading's.
    if not reset_peak():
        raise RuntimeError("/proc/self/clear_refs refused: the peak cannot be reset")
    result = call()
    peak = status_kib("VmHWM")
    del result
    print(json.dumps({"base_kib": base, "peak_kib": peak}))


def child_peak_mib(argv: list[str]) -> float:
    """MiB between the resident set and the peak that `python argv` prints (print_peak_added)."""
    out = subprocess.run(
        [sys.executable, *argv],
        check=True,
        capture_output=True,
        # A fixed mmap threshold: glibc otherwise raises it after the warm-up call and serves the measured
        # call from memory already resident, which would hide most of what that call allocates.
        env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"},
        text=True,
    ).stdout
    figures = json.loads(out.strip().splitlines()[-1])
    return (figures["peak_kib"] - figures["base_kib"]) / 1024
