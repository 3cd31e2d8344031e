"""What GET /api/corpus/runs costs with many runs in HEADSCOPE_RUNS_DIR, beside issue 26's 140 ms and the
10 ms goal: the first listing (every folder looked at), a listing with nothing changed (a directory scan
and two stat calls a folder), one with a run.json rewritten, and a run's own route (which checks that one
folder, not the whole list). Then, without HTTP, the listing as c2cf0a0 did it on every request (each
folder and its four files resolved, each run.json read) against the kept one, on this machine: the 140 ms
was another machine's, and a system call costs several times more on a loaded shared one, so the last
line scales the kept listing by the two.

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
from functools import partial
from pathlib import Path

from corpus_app import get, get_ms, runs_client
from timing import timed

from app.service.corpus_listing import FILES, RunListing, inside
from tests.corpus_fixture import random_values, sentences, write_run

REPEATS = 20
REFERENCE_MS = 140.0  # issue 26: every GET /api/corpus/runs with 2,000 runs, before
GOAL_MS = 10.0


def listing_before(root: Path) -> bytes:
    """c2cf0a0's CorpusRuns._runs and _listing: on every request each folder and its four files resolved,
    each run.json stat'ed and read (its 64-entry LRU holds none of 2,000), the list encoded."""
    resolved = root.resolve(strict=True)
    runs = []
    for folder in sorted(resolved.iterdir()):
        if not folder.is_dir() or not inside(folder, resolved):
            continue
        if not all(inside(folder / name, resolved) for name in FILES):
            continue
        path = folder / "run.json"
        os.stat(path)
        meta = json.loads(path.read_text("utf-8"))
        if meta.get("complete") is True:
            model, settings = meta["model"], meta["settings"]
            runs.append(
                {
                    "name": folder.name,
                    **{key: model[key] for key in ("name", "layers", "heads")},
                    **{key: meta.get(key) for key in ("kind", "counts", "finished", "stats")},
                    "words": settings.get("words") is True,
                    "served": False,
                }
            )
    return json.dumps({"runs": runs}, separators=(",", ":")).encode()


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
        with runs_client(root) as client:
            first = get_ms(client, "/api/corpus/runs")[0]
            listed = len(client.get("/api/corpus/runs").json()["runs"])
            kept = timed(partial(get, client, "/api/corpus/runs"), REPEATS, warm=0).median_ms
            changed = []
            for repeat in range(REPEATS):
                path = root / f"run-{repeat:05d}" / "run.json"
                meta = json.loads(path.read_text())
                path.write_text(json.dumps({**meta, "finished": f"2027-01-01T00:00:{repeat:02d}Z"}))
                stamp = path.stat().st_mtime_ns + 10**9  # a new mtime even on a coarse clock
                os.utime(path, ns=(stamp, stamp))
                changed.append(get_ms(client, "/api/corpus/runs")[0])
            one_run = timed(partial(get, client, "/api/corpus/runs/run-00042"), REPEATS, warm=0).median_ms
        # The service code alone, before and now, one after the other on this machine.
        before = timed(lambda: listing_before(root), 5, warm=0).median_ms
        listing = RunListing(root)
        now = timed(lambda: listing.body(set()), REPEATS).median_ms  # its first call fills what it keeps
    assert listed == args.runs, f"{listed} of {args.runs} runs listed"
    rows = [
        ("GET, first listing (every folder looked at)", first, ""),
        ("GET, nothing changed (median)", kept, f"goal < {GOAL_MS:.0f} ms"),
        ("GET, one run.json rewritten (median)", statistics.median(changed), f"goal < {GOAL_MS:.0f} ms"),
        ("GET /api/corpus/runs/{name} (median)", one_run, "before: the whole listing first"),
        ("no HTTP: c2cf0a0's listing (median of 5)", before, f"issue 26: {REFERENCE_MS:.0f} ms"),
        ("no HTTP: kept listing, nothing changed (median)", now, ""),
    ]
    print(f"{args.runs:,} runs in HEADSCOPE_RUNS_DIR ({REPEATS} repeats; TestClient; this machine)")
    print(f"{'':<48}{'ms':>9}  reference")
    for label, ms, reference in rows:
        print(f"{label:<48}{ms:>9.2f}  {reference}")
    scaled = REFERENCE_MS * now / before
    print(
        f"kept listing on the machine of the {REFERENCE_MS:.0f} ms: {scaled:.1f} ms ({REFERENCE_MS:.0f} x "
        f"{now:.2f} / {before:.1f}; {before / now:.0f}x faster); goal < {GOAL_MS:.0f} ms"
    )


if __name__ == "__main__":
    main()
