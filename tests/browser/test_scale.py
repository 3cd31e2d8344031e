"""Colour scales of the head detail; the grid's colour-by legend and selection marker. Headless Chromium.

Each scale must change the colours (the figure's z and its colour bar) and never the hover, which reads the
weight the API answers; masked cells stay gaps; hide-first-token composes with a scale; the choice lives in
the URL and survives a rerun. The grid's legend sits against the grid, and the selection marker's ink is a
colour no scale on the page uses. Expected numbers come from the API and from app/static/js/colors.js itself.
"""

from __future__ import annotations

import json
import math
import sys
import urllib.request
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

pytestmark = pytest.mark.browser

PROMPT = "The cat sat on the mat because it was tired."
LAYER, HEAD = 1, 0
EPS64 = sys.float_info.epsilon
# log10 in Chromium (V8's fdlibm port) and in Python (the C library) are each within 1 ulp of the true value,
# so they differ by at most 2 ulp of the result; |log10 w| <= 4 above the 1e-4 floor.
LOG_TOLERANCE = 2 * EPS64 * 4
# A legend "beside the grid" starts within this many px of it: the grid's own top margin (10 px) plus the
# legend's line, far below the screen-height gap of a legend in the insight panel.
ADJACENT_PX = 24
# Two colours read as different at a glance when they are a quarter of the 0..255 range apart (RGB
# distance); the nearest scale colours to black, #081d58 and #440154, are 93 and 108 away.
DISTINCT_RGB = 64

FIGURE_JS = """() => {
  const gd = document.querySelector('#head-detail');
  const heatmap = gd.data.find((t) => t.type === 'heatmap');
  return {z: heatmap.z, zmin: heatmap.zmin, zmax: heatmap.zmax, title: heatmap.colorbar.title.text,
          ticktext: heatmap.colorbar.ticktext ?? null};
}"""
TITLE_JS = """() => document.querySelector('#head-detail').data
  ?.find((t) => t.type === 'heatmap')?.colorbar.title.text"""

# Every colour of every scale the page draws with: the attention LUT (all 256 entries), the statistic
# frames and the A - B scale sampled at 1/100 steps, the mask hatch.
SCALE_COLOURS_JS = """async () => {
  const colors = await import('/static/js/colors.js');
  const hex = (h) => [1, 3, 5].map((k) => parseInt(h.slice(k, k + 2), 16));
  const rgb = (s) => s.match(/\\d+/g).slice(0, 3).map(Number);
  const out = [];
  for (let k = 0; k < 256; k++) out.push([...colors.LUT.slice(4 * k, 4 * k + 3)]);
  for (let k = 0; k <= 100; k++) out.push(rgb(colors.statColor(k / 100)));
  const stops = colors.DIVERGING.map(([t, h]) => [t, hex(h)]);
  for (let k = 0; k <= 100; k++) {
    const t = k / 100;
    const s = Math.max(1, stops.findIndex(([u]) => u >= t));
    const [t0, c0] = stops[s - 1], [t1, c1] = stops[s];
    out.push(c0.map((c, i) => c + ((t - t0) / (t1 - t0)) * (c1[i] - c)));
  }
  out.push(colors.MASK_BG, colors.MASK_FG);
  return out;
}"""


def api(base: str, path: str, **fields: Any) -> Any:
    headers = {"Content-Type": "application/json"}
    request = urllib.request.Request(base + path, json.dumps(fields).encode(), headers)
    with urllib.request.urlopen(request, timeout=60) as answer:  # noqa: S310 (local test server)
        return json.load(answer)


def masked(rows: Sequence[Sequence[float | None]]) -> list[list[float | None]]:
    """A causal head as the page draws it: cells j > i are gaps, whatever the scale."""
    return [[v if j <= i else None for j, v in enumerate(row)] for i, row in enumerate(rows)]


def per_row(rows: list[list[float | None]]) -> list[list[float | None]]:
    """Each row divided by its own max (what scale.js rowScaled does, the same float64 division)."""
    out = []
    for row in rows:
        top = max((v for v in row if v is not None), default=0.0)
        out.append([None if v is None else (v / top if top > 0 else v) for v in row])
    return out


def without_first(rows: list[list[float]]) -> list[list[float | None]]:
    """decoder.js withoutFirstToken: key 0 dropped, each row over its sum of keys 1.. (left to right)."""
    out: list[list[float | None]] = []
    for row in rows:
        rest = 0.0
        for v in row[1:]:
            rest += v
        first: list[float | None] = [None]
        out.append(first + [v / rest if rest > 0 else None for v in row[1:]])
    return out


