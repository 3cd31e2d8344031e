"""The page in a real headless Chromium against the real app (fixtures in conftest.py)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from tolerances import ROUND6, quant8

pytestmark = pytest.mark.browser

SENTENCE = "The cat sat on the mat because the cat was tired."
# The page's 8-bit first draw against /api/attention's values: the transport's bound (decoded in float32),
# plus the JSON's rounding to 6 decimals. Both come from the same cached forward pass.
QUANT_ERROR = quant8() + ROUND6

FIGURE_JS = """() => {
  const gd = document.querySelector('#head-detail');
  const heatmap = gd.data.find((t) => t.type === 'heatmap');
  return {
    z: heatmap.z,
    customdata: heatmap.customdata,
    tickvals: gd.layout.xaxis.tickvals,
    ticktext: gd.layout.xaxis.ticktext,
    yticktext: gd.layout.yaxis.ticktext,
    shapes: gd.layout.shapes || [],
    traces: gd.data.map((t) => ({type: t.type, name: t.name, pattern: t.fillpattern || null})),
    exact: gd.dataset.exact,
  };
}"""

# The same without the n x n arrays, which take Playwright seconds to carry at 512 tokens.
SHAPE_JS = """() => {
  const gd = document.querySelector('#head-detail');
  const z = gd.data.find((t) => t.type === 'heatmap').z;
  const columns = [...new Set(z.map((row) => row.length))];
  return {rows: z.length, columns, tickvals: gd.layout.xaxis.tickvals};
}"""


def api_attention(base: str, text: str, pair: str | None = None, model: str | None = None) -> Any:
    return post(base, "/api/attention", {"text": text, "text_pair": pair, "model": model})


def api_head(base: str, text: str, layer: int, head: int) -> Any:
    """One head at full precision, as JSON: the reference for the page's binary exact head."""
    return post(base, "/api/attention/head", {"text": text, "layer": layer, "head": head})


