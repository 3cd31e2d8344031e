"""The detail heatmap's colour scales on a long input: how much of a head each one shows, and what it costs.

Starts the real app (the embedded all-MiniLM-L6-v2), opens the page in Debian's Chromium and, for an input of
~512 tokens, takes every head of the run (the page's own decoded 8-bit data, app/static/js/api.js) through
each scale of app/static/js/scale.js:

  visible: the share of a head's cells coloured past the scale's first stop (colors.js STOPS[1] = 0.05 of
           the colour range, where white turns #deebf7); median over heads. 0–1 is the reference: it is
           what "most heads look blank" measures. "8-bit" over all heads (the grid's data, which reads
           weights under its ±1/510 error as 0), "exact" over layer 2's heads in float32 (what the detail
           draws once a person loads exact values).
  build ms: buildFigure of one head (the transform, z, hover text); draw ms: renderHeatmap of it (build and
           Plotly.react) on the page's #head-detail. Medians of --repeats, after one untimed round; the
           scales take turns in each round.

    .venv/bin/python benchmarks/scale.py [--tokens 512] [--repeats 5]
"""

from __future__ import annotations

import argparse
from typing import Any

from browser import text_of
from launch import app_page

MEASURE_JS = """async ({repeats}) => {
  const api = await import('/static/js/api.js');
  const {SCALES, scaleValues} = await import('/static/js/scale.js');
  const {STOPS} = await import('/static/js/colors.js');
  const {buildFigure} = await import('/static/js/heatmap-figure.js');
  const {renderHeatmap} = await import('/static/js/heatmap.js');
  const text = document.querySelector('#text').value;
  const attention = await api.fetchCompact({text, pair: '', model: '', words: false});
  const {layers, heads, n} = attention;
  const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  const visibleAt = STOPS[1][0];
  const gd = document.querySelector('#head-detail');
  const share = (values, name) => {
    const {z, zmin, zmax} = scaleValues(values, n, name);
    let seen = 0;
    for (let k = 0; k < z.length; k++) if ((z[k] - zmin) / (zmax - zmin) >= visibleAt) seen++;
    return seen / z.length;
  };
  const exact = [];
  const query = {text, pair: '', model: '', words: false};
  for (let h = 0; h < heads; h++) exact.push((await api.fetchHead(query, 2, h)).headInto(0, 0));
  // Draws interleaved (each repeat draws every scale once), so a busy machine's drift hits all alike.
  const names = Object.keys(SCALES);
  const times = Object.fromEntries(names.map((name) => [name, []]));
  const build = Object.fromEntries(names.map((name) => [name, []]));
  const values = attention.headInto(2, 3);
  const spec = {tokens: attention.tokens, values, causal: false, boundary: -1, exact: false, keepZoom: false};
  for (let r = -1; r < repeats; r++) {
    for (const name of names) {
      let start = performance.now();
      buildFigure({...spec, title: name, colorScale: name});
      if (r >= 0) build[name].push(performance.now() - start);
      start = performance.now();
      await renderHeatmap(gd, {...spec, title: name, colorScale: name});
      if (r >= 0) times[name].push(performance.now() - start);
    }
  }
  const rows = names.map((name) => {
    const shares = [];
    for (let l = 0; l < layers; l++) {
      for (let h = 0; h < heads; h++) shares.push(share(attention.headInto(l, h), name));
    }
    const exactShare = median(exact.map((v) => share(v, name)));
    const label = SCALES[name].label;
    const drawMs = median(times[name]);
    return {label, visible: median(shares), exact: exactShare, buildMs: median(build[name]), drawMs};
  });
  return {n, heads: layers * heads, rows};
}"""


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--tokens", type=int, default=512, help="target token count (cut to the model's max)")
    parser.add_argument("--repeats", type=int, default=5, help="draws per scale (median printed)")
    args = parser.parse_args()

    with app_page("scale", {"width": 1600, "height": 1000}) as (server, page):
        page.goto(server.base + "/?text=")
        page.fill("#text", text_of(args.tokens + 8, salt=1))
        page.click("#run")
        page.wait_for_function("() => document.body.dataset.state === 'ready'", timeout=120_000)
        result: dict[str, Any] = page.evaluate(MEASURE_JS, {"repeats": args.repeats})
    print(f"{result['n']} tokens, {result['heads']} heads; visible = cells past the first colour stop")
    print(f"{'scale':<20} {'visible, 8-bit':>15} {'visible, exact':>15} {'build ms':>9} {'draw ms':>8}")
    for row in result["rows"]:
        shares = f"{row['visible']:>15.1%} {row['exact']:>15.1%}"
        print(f"{row['label']:<20} {shares} {row['buildMs']:>9.0f} {row['drawMs']:>8.0f}")


if __name__ == "__main__":
    main()
