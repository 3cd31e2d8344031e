"""The page in headless Chromium: click-to-drawn time and bytes downloaded per attention value.

Starts the real app under uvicorn (free port, the embedded all-MiniLM-L6-v2), opens the page in Debian's
Chromium and, for inputs of ~64, 113, 128, 256 and 512 tokens, measures from the click on #run (the click
event's timestamp) to document.body.dataset.state === "ready", which the page sets once EVERY thumbnail of the
grid (72 heads + 6 layer means, not only the visible ones) and the detail heatmap are drawn.

  cold: a text the server has not seen (includes the model's forward pass on this CPU)
  warm: the same text again (the server answers from its cache: network + decode + drawing only)

The insight views (statistics table, grid colours) load after "ready" and never delay it; "insight" is
click -> document.body.dataset.insight === "ready" (all of them drawn). The rollout, below them and off
screen at this size, loads when scrolled to, and above 256 tokens the exact head comes on request: each
run asks for both after the first view is counted and waits for them (printed apart), so one run's
requests never load the server during the next run's timing.

Bytes per value = bytes on the wire of EVERY API answer the click triggers (PerformanceResourceTiming
transferSize: gzip included, headers included; the compact attention, the detail's exact head, the
statistics, the rollout, ...), read once the page has settled (drawn, insight views drawn, exact head
arrived) / (L * H * n * n), beside the goal of 0.3 at every size (benchmarks/wire.py computes the
figure; its tests ask the same questions of the app without a browser). The table lists each answer's
share. The reference is bertviz's published figure for its model view.

    .venv/bin/python benchmarks/browser.py [--repeats 3] [--sizes 64 113 128 256 512]
        [--screenshot docs/screenshot.png] [--insight-screenshot docs/screenshot-insight.png]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from launch import launch_chromium, serve
from wire import GOAL_BYTES_PER_VALUE, Wire, text_of

# bertviz model_view of a 112-token input on a 6-layer x 12-head model: 40.9 MB of HTML (its own docs).
BERTVIZ_BYTES = 40.9e6
BERTVIZ_VALUES = 6 * 12 * 112 * 112
GOALS_S = {128: 1.0, 512: 3.0}
LAYERS, HEADS = 6, 12  # all-MiniLM-L6-v2, the model the page opens with
SIZES = (64, 113, 128, 256, 512)  # the bytes goal holds from 64 to 512 tokens; the time goals at 128 and 512

# Installed before the click: the click event's timestamp shares performance.now()'s time origin.
CLICK_PROBE = """() => {
  window.scrollTo(0, 0);
  window.__clickAt = null;
  document.querySelector('#run').addEventListener('click', (e) => { window.__clickAt = e.timeStamp; },
                                                  {capture: true, once: true});
  document.body.dataset.state = 'idle';
  performance.clearMarks();
  performance.clearResourceTimings();
}"""
READ_TIMINGS = """() => {
  const mark = (name) => performance.getEntriesByName(name).at(-1)?.startTime ?? null;
  // Resource timings were cleared at the click: every /api/ entry now is an answer the click triggered.
  const api = performance.getEntriesByType('resource')
    .filter((e) => new URL(e.name).pathname.startsWith('/api/'))
    .map((e) => ({path: new URL(e.name).pathname, transfer: e.transferSize, raw: e.decodedBodySize}));
  const gd = document.querySelector('#head-detail');
  return {
    click: window.__clickAt, run: mark('headscope-run'), decoded: mark('headscope-decoded'),
    grid: mark('headscope-grid'), detail: mark('headscope-detail'), ready: mark('headscope-ready'),
    insight: mark('headscope-insight'), api,
    n: Number(gd.dataset.n), thumbs: document.querySelectorAll('#grid .thumb[data-drawn=true]').length,
  };
}"""
# The detail's exact head follows the first picture after a short delay (when the page fetches it by itself);
# settled = it arrived, or the page offers it on request instead.
EXACT_SETTLED = """() => document.querySelector('#head-detail').dataset.exact === 'true'
  || !document.querySelector('#exact').hidden"""
ROLLOUT_SETTLED = "() => ['ready', 'error'].includes(document.querySelector('#rollout').dataset.state)"


def measure(page: Any, text: str) -> dict[str, Any]:
    page.fill("#text", text)
    page.evaluate(CLICK_PROBE)
    page.click("#run")
    page.wait_for_function("() => ['ready', 'error'].includes(document.body.dataset.state)", timeout=120_000)
    if page.evaluate("document.body.dataset.state") != "ready":
        raise SystemExit(f"page error: {page.locator('[role=alert]').text_content()}")
    insight = "() => ['ready', 'error'].includes(document.body.dataset.insight)"
    page.wait_for_function(insight, timeout=120_000)
    if page.evaluate("document.body.dataset.insight") != "ready":
        raise SystemExit(f"insight error: {page.locator('#insight-status').text_content()}")
    page.wait_for_function(EXACT_SETTLED, timeout=120_000)
    t = page.evaluate(READ_TIMINGS)
    answers: dict[str, int] = {}
    for entry in t["api"]:
        answers[entry["path"]] = answers.get(entry["path"], 0) + entry["transfer"]
    # Then, apart from the first view: the exact head where the page offers it on request (long inputs),
    # and what scrolling down loads (the rollout).
    if page.is_visible("#exact"):
        page.click("#exact")
        page.wait_for_selector("#head-detail[data-exact=true]", timeout=120_000)
    page.locator("#rollout-panel").scroll_into_view_if_needed()
    page.wait_for_function(ROLLOUT_SETTLED, timeout=120_000)
    later = page.evaluate(READ_TIMINGS)["api"][len(t["api"]) :]
    return {
        "total_ms": t["ready"] - t["click"],
        "fetch_ms": t["decoded"] - t["click"],
        "draw_ms": t["ready"] - t["decoded"],
        "grid_ms": t["grid"] - t["decoded"],
        "detail_ms": t["detail"] - t["decoded"],
        "insight_ms": t["insight"] - t["click"],
        "n": t["n"],
        "thumbs": t["thumbs"],
        "answers": answers,
        "later": {entry["path"]: entry["transfer"] for entry in later},
        "transfer": sum(answers.values()),
        "raw": sum(entry["raw"] for entry in t["api"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs per size and mode (median printed)")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="target token counts")
    parser.add_argument("--screenshot", type=Path, help="also save a screenshot of a short sentence here")
    parser.add_argument(
        "--insight-screenshot", type=Path, help="also save the insight views (compare mode) here"
    )
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright

    log = Path(tempfile.gettempdir()) / "headscope-bench-browser.log"
    env = {"HEADSCOPE_DEVICE": "cpu", "HEADSCOPE_LOG_LEVEL": "warning"}
    with serve(env, log=log) as server, sync_playwright() as playwright:
        base = server.base
        browser = launch_chromium(playwright)
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.goto(base + "/")
        rows = []
        salt = 0
        for size in args.sizes:
            measure(page, text_of(size, salt=10_000 + size))  # warm the browser's JIT and caches
            cold, warm = [], []
            for _ in range(args.repeats):
                salt += 1
                text = text_of(size + 8 if size >= 512 else size, salt)  # 512: cut to the model's max
                cold.append(measure(page, text))
                warm.append(measure(page, text))
            rows.append((size, cold, warm))
        if args.screenshot:
            save_screenshot(browser, base, args.screenshot)
        if args.insight_screenshot:
            save_insight_screenshot(browser, base, args.insight_screenshot)
        browser.close()
    report(rows)


def save_screenshot(browser: Any, base: str, path: Path) -> None:
    page = browser.new_page(viewport={"width": 1440, "height": 900}, device_scale_factor=1)
    # Layer 3, head 1 of MiniLM resolves "it" to "animal" (0.68 of its attention).
    page.goto(base + "/?text=The+animal+didn%27t+cross+the+street+because+it+was+too+tired.&layer=3&head=1")
    page.wait_for_function("() => document.body.dataset.state === 'ready'", timeout=120_000)
    page.wait_for_selector("#head-detail[data-exact=true]", timeout=30_000)
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path))
    page.close()
    print(f"screenshot: {path}")


def save_insight_screenshot(browser: Any, base: str, path: Path) -> None:
    page = browser.new_page(viewport={"width": 1440, "height": 1100}, device_scale_factor=1)
    # Compare mode: "tired" vs "wide" changes what "it" refers to; the grid is coloured by change.
    query = urlencode(
        {
            "text": "The animal didn't cross the street because it was too tired.",
            "layer": 3,
            "head": 1,
            "compare": 1,
            "btext": "The animal didn't cross the street because it was too wide.",
        }
    )
    page.goto(f"{base}/?{query}")
    page.wait_for_function("() => document.body.dataset.insight === 'ready'", timeout=120_000)
    page.wait_for_selector("#compare-panel[data-state=ready]", timeout=30_000)
    path.parent.mkdir(parents=True, exist_ok=True)
    page.locator("#analysis").scroll_into_view_if_needed()
    page.wait_for_selector("#rollout[data-state=ready]", timeout=30_000)  # it loads once on screen
    page.screenshot(path=str(path), full_page=False)
    page.close()
    print(f"screenshot: {path}")


def report(rows: list[tuple[int, list[dict[str, Any]], list[dict[str, Any]]]]) -> None:
    def med(runs: list[dict[str, Any]], key: str) -> float:
        return statistics.median(r[key] for r in runs)

    load = os.getloadavg()[0]
    print(f"\nheadscope page in headless Chromium, all-MiniLM-L6-v2 (6 x 12), load average {load:.1f}")
    print("time = click on Run -> every thumbnail (72 heads + 6 means) and the detail heatmap drawn")
    print("insight = click on Run -> statistics table and grid colours drawn (the rollout loads on scroll)\n")
    columns = [("tokens", 6), ("mode", 5), ("total", 9), ("fetch", 9)]
    columns += [("draw", 8), ("grid", 8), ("detail", 8), ("insight", 9)]
    header = " ".join(f"{name:>{width}}" for name, width in columns) + f" {'goal':>6}"
    print(header)
    print("-" * len(header))
    for size, cold, warm in rows:
        for mode, runs in (("cold", cold), ("warm", warm)):
            n = int(med(runs, "n"))
            goal = GOALS_S.get(size)
            total = med(runs, "total_ms")
            verdict = "" if goal is None else ("ok" if total / 1000 < goal else "MISS")
            parts = [f"{n:>6}", f"{mode:>5}", f"{total:>7.0f}ms"]
            parts += [f"{med(runs, key):>{w}.0f}ms" for key, w in (("fetch_ms", 7), ("draw_ms", 6))]
            parts += [f"{med(runs, key):>6.0f}ms" for key in ("grid_ms", "detail_ms")]
            parts += [f"{med(runs, 'insight_ms'):>7.0f}ms"]
            goal_text = "" if goal is None else f"<{goal:g}s"
            print(" ".join(parts), f"{goal_text:>6}", verdict)
    print("\nbytes on the wire per attention value: every API answer of the first view")
    print("(transferSize: gzip and headers included), then each answer's share")
    print(f"goal: at most {GOAL_BYTES_PER_VALUE} at every size\n")
    header = f"{'':>28} {'tokens':>6} {'values':>10} {'bytes':>12} {'bytes/value':>12} {'vs bertviz':>10}"
    print(header)
    print("-" * len(header))
    ref = BERTVIZ_BYTES / BERTVIZ_VALUES
    name = "bertviz model_view (ref.)"
    print(f"{name:>28} {112:>6} {BERTVIZ_VALUES:>10,} {BERTVIZ_BYTES:>12,.0f} {ref:>12.2f} {'1x':>10}")
    verdicts = []
    for _, cold, _ in rows:
        run = cold[-1]
        wire = Wire(layers=LAYERS, heads=HEADS, n=run["n"], answers=run["answers"])
        verdict = "ok" if wire.ok else "MISS"
        verdicts.append(f"{wire.n}: {wire.per_value:.3f} {verdict}")
        print(
            f"{f'headscope (goal <= {GOAL_BYTES_PER_VALUE})':>28} {wire.n:>6} {wire.values:>10,} "
            f"{wire.total:>12,} {wire.per_value:>12.3f} {ref / wire.per_value:>9.0f}x {verdict}"
        )
        for path, size in sorted(run["answers"].items(), key=lambda item: -item[1]):
            print(f"{path:>28} {'':>6} {'':>10} {size:>12,} {wire.share(path):>12.3f}")
        for path, size in run["later"].items():
            when = "(on scroll) " if "rollout" in path else "(on request) "
            print(f"{when + path:>28} {'':>6} {'':>10} {size:>12,} {size / wire.values:>12.3f}")
    print(f"\nfirst view, bytes per value against {GOAL_BYTES_PER_VALUE}: " + "; ".join(verdicts))
    last = rows[-1][1][-1]
    print(f"\n(the same answers uncompressed at {last['n']} tokens: {last['raw']:,} bytes)")


if __name__ == "__main__":
    main()
