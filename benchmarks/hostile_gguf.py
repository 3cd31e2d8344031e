"""Issue 33 item 1's goal: started with 60 hostile GGUF files in its models folder, the server answers within
5 s and holds at most 100 MB more than without them.

The folder holds tests/hostile_gguf.py's HOSTILE headers (most over 256 MiB sparse files of zeros, claiming
2^40 vocabulary entries, tensors or keys), each several times under its own name, plus a FIFO, a link to
/dev/zero, a dangling link and a folder named *.gguf, 60 entries in all. Side by side, interleaved, against
the same server over an empty folder (the reference), each time from the server process's start:
  health  = seconds to the first 200 of GET /api/health (the server answers: the startup checks and the
            default model's load run in the background; the goal's 5 s)
  ready   = seconds to the default model loaded (/api/health "ok"), and to the startup checks done
            (its "checking" empty)
  rss     = the server's resident memory once both are done and /api/models listed (MiB)
  import  = seconds a fresh interpreter takes to import app.main (torch most of it), measured in the same
            turns: the floor under any start, which the first 200 can only add to; and the first 200
            less that floor (what the server's own start costs, the scan of the folder included)
  models  = how long GET /api/models takes, and how many entries it lists with their reason

    .venv/bin/python benchmarks/hostile_gguf.py [--repeats 3] [--files 60]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from hostile_gguf import HOSTILE, write  # noqa: E402
from launch import health, serve  # noqa: E402
from resident import status_kib  # noqa: E402
from timing import ratio  # noqa: E402

GOAL_START_S = 5.0
GOAL_ADDED_MB = 100.0
POLL_S = 0.02  # the resolution of the times measured
READY_S = 300  # a start that takes longer is an error, not a figure


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
    # The machine's own model stores left out (HEADSCOPE_DISCOVER): both sides see only their folder.
    env = {"HEADSCOPE_MODELS_DIR": str(folder), "HEADSCOPE_LOG_LEVEL": "warning"}
    env["HEADSCOPE_DISCOVER"] = "false"
    log = Path(tempfile.gettempdir()) / "hostile_gguf.log"
    started = time.monotonic()
    answers = lambda base: health(base) is not None  # noqa: E731 (the first 200, whatever it says)
    with serve(env, log=log, start_s=120, until=answers, poll_s=POLL_S) as server:
        health_s = time.monotonic() - started
        ready_s = checked_s = None
        while ready_s is None or checked_s is None:
            body = health(server.base) or {}
            now = time.monotonic() - started
            if ready_s is None and body.get("status") == "ok":
                ready_s = now
            if checked_s is None and body.get("checking") == []:
                checked_s = now
            if now > READY_S:
                raise RuntimeError(f"not ready after {READY_S:g} s: {body}; see {log}")
            time.sleep(POLL_S)
        before = time.perf_counter()
        with urllib.request.urlopen(f"{server.base}/api/models", timeout=60) as response:  # noqa: S310
            models = json.load(response)["models"]
        models_ms = (time.perf_counter() - before) * 1e3
        rss_mib = status_kib("VmRSS", server.process.pid) / 1024
    refused = sum(1 for entry in models if entry.get("error"))
    return {
        "health_s": health_s,
        "ready_s": ready_s,
        "checked_s": checked_s,
        "rss_mib": rss_mib,
        "models_ms": models_ms,
        "refused": refused,
    }


def with_floor(run: dict[str, float]) -> dict[str, float]:
    """`run` and the import floor measured right after it, and its first 200 less that floor."""
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "import app.main"], cwd=REPO, check=True)
    floor = time.monotonic() - started
    return run | {"import_s": floor, "beyond_s": run["health_s"] - floor}


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
            runs["empty"].append(with_floor(one_start(empty)))
            runs["hostile"].append(with_floor(one_start(hostile)))
    med = {side: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for side, rs in runs.items()}
    empty, hostile = med["empty"], med["hostile"]
    added = hostile["rss_mib"] - empty["rss_mib"]
    print(
        f"{args.files} hostile GGUF entries vs an empty models folder, median of {args.repeats} interleaved,"
        " seconds from the server process's start"
    )
    print(f"{'':26}{'empty':>9}{'hostile':>9}{'ratio':>8}   goal")
    for key, what in (("ready_s", "default model ready (s)"), ("checked_s", "startup checks done (s)")):
        print(f"{what:26}{empty[key]:>9.2f}{hostile[key]:>9.2f}{ratio(hostile[key], empty[key]):>8.2f}")
    print(
        f"{'first 200 of health (s)':26}{empty['health_s']:>9.2f}{hostile['health_s']:>9.2f}"
        f"{ratio(hostile['health_s'], empty['health_s']):>8.2f}   <= {GOAL_START_S:g} s: hostile at "
        f"{ratio(hostile['health_s'], GOAL_START_S):.2f} of it"
    )
    print(f"{'import app.main (s)':26}{empty['import_s']:>9.2f}{hostile['import_s']:>9.2f}   the floor")
    print(f"{'first 200 less floor (s)':26}{empty['beyond_s']:>9.2f}{hostile['beyond_s']:>9.2f}")
    print(
        f"{'resident (MiB)':26}{empty['rss_mib']:>9.0f}{hostile['rss_mib']:>9.0f}"
        f"{ratio(hostile['rss_mib'], empty['rss_mib']):>8.2f}   added {added:+.0f} MiB, "
        f"<= {GOAL_ADDED_MB:g}: {ratio(max(added, 0.0), GOAL_ADDED_MB):.2f} of it"
    )
    print(f"{'/api/models (ms)':26}{empty['models_ms']:>9.1f}{hostile['models_ms']:>9.1f}")
    print(f"{'entries with a reason':26}{empty['refused']:>9.0f}{hostile['refused']:>9.0f}")


if __name__ == "__main__":
    main()
