"""What the Corpus view's requests cost as a run grows: the list, a run's per-head table, and one head's
per-text values (cold: read from Parquet with a filter; warm: from the LRU), at 2,000 and 20,000 texts of a
6 x 12 model (MiniLM's shape), side by side, with the answers' sizes.

    PYTHONPATH=. .venv/bin/python benchmarks/corpus_view.py [--texts 2000 20000]

The runs are written by tests/corpus_fixture.py (the contract's four files, random statistics).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
from functools import partial
from pathlib import Path

from corpus_app import get, get_ms, runs_client
from timing import timed

from tests.corpus_fixture import random_values, sentences, write_run

LAYERS, HEADS = 6, 12
REPEATS = 5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, nargs="+", default=[2000, 20000])
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="headscope-corpus-view-") as tmp:
        root = Path(tmp)
        for count in args.texts:
            write_run(
                root / f"run-{count}", sentences(count), random_values(count, LAYERS, HEADS, seed=count)
            )
        rows = []
        with runs_client(root) as client:
            for count in args.texts:
                name = f"run-{count}"
                per_text = (root / name / "per_text.parquet").stat().st_size
                listing = timed(partial(get, client, "/api/corpus/runs"), REPEATS, warm=0).median_ms
                run_cold, run_bytes = get_ms(client, f"/api/corpus/runs/{name}")
                run_warm = timed(partial(get, client, f"/api/corpus/runs/{name}"), REPEATS, warm=0).median_ms
                colds = [
                    get_ms(client, f"/api/corpus/runs/{name}/heads/{lay}/3?stat=entropy") for lay in range(5)
                ]
                head_cold = statistics.median(ms for ms, _ in colds)
                warm_head = partial(get, client, f"/api/corpus/runs/{name}/heads/0/3?stat=entropy")
                head_warm = timed(warm_head, REPEATS, warm=0).median_ms
                rows.append(
                    (
                        count,
                        per_text,
                        listing,
                        run_cold,
                        run_warm,
                        run_bytes,
                        head_cold,
                        head_warm,
                        colds[0][1],
                    )
                )
    header = (
        "texts",
        "per_text MB",
        "list ms",
        "run ms cold",
        "warm",
        "run KB",
        "head ms cold",
        "warm",
        "head KB",
    )
    print(" | ".join(f"{h:>12}" for h in header))
    for count, size, listing, rc, rw, rb, hc, hw, hb in rows:
        cells = (
            f"{count:,}",
            f"{size / 1e6:.1f}",
            f"{listing:.1f}",
            f"{rc:.1f}",
            f"{rw:.1f}",
            f"{rb / 1e3:.0f}",
            f"{hc:.1f}",
            f"{hw:.1f}",
            f"{hb / 1e3:.0f}",
        )
        print(" | ".join(f"{c:>12}" for c in cells))


if __name__ == "__main__":
    main()
