"""The page's long-input mode in headless Chromium: from the trace's result to the overview grid drawn,
bytes on the wire of each answer, and the text view's costs, at n = 2048 and 8192 tokens.

The model is random, with SmolLM2-135M's layers and heads (30 layers, 9 query heads over 3 KV heads) and a
tiny width (hidden 72): what the page fetches and draws depends on L·H·s² (the overview, s = 128) and on n
(the text view), not on the width, and so the trace takes seconds on a CPU. The trace's own time and memory
at the real width are benchmarks/long.py's.

  traced -> grid: /api/trace's done line read -> the overview fetched, decoded and every thumbnail drawn
  overview: the /api/trace/overview fetch alone (gzipped HSA1 of [30, 9, 128, 128])
  text build: the text view's spans, built once per trace
  row: a chosen token's /api/trace/row restyling every span (median of --rows; the fetch not included)

    .venv/bin/python benchmarks/long_page.py [--sizes 2048 8192] [--rows 9]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from launch import REPO, launch_chromium, serve

sys.path.insert(0, str(REPO / "tests"))
from checkpoints import build_long_llama  # noqa: E402 (the tests' offline checkpoint builder)

MODEL = "smollm2-shaped"
SHAPE = {"num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 72, "intermediate_size": 96}
LAYERS = 30
SENTENCE = "The committee said on Tuesday that the new bridge across the river would open next spring. "
READ = """() => {
  const mark = (name) => performance.getEntriesByName(name).at(-1)?.startTime ?? null;
  const api = performance.getEntriesByType('resource')
    .filter((e) => new URL(e.name).pathname.startsWith('/api/'))
    .map((e) => ({path: new URL(e.name).pathname, transfer: e.transferSize}));
  return {traced: mark('headscope-traced'), overview: mark('headscope-overview'),
    ready: mark('headscope-ready'),
    text: performance.getEntriesByName('headscope-long-text').at(-1)?.duration ?? null,
    rows: performance.getEntriesByName('headscope-long-row').map((e) => e.duration), api};
}"""


def count(base: str, text: str) -> int:
    body = json.dumps({"text": text, "model": MODEL}).encode()
    request = urllib.request.Request(
        f"{base}/api/trace/tokens", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 (local server)
        return int(json.load(response)["n"])


def text_of(base: str, tokens: int, salt: int) -> tuple[str, int]:
    """About `tokens` tokens (counted by the server), starting with a fresh word: a text not traced yet."""
    per = count(base, SENTENCE * 10) / 10
    text = f"Run {salt}. " + SENTENCE * max(1, round(tokens / per) - 1)
    return text, count(base, text)


def measure(page: Any, base: str, text: str, rows: int) -> dict[str, Any]:
    page.fill("#text", text)
    page.evaluate("() => { document.body.dataset.state = 'idle'; performance.clearResourceTimings(); }")
    page.click("#run")
    page.wait_for_function("() => ['ready', 'error'].includes(document.body.dataset.state)", timeout=600_000)
    if page.evaluate("document.body.dataset.state") != "ready":
        raise SystemExit(f"page error: {page.locator('[role=alert]').text_content()}")
    n = page.locator("#long-text-tokens .lt-token").count()
    for k in range(rows):
        q = (k + 1) * n // (rows + 1)
        page.locator(f"#lt-{q}").scroll_into_view_if_needed()
        page.click(f"#lt-{q}")
        page.wait_for_selector(f'#long-text[data-q="{q}"][data-state=ready]')
    t = page.evaluate(READ)
    answers: dict[str, int] = {}
    for entry in t["api"]:
        answers[entry["path"]] = answers.get(entry["path"], 0) + entry["transfer"]
    return {
        "n": n,
        "grid_ms": t["ready"] - t["traced"],
        "overview_ms": t["overview"] - t["traced"],
        "text_ms": t["text"],
        "row_ms": statistics.median(t["rows"][-rows:]),
        "answers": answers,
        "rows": rows + 1,  # the last token's row comes with the first view
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[2048, 8192], help="target token counts")
    parser.add_argument("--rows", type=int, default=9, help="tokens chosen in the text view per size")
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright

    checkpoint = build_long_llama(Path(tempfile.mkdtemp()) / MODEL, layers=LAYERS, **SHAPE)
    log = Path(tempfile.gettempdir()) / "headscope-bench-long-page.log"
    env = {"HEADSCOPE_MODELS": json.dumps({MODEL: str(checkpoint)}), "HEADSCOPE_DEVICE": "cpu"}
    env["HEADSCOPE_LOG_LEVEL"] = "warning"
    results = []
    with serve(env, log=log) as server, sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        page.goto(f"{server.base}/?text=")
        page.select_option("#model", MODEL)
        for salt, size in enumerate(args.sizes):
            text, _ = text_of(server.base, size, salt)
            results.append(measure(page, server.base, text, args.rows))
        browser.close()

    load = os.getloadavg()[0]
    shape = f"{LAYERS} layers x 9 heads (SmolLM2-135M's)"
    print(f"\nheadscope long-input page, headless Chromium, {shape}, load average {load:.1f}")
    header = f"{'n':>6} {'traced->grid ms':>16} {'overview ms':>12} {'text build ms':>14} {'row ms':>8}"
    print(header)
    print("-" * len(header))
    for r in results:
        times = f"{r['grid_ms']:>16.0f} {r['overview_ms']:>12.0f} {r['text_ms']:>14.0f} {r['row_ms']:>8.1f}"
        print(f"{r['n']:>6,} {times}")
    print("\nbytes on the wire (transferSize: gzip and headers included), per answer")
    header = f"{'n':>6} {'route':>22} {'bytes':>12} {'per value':>10}"
    print(header)
    print("-" * len(header))
    for r in results:
        values = LAYERS * 9 * r["n"] ** 2  # every head's n x n weights: what the first view stands for
        for path, size in sorted(r["answers"].items()):
            note = f" ({r['rows']} rows)" if path.endswith("/row") else ""
            print(f"{r['n']:>6,} {path:>22} {size:>12,} {size / values:>10.2e}{note}")


if __name__ == "__main__":
    main()
