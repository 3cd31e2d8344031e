"""Token lines in headless Chromium: the time to draw one head against every head of its layer.

Starts the real app under uvicorn (free port, the embedded all-MiniLM-L6-v2: 12 heads a layer), runs an
input of ~n tokens with the Token lines tab open, then switches between "One head" and "All heads of
layer" and times each switch: script (the click's handler, which draws the SVG synchronously) and to the
second animation frame after it (layout and paint included). All heads draw at most LINE_BUDGET lines
(app/static/js/lines-view.js), the strongest; the table prints how many each mode drew.

    .venv/bin/python benchmarks/lines.py [--repeats 5] [--sizes 64 256 512]
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any
from urllib.parse import urlencode

from browser import text_of
from launch import app_page

SWITCH = """(mode) => {
  const t0 = performance.now();
  document.querySelector(`#lines-mode input[value=${mode}]`).click();
  const t1 = performance.now();
  return new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(() => resolve({
    script_ms: t1 - t0,
    paint_ms: performance.now() - t0,
    lines: Number(document.querySelector('#token-view').dataset.lines),
  }))));
}"""


def measure(page: Any, base: str, size: int, repeats: int) -> dict[str, list[dict[str, float]]]:
    query = urlencode({"text": text_of(size + 8 if size >= 512 else size, salt=size), "view": "tokens"})
    page.goto(f"{base}/?{query}")
    page.wait_for_function("() => ['ready', 'error'].includes(document.body.dataset.state)", timeout=120_000)
    if page.evaluate("document.body.dataset.state") != "ready":
        raise SystemExit(f"page error: {page.locator('[role=alert]').text_content()}")
    runs: dict[str, list[dict[str, float]]] = {"head": [], "layer": []}
    page.evaluate(SWITCH, "layer")  # warm the JIT
    page.evaluate(SWITCH, "head")
    for _ in range(repeats):
        for mode in ("layer", "head"):
            runs[mode].append(page.evaluate(SWITCH, mode))
    runs["n"] = [{"n": page.evaluate("document.querySelectorAll('#token-lines text.left').length")}]
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5, help="switches per size and mode (median printed)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 512], help="target token counts")
    args = parser.parse_args()

    with app_page("lines", {"width": 1440, "height": 900}) as (server, page):
        rows = [measure(page, server.base, size, args.repeats) for size in args.sizes]

    print(f"{'n':>5} {'mode':>12} {'lines':>7} {'script ms':>10} {'to paint ms':>12}")
    for runs in rows:
        for mode, name in (("head", "one head"), ("layer", "all heads")):
            med = {key: statistics.median(r[key] for r in runs[mode]) for key in ("script_ms", "paint_ms")}
            lines = int(runs[mode][0]["lines"])
            n = int(runs["n"][0]["n"])
            print(f"{n:>5} {name:>12} {lines:>7} {med['script_ms']:>10.1f} {med['paint_ms']:>12.1f}")


if __name__ == "__main__":
    main()