def choose(page: Any, scale: str, expect_in_title: str) -> dict[str, Any]:
    page.select_option("#color-scale", scale)
    page.wait_for_function(f"() => ({TITLE_JS})()?.includes({json.dumps(expect_in_title)})")
    figure: dict[str, Any] = page.evaluate(FIGURE_JS)
    return figure


def test_each_scale_recolours_the_detail_but_the_hover_reads_the_true_weight(
    session: Any, causal_model: str
) -> None:
    page = session.open(f"?text={PROMPT}&model={causal_model}&layer={LAYER}&head={HEAD}")
    session.wait_ready()
    page.wait_for_selector("#head-detail[data-exact=true]")
    exact = api(session.base, "/api/attention/head", text=PROMPT, model=causal_model, layer=LAYER, head=HEAD)
    weights: list[list[float]] = exact["attention"]
    n = len(weights)
    drawn = masked(weights)
    # A cell under the diagonal whose weight is neither the row's max nor a tie at 3 decimals.
    i = n - 1
    j = sorted(range(n), key=lambda k: weights[i][k])[n // 2]
    want_hover = f": {weights[i][j]:.3f}"

    assert page.locator("#color-scale").input_value() == "unit"  # 0–1 by default
    unit = page.evaluate(FIGURE_JS)
    assert unit["z"] == drawn and (unit["zmin"], unit["zmax"]) == (0, 1)
    assert "colour:" not in unit["title"]
    assert want_hover in session.hover_text(i, j)

    head = choose(page, "head", "head's max")
    top = max(v for row in drawn for v in row if v is not None)
    assert head["z"] == drawn and (head["zmin"], head["zmax"]) == (0, top)  # same weights, zmax moves
    assert want_hover in session.hover_text(i, j)

    row = choose(page, "row", "each row")
    assert row["z"] == per_row(drawn)  # the same float64 divisions as the page: exact
    assert want_hover in session.hover_text(i, j)

    log = choose(page, "log", "floor 0.0001")
    assert (log["zmin"], log["zmax"]) == (-4, 0) and log["ticktext"][0] == "≤0.0001"
    for r, (got_row, want_row) in enumerate(zip(log["z"], drawn, strict=True)):
        for c, (got, want) in enumerate(zip(got_row, want_row, strict=True)):
            if want is None:
                assert got is None, (r, c)  # masked stays masked
            else:
                assert abs(got - math.log10(max(want, 1e-4))) <= LOG_TOLERANCE, (r, c, got, want)
    assert want_hover in session.hover_text(i, j)
    assert "Colour scale: log" in page.locator("#detail-caption").text_content()

    # In the URL, so a reload (a shared link) and a rerun keep it.
    assert parse_qs(urlparse(page.url).query)["scale"] == ["log"]
    page.reload()
    session.wait_ready()
    assert page.locator("#color-scale").input_value() == "log"
    assert "floor 0.0001" in page.evaluate(TITLE_JS)
    page.evaluate("document.body.dataset.state = 'idle'")
    page.click("#run")
    session.wait_ready()
    assert "floor 0.0001" in page.evaluate(TITLE_JS)

    # Token lines have no colour scale: the menu is disabled there, with the reason in words.
    page.click("#tab-tokens")
    assert page.locator("#color-scale").is_disabled()
    assert "no colour scale" in page.locator("#color-scale-note").text_content()
    page.click("#tab-heatmap")
    assert page.locator("#color-scale").is_enabled() and page.locator("#color-scale-note").is_hidden()


def test_log_scale_on_8_bit_values_says_where_they_stop(session: Any) -> None:
    page = session.page
    page.route("**/api/attention/head/compact", lambda route: route.abort())  # the exact head never comes
    session.open(f"?text={PROMPT}&scale=log")
    session.wait_ready()
    caption = page.locator("#detail-caption")
    assert "8-bit weights under 0.0020 read as 0" in caption.text_content()  # the transport's 1/510
    page.wait_for_function("() => document.querySelector('#detail-caption').textContent.includes('Exact')")
    page.select_option("#color-scale", "row")
    assert "read as 0" not in caption.text_content()


def test_hide_first_token_then_scale_per_row(session: Any, causal_model: str) -> None:
    page = session.open(f"?text={PROMPT}&model={causal_model}&layer={LAYER}&head=1&scale=row&nofirst=1")
    session.wait_ready()
    page.wait_for_selector("#head-detail[data-exact=true]")
    weights = api(session.base, "/api/attention/head", text=PROMPT, model=causal_model, layer=LAYER, head=1)
    figure = page.evaluate(FIGURE_JS)
    # Renormalised first, then each row over its own max: the page's float64 operations in the same order.
    assert figure["z"] == per_row(masked(without_first(weights["attention"])))
    assert "renormalised" in figure["title"] and "each row" in figure["title"]
    # The hover reads the renormalised weight, not its share of the row's max.
    renormalised = without_first(weights["attention"])
    i = len(renormalised) - 1
    j = sorted(range(1, i + 1), key=lambda k: renormalised[i][k] or 0.0)[(i - 1) // 2]
    text = session.hover_text(i, j)
    assert f": {renormalised[i][j]:.3f}" in text and "renormalised" in text


def test_rollout_follows_the_colour_scale(session: Any) -> None:
    page = session.open(f"?text={PROMPT}")
    session.wait_ready()
    page.locator("#rollout-panel").scroll_into_view_if_needed()
    page.wait_for_selector("#rollout[data-state=ready]")
    rollout_js = "() => document.querySelector('#rollout').data.find((t) => t.type === 'heatmap')"
    unit = page.evaluate(f"() => ({rollout_js})().z")
    page.select_option("#color-scale", "row")
    page.wait_for_function(f"() => ({rollout_js})().colorbar.title.text.includes('each row')")
    heatmap = page.evaluate(f"() => {{ const h = ({rollout_js})(); return [h.z, h.colorbar.title.text]; }}")
    assert heatmap[0] == per_row(unit)  # the same float64 divisions of the same 8-bit values: exact
    assert heatmap[1].startswith("rollout (8-bit)")


def test_grid_legend_sits_against_the_grid_and_the_marker_is_no_scale_colour(session: Any) -> None:
    page = session.open(f"?text={PROMPT}&layer=2&head=3")
    session.wait_ready()
    page.wait_for_function("() => ['ready', 'error'].includes(document.body.dataset.insight)")
    stat = page.locator("#color-by option").nth(1).get_attribute("value")
    page.select_option("#color-by", stat)
    legend = page.locator("#color-legend")
    legend.wait_for()
    assert stat in legend.text_content()
    box = legend.bounding_box()
    grid = page.locator("#grid").bounding_box()
    gap = grid["y"] - (box["y"] + box["height"])
    assert 0 <= gap <= ADJACENT_PX, (box, grid)  # right above the grid...
    assert box["x"] < grid["x"] + grid["width"] and grid["x"] < box["x"] + box["width"]  # ...and over it

    # The selected thumbnail: a ring and a corner notch in its own ink, and its labels in bold.
    thumb = page.locator('#grid .thumb.selected[data-layer="2"][data-head="3"]')
    assert thumb.count() == 1
    style = thumb.evaluate(
        """(t) => {
          const s = getComputedStyle(t), notch = getComputedStyle(t, '::after');
          const rgbs = (v) => (v.match(/rgba?\\([^)]*\\)/g) ?? [])
            .map((c) => c.match(/[\\d.]+/g).map(Number));
          const panel = getComputedStyle(document.documentElement).getPropertyValue('--panel').trim();
          return {rings: rgbs(s.boxShadow), notch: rgbs(notch.borderTopColor), panel,
                  labels: [...document.querySelectorAll('#grid .current')].map((e) => e.textContent)};
        }"""
    )
    assert len(style["rings"]) == 2, style  # a gap in the panel's colour, then the marker's ring
    ink = [style["rings"][1][:3], style["notch"][0][:3]]
    assert ink[0] == ink[1]
    # The inner ring is a gap in the panel's own colour, not ink.
    assert style["rings"][0][:3] == [255, 255, 255] and style["panel"] == "#ffffff"
    scale_colours = page.evaluate(SCALE_COLOURS_JS)
    assert len(scale_colours) == 256 + 101 + 101 + 2
    nearest = min(math.dist(ink[0], c) for c in scale_colours)
    assert nearest >= DISTINCT_RGB, nearest
    # A coloured thumbnail keeps its frame colour inside the ring.
    frame = thumb.evaluate("(t) => [getComputedStyle(t).borderTopColor, t.style.getPropertyValue('--frame')]")
    assert frame[0] == frame[1], frame
    assert sorted(style["labels"]) == ["H3", "L2"]
