"""What GET /api/corpus/runs costs with many runs in HEADSCOPE_RUNS_DIR: the first listing (every folder
looked at and its run.json read, what every listing cost before it was kept), a listing with nothing
changed (a directory scan and two stat calls a folder), one with a run.json rewritten, and a run's own
route (which checks that one folder, not the whole list), beside issue 26's 140 ms and the 10 ms goal.

    PYTHONPATH=. .venv/bin/python benchmarks/corpus_listing.py [--runs 2000]

The runs are copies of one small run written by tests/corpus_fixture.py (the contract's files).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from tests.corpus_fixture import random_values, sentences, write_run

REPEATS = 20
REFERENCE_MS = 140.0  # issue 26: every GET /api/corpus/runs with 2,000 runs, before
GOAL_MS = 10.0


def timed(client: TestClient, path: str) -> float:
    start = time.perf_counter()
    response = client.get(path)
    elapsed = time.perf_counter() - start
    response.raise_for_status()
    return elapsed * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="headscope-corpus-listing-") as tmp:
        root = Path(tmp) / "runs"
        template = write_run(Path(tmp) / "template", sentences(3), random_values(3, 2, 2))
        for index in range(args.runs):
            shutil.copytree(template, root / f"run-{index:05d}")
        # "testserver": the Host header of Starlette's TestClient.
        settings = Settings(
            device="cpu",
            threads=1,
            log_level="warning",
            models={},
            runs_dir=root,
            allowed_hosts=["testserver"],
        )
        with TestClient(create_app(settings)) as client:
            first = timed(client, "/api/corpus/runs")
            listed = len(client.get("/api/corpus/runs").json()["runs"])
            kept = statistics.median(timed(client, "/api/corpus/runs") for _ in range(REPEATS))
            changed = []
            for repeat in range(REPEATS):
                path = root / f"run-{repeat:05d}" / "run.json"
                meta = json.loads(path.read_text())
                path.write_text(json.dumps({**meta, "finished": f"2027-01-01T00:00:{repeat:02d}Z"}))
                stamp = path.stat().st_mtime_ns + 10**9  # a new mtime even on a coarse clock
                os.utime(path, ns=(stamp, stamp))
                changed.append(timed(client, "/api/corpus/runs"))
            one_run = statistics.median(timed(client, "/api/corpus/runs/run-00042") for _ in range(REPEATS))
    assert listed == args.runs, f"{listed} of {args.runs} runs listed"
    rows = [
        ("first listing (every folder looked at)", first, f"{REFERENCE_MS:.0f} ms every listing, before"),
        ("listing, nothing changed (median)", kept, f"goal < {GOAL_MS:.0f} ms"),
        ("listing, one run.json rewritten (median)", statistics.median(changed), f"goal < {GOAL_MS:.0f} ms"),
        ("GET /api/corpus/runs/{name} (median)", one_run, "before: the whole listing first"),
    ]
    print(f"GET /api/corpus/runs with {args.runs:,} runs ({REPEATS} repeats; TestClient, this machine)")
    print(f"{'request':<44}{'ms':>9}  reference")
    for label, ms, reference in rows:
        print(f"{label:<44}{ms:>9.2f}  {reference}")


if __name__ == "__main__":
    main()