def post(base: str, path: str, payload: dict[str, Any]) -> Any:
    body = json.dumps(payload).encode()
    request = urllib.request.Request(f"{base}{path}", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 (local test server)
        return json.load(response)


def unescape(label: str) -> str:
    return label.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def selected(page: Any) -> list[str]:
    """[layer, head] of the highlighted thumbnail."""
    return page.locator("#grid .thumb.selected").evaluate("t => [t.dataset.layer, t.dataset.head]")


def thumbnails(page: Any) -> list[tuple[int, str]]:
    return [
        (int(layer), head)
        for layer, head in page.evaluate(
            "[...document.querySelectorAll('#grid .thumb')].map((t) => [t.dataset.layer, t.dataset.head])"
        )
    ]


def test_run_draws_every_head_and_an_exact_detail_with_hover(session: Any, artifacts: Path) -> None:
    page = session.open()
    page.fill("#text", SENTENCE)
    page.press("#text", "Control+Enter")  # the keyboard shortcut runs it
    session.wait_ready()
    reference = api_attention(session.base, SENTENCE)
    L, H, n, tokens = reference["layers"], reference["heads"], reference["n"], reference["tokens"]

    # Model view: one thumbnail per layer x head, plus one mean per layer, all drawn.
    thumbs = thumbnails(page)
    assert sorted((layer, head) for layer, head in thumbs if head != "mean") == sorted(
        (layer, str(head)) for layer in range(L) for head in range(H)
    )
    assert sorted(layer for layer, head in thumbs if head == "mean") == list(range(L))
    assert page.locator("#grid .thumb[data-drawn=true]").count() == L * (H + 1)
    # A drawn canvas holds the attention pattern, not a blank square.
    distinct = page.evaluate("""() => {
      const c = document.querySelector('#grid .thumb[data-layer="0"][data-head="0"] canvas');
      const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
      const colours = new Set();
      for (let p = 0; p < d.length; p += 4) colours.add((d[p] << 16) | (d[p + 1] << 8) | d[p + 2]);
      return colours.size;
    }""")
    assert distinct > 5
    assert page.locator('#grid .thumb.selected[data-layer="0"][data-head="0"]').count() == 1

    # Head detail: n x n cells, the right tokens (the two "the" and two "cat" stay separate cells).
    figure = page.evaluate(FIGURE_JS)
    assert len(figure["z"]) == n and all(len(row) == n for row in figure["z"])
    assert figure["tickvals"] == list(range(n))
    assert [unescape(t) for t in figure["ticktext"]] == tokens
    assert [unescape(t) for t in figure["yticktext"]] == tokens
    assert tokens.count("the") >= 2 and tokens.count("cat") == 2
    # The first draw is the 8-bit transport, within its stated error of the model's values...
    expected = reference["attention"][0][0]
    assert max_diff(figure["z"], expected) <= QUANT_ERROR

    # ...then the page fetches the head at full precision (binary float32) and redraws it: the model's own
    # values, equal to the JSON head's to the last bit.
    page.wait_for_selector("#head-detail[data-exact=true]")
    figure = page.evaluate(FIGURE_JS)
    exact = api_head(session.base, SENTENCE, 0, 0)["attention"]
    assert figure["z"] == exact
    assert "Exact float32 values." in page.locator("#detail-caption").text_content()
    api = [urlparse(url).path for url in session.requests if "/api/" in url]
    assert "/api/attention/head/compact" in api and "/api/attention/head" not in api

    # Hover a cell: "query → key: value".
    i = tokens.index("cat")
    j = max(range(n), key=lambda k: expected[i][k])
    page.locator("#head-detail").scroll_into_view_if_needed()
    x, y = session.cell_center(i, j)
    page.mouse.move(x, y)
    hover = page.locator("#head-detail .hoverlayer .hovertext")
    hover.wait_for()
    assert hover.text_content() == f"{tokens[i]} → {tokens[j]}: {exact[i][j]:.3f}"

    page.screenshot(path=str(artifacts / "page.png"), full_page=True)


def test_click_arrow_keys_and_mean_head(session: Any) -> None:
    page = session.open()
    session.run(SENTENCE)
    reference = api_attention(session.base, SENTENCE)
    H = reference["heads"]

    page.click('#grid .thumb[data-layer="2"][data-head="5"]')
    assert selected(page) == ["2", "5"]
    assert "layer 2, head 5" in page.locator("#detail-title").text_content()

    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowLeft")
    page.keyboard.press("ArrowLeft")
    assert selected(page) == ["4", "4"]
    params = parse_qs(urlparse(page.url).query)
    assert (params["layer"], params["head"]) == (["4"], ["4"])

    # The mean "head" of a layer: the average of its heads' matrices.
    page.click('#grid .thumb[data-layer="1"][data-head="mean"]')
    page.wait_for_function("() => document.querySelector('#detail-title').textContent.includes('mean')")
    z = page.evaluate(FIGURE_JS)["z"]
    heads = reference["attention"][1]
    mean = [[sum(heads[h][i][j] for h in range(H)) / H for j in range(len(z))] for i in range(len(z))]
    # The mean of H decoded heads (float32 sums) against the mean of H 6-decimal values.
    assert max_diff(z, mean) <= quant8(heads=H) + ROUND6


def test_pair_shows_segment_boundary_on_both_axes(session: Any) -> None:
    page = session.open()
    first, second = "The cat sat on the mat.", "It was tired."
    session.run(first, pair=second)
    reference = api_attention(session.base, first, second)
    boundary = reference["segments"].index(1)
    assert 0 < boundary < reference["n"]
    shapes = page.evaluate(FIGURE_JS)["shapes"]
    vertical = [s for s in shapes if s["xref"] == "x" and s["x0"] == s["x1"]]
    horizontal = [s for s in shapes if s["yref"] == "y" and s["y0"] == s["y1"]]
    assert [s["x0"] for s in vertical] == [boundary - 0.5]
    assert [s["y0"] for s in horizontal] == [boundary - 0.5]
    # The boundary is drawn, not only declared.
    assert page.locator("#head-detail .shapelayer path").count() >= 2


def test_causal_model_shows_masked_upper_triangle(session: Any, causal_model: str) -> None:
    page = session.open()
    text = "The cat sat on the mat."
    session.run(text, model=causal_model)
    reference = api_attention(session.base, text, model=causal_model)
    assert reference["causal"] is True
    figure = page.evaluate(FIGURE_JS)
    n = reference["n"]
    assert n >= 3
    z = figure["z"]
    # Masked cells are null (no colour), distinct from zero attention; the rest are numbers.
    assert all(z[i][j] is None for i in range(n) for j in range(i + 1, n))
    assert all(isinstance(z[i][j], float | int) for i in range(n) for j in range(i + 1))
    masks = [t for t in figure["traces"] if t["name"] == "masked"]
    assert len(masks) == 1 and masks[0]["pattern"]["shape"] == "/"
    # The thumbnails hatch the masked corner grey too, never the scale's white for 0.
    corner = page.evaluate("""() => {
      const c = document.querySelector('#grid .thumb[data-layer="0"][data-head="0"] canvas');
      const ctx = c.getContext('2d');
      const px = (x, y) => Array.from(ctx.getImageData(x, y, 1, 1).data.slice(0, 3));
      const w = c.width;
      return {topRight: [px(w - 2, 1), px(w - 3, 1), px(w - 4, 1)], bottomLeft: px(1, c.height - 2)};
    }""")
    assert all(pixel[0] == pixel[1] == pixel[2] and pixel[0] < 245 for pixel in corner["topRight"])
    assert corner["bottomLeft"] != [236, 236, 236]


def test_markup_in_the_sentence_is_shown_literally(session: Any) -> None:
    page = session.open()
    payload = "<img src=x onerror=alert(1)> <b>bold</b>"
    session.run(payload)
    page.click("#tab-tokens")
    page.wait_for_selector("#token-view svg")
    assert session.dialogs == []
    assert page.evaluate("document.querySelectorAll('main img, main b, #head-detail b').length") == 0
    tokens = api_attention(session.base, payload)["tokens"]
    assert "<" in tokens
    shown = page.evaluate("[...document.querySelectorAll('#token-view text.left')].map((t) => t.textContent)")
    assert shown == tokens
    assert page.input_value("#text") == payload
    # Plotly labels render the same characters as text.
    page.click("#tab-heatmap")
    labels = page.evaluate(
        "[...document.querySelectorAll('#head-detail .xtick text')].map((t) => t.textContent)"
    )
    assert "<" in labels and ">" in labels


def test_blank_input_and_api_errors_show_in_the_alert(session: Any) -> None:
    page = session.open()
    page.fill("#text", "   ")
    page.click("#run")
    alert = page.locator("[role=alert]")
    assert alert.is_visible()
    assert "Type a sentence" in alert.text_content()
    assert not any("/api/attention" in url for url in session.requests)

    # An error from the API reaches the person as the API's own words.
    page.evaluate("""() => {
      const option = document.createElement('option');
      option.value = 'no-such-model';
      option.textContent = 'no-such-model';
      document.querySelector('#model').append(option);
    }""")
    page.fill("#text", "Hello there.")
    page.select_option("#model", "no-such-model")
    page.click("#run")
    page.wait_for_function("() => document.body.dataset.state === 'error'")
    assert alert.is_visible()
    assert "no-such-model" in alert.text_content()


def test_url_round_trips_the_view(session: Any) -> None:
    page = session.open()
    session.run("Dogs chase cats.", pair="Cats climb trees.")
    page.click('#grid .thumb[data-layer="3"][data-head="7"]')
    page.click("#tab-tokens")
    params = parse_qs(urlparse(page.url).query)
    assert params["text"] == ["Dogs chase cats."] and params["pair"] == ["Cats climb trees."]
    assert (params["layer"], params["head"], params["view"]) == (["3"], ["7"], ["tokens"])

    page.reload()
    session.wait_ready()  # text in the URL runs by itself
    assert page.input_value("#text") == "Dogs chase cats."
    assert page.input_value("#text-pair") == "Cats climb trees."
    assert selected(page) == ["3", "7"]
    assert page.locator("#token-view").is_visible() and not page.locator("#detail-scroll").is_visible()

    # Token view: hovering a query token isolates its own lines.
    # Exact values arrive a moment later and redraw the lines; hover after that redraw.
    page.wait_for_selector("#token-view[data-exact=true]")
    lines = int(page.locator("#token-view").get_attribute("data-lines") or 0)
    assert lines > 0
    page.hover("#token-view text.left[data-i='1']")
    visible = page.evaluate(
        "[...document.querySelectorAll('#token-view line')]"
        ".filter((l) => getComputedStyle(l).display !== 'none').map((l) => l.parentNode.dataset.i)"
    )
    assert visible and set(visible) == {"1"}


def test_exports_png_svg_and_json(session: Any, tmp_path: Path) -> None:
    page = session.open()
    session.run("Export this sentence.")
    n = api_attention(session.base, "Export this sentence.")["n"]
    saved = {}
    for button in ("png", "svg", "json"):
        with page.expect_download() as info:
            page.click(f"#export-{button}")
        path = tmp_path / info.value.suggested_filename
        info.value.save_as(path)
        saved[button] = path
    assert saved["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert saved["svg"].read_text()[:200].lstrip().startswith("<svg")
    body = json.loads(saved["json"].read_text())
    assert body["n"] == n and len(body["attention"][0][0]) == n


def test_512_tokens_fit_thin_labels_and_zoom_brings_them_back(session: Any) -> None:
    page = session.open()
    text = " ".join(["the quick brown fox jumps over the lazy dog near the river bank"] * 60)
    # The service's "random" model (4 x 8, untrained, 512 positions) keeps the forward pass cheap.
    session.run(text, model="random")
    assert page.evaluate("document.querySelector('#head-detail').dataset.n") == "512"
    assert "truncated to 512 tokens" in page.locator("#notice").text_content()
    assert page.locator("#grid .thumb[data-drawn=true]").count() == 4 * (8 + 1)
    # The detail fits its panel's width (labels and colour bar in view); the labels are thinned evenly.
    scroll = page.evaluate(
        "(() => { const s = document.querySelector('#detail-scroll');"
        " return [s.scrollWidth, s.clientWidth]; })()"
    )
    assert scroll[0] <= scroll[1]
    figure = page.evaluate(SHAPE_JS)
    assert figure["rows"] == 512 and figure["columns"] == [512] and 8 <= len(figure["tickvals"]) <= 64
    # Zoomed in on 20 tokens, every one of them is labelled again.
    page.evaluate(
        "() => Plotly.relayout(document.querySelector('#head-detail'),"
        " {'xaxis.range': [-0.5, 19.5], 'yaxis.range': [19.5, -0.5]})"
    )
    page.wait_for_function("() => document.querySelector('#head-detail').layout.xaxis.tickvals.length === 20")
    assert page.evaluate(SHAPE_JS)["tickvals"] == list(range(20))
    # Above AUTO_EXACT_MAX_N the exact head (binary float32, ~0.9 MB here) is fetched only when asked for.
    assert page.evaluate("document.querySelector('#head-detail').dataset.exact") == "false"
    page.click("#exact")
    page.wait_for_selector("#head-detail[data-exact=true]")
    assert not page.locator("#exact").is_visible()
    # The redraw with exact values kept the zoom and its labels.
    assert page.evaluate(SHAPE_JS)["tickvals"] == list(range(20))
