"""Issue 33 item 1's goal: started with 60 hostile GGUF files in its models folder, the server answers within
5 s and holds at most 100 MB more than without them.

The folder holds tests/hostile_gguf.py's HOSTILE headers (most over 256 MiB sparse files of zeros, claiming
2^40 vocabulary entries, tensors or keys), each several times under its own name, plus a FIFO, a link to
/dev/zero, a dangling link and a folder named *.gguf, 60 entries in all. Side by side, interleaved, against
the same server over an empty folder (the reference):
  start   = seconds from the process's start to GET /api/health answering ok (the startup scan included;
            most of it is loading the default model, which both sides do)
  rss     = the server's resident memory once healthy and /api/models listed (MiB)
  models  = how long GET /api/models takes, and how many entries it lists with their reason

    .venv/bin/python benchmarks/hostile_gguf.py [--repeats 3] [--files 60]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from hostile_gguf import HOSTILE, write  # noqa: E402
from launch import serve  # noqa: E402
from resident import status_kib  # noqa: E402

GOAL_START_S = 5.0
GOAL_ADDED_MB = 100.0


def hostile_folder(folder: Path, files: int) -> int:
    """`files` hostile entries in `folder`: HOSTILE's headers in turn, then the four that are no files."""
    folder.mkdir(parents=True, exist_ok=True)
    os.mkfifo(folder / "pipe.gguf")
    (folder / "zero.gguf").symlink_to("/dev/zero")
    (folder / "gone.gguf").symlink_to(folder / "missing.gguf")
    (folder / "folder.gguf").mkdir()
    cases = list(HOSTILE.values())
    for index in range(files - 4):
        data, size, _ = cases[index % len(cases)]
        write(folder / f"hostile-{index:02d}.gguf", data, size)
    return files


def one_start(folder: Path) -> dict[str, float]:
    env = {"HEADSCOPE_MODELS_DIR": str(folder), "HEADSCOPE_LOG_LEVEL": "warning"}
    started = time.monotonic()
    with serve(env, log=Path(tempfile.gettempdir()) / "hostile_gguf.log", start_s=120) as server:
        start_s = time.monotonic() - started
        before = time.perf_counter()
        with urllib.request.urlopen(f"{server.base}/api/models", timeout=60) as response:  # noqa: S310
            models = json.load(response)["models"]
        models_ms = (time.perf_counter() - before) * 1e3
        rss_mib = status_kib("VmRSS", server.process.pid) / 1024
    refused = sum(1 for entry in models if entry.get("error"))
    return {"start_s": start_s, "rss_mib": rss_mib, "models_ms": models_ms, "refused": refused}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--files", type=int, default=60)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        empty, hostile = Path(tmp) / "empty", Path(tmp) / "hostile"
        empty.mkdir()
        hostile_folder(hostile, args.files)
        runs: dict[str, list[dict[str, float]]] = {"empty": [], "hostile": []}
        for _ in range(args.repeats):  # interleaved: machine load hits both alike
            runs["empty"].append(one_start(empty))
            runs["hostile"].append(one_start(hostile))
    med = {side: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for side, rs in runs.items()}
    added = med["hostile"]["rss_mib"] - med["empty"]["rss_mib"]
    print(
        f"{args.files} hostile GGUF entries vs an empty models folder, median of {args.repeats} interleaved"
    )
    print(f"{'':22}{'empty':>10}{'hostile':>10}{'ratio':>8}   goal")
    print(
        f"{'start to health (s)':22}{med['empty']['start_s']:>10.2f}{med['hostile']['start_s']:>10.2f}"
        f"{med['hostile']['start_s'] / med['empty']['start_s']:>8.2f}   "
        f"added {med['hostile']['start_s'] - med['empty']['start_s']:+.2f} s, <= {GOAL_START_S:g} s in all"
    )
    print(
        f"{'resident (MiB)':22}{med['empty']['rss_mib']:>10.0f}{med['hostile']['rss_mib']:>10.0f}"
        f"{med['hostile']['rss_mib'] / med['empty']['rss_mib']:>8.2f}   "
        f"added {added:+.0f} MiB, <= {GOAL_ADDED_MB:g}"
    )
    print(f"{'/api/models (ms)':22}{med['empty']['models_ms']:>10.1f}{med['hostile']['models_ms']:>10.1f}")
    print(f"{'entries with a reason':22}{med['empty']['refused']:>10.0f}{med['hostile']['refused']:>10.0f}")


if __name__ == "__main__":
    main()
