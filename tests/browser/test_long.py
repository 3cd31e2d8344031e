"""Long inputs on the page: above max_tokens (512) the page traces the input, shows each layer as it runs
with a Cancel button, draws the pooled overview in the grid, the selected head in the detail, and the
prompt as text shaded by one token's exact row (/api/trace/row)."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import mha
from tests.browser.conftest import cell_js, zoom_js
from tests.tolerances import ROUND6, regemm_weight

pytestmark = pytest.mark.browser

SENTENCE = "The cat sat on the mat. The dog sat on the log. Attention heads look at tokens; some look back. "
TRACE_S = 180_000  # ms: a 4,000-token trace on a shared, busy machine; it takes about a second alone
# Records every value the progress bar takes, from before the run: a 2-layer trace may be over in a blink.
WATCH_PROGRESS_JS = """() => {
  window.progressSeen = [];
  const bar = document.querySelector('#trace-bar');
  new MutationObserver(() => {
    if (bar.hasAttribute('aria-valuenow')) {
      const label = document.querySelector('#trace-label').textContent;
      window.progressSeen.push([bar.getAttribute('aria-valuenow'), label]);
    }
  }).observe(bar, { attributes: true });
}"""
WEIGHTS_JS = """() => [...document.querySelectorAll('#long-text-tokens .lt-token')].map(
  (s) => Number(s.dataset.weight))"""
# Every span's background against written.js's shade of its weight ÷ the row's largest: the mismatches.
SHADES_JS = """async () => {
  const { shade } = await import('/static/js/written.js');
  const spans = [...document.querySelectorAll('#long-text-tokens .lt-token')];
  const weights = spans.map((s) => Number(s.dataset.weight));
  const peak = Math.max(...weights);
  const probe = document.createElement('span');
  const bad = [];
  spans.forEach((span, j) => {
    probe.style.backgroundColor = shade(weights[j] / peak).background;
    if (probe.style.backgroundColor !== span.style.backgroundColor) bad.push(j);
  });
  return bad;
}"""
ZOOM_JS = zoom_js("#long-detail")
CELL_JS = cell_js("#long-detail")
TOP_JS = """() => [...document.querySelectorAll('#long-text-top button')].map(
  (b) => [Number(b.dataset.index), Number(b.dataset.weight)])"""


def post(base: str, path: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        f"{base}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    return urllib.request.urlopen(request, timeout=300)  # noqa: S310 (local test server)


def tokens_of(base: str, text: str, model: str) -> int:
    with post(base, "/api/trace/tokens", {"text": text, "model": model}) as response:
        return int(json.load(response)["n"])


def row(base: str, text: str, model: str, layer: int, head: int, q: int) -> list[float]:
    body = {"text": text, "model": model, "layer": layer, "head": head, "q": q}
    with post(base, "/api/trace/row", body) as response:
        return list(json.load(response)["values"])


def long_text(base: str, model: str, tokens: int) -> tuple[str, int]:
    """A text of about `tokens` tokens of `model` (counted by the server), and its exact count."""
    per = tokens_of(base, SENTENCE * 10, model) / 10
    text = SENTENCE * round(tokens / per)
    return text, tokens_of(base, text, model)


def start(session: Any, text: str, model: str) -> Any:
    page = session.open()
    page.select_option("#model", model)
    page.fill("#text", text)
    page.evaluate(WATCH_PROGRESS_JS)
    page.evaluate("document.body.dataset.state = 'idle'")
    page.click("#run")
    return page


def choose(page: Any, q: int) -> None:
    page.locator(f"#lt-{q}").scroll_into_view_if_needed()
    page.click(f"#lt-{q}")


def wait_row(page: Any, q: int, layer: int, head: int) -> None:
    page.wait_for_selector(
        f'#long-text[data-q="{q}"][data-layer="{layer}"][data-head="{head}"][data-state=ready]'
    )


def top10(values: list[float]) -> list[list[float]]:
    """The 10 largest weights, ties in token order (decoder.js topK)."""
    order = sorted(range(len(values)), key=lambda j: (-values[j], j))[:10]
    return [[j, values[j]] for j in order]


def test_a_4000_token_text_is_traced_with_progress_then_grid_detail_and_text(
    session: Any, long_model: str, long_llama_dir: Path
) -> None:
    text, n = long_text(session.base, long_model, 4000)
    assert 3800 <= n <= 4200
    page = start(session, text, long_model)
    session.wait_ready(TRACE_S)
    seen = page.evaluate("window.progressSeen")
    assert seen and all(label.startswith("Layer ") and label.endswith(" of 2") for _, label in seen), seen
    assert page.locator("#trace-progress").is_hidden()
    assert page.locator("#status").text_content() == f"{n:,} tokens, every head pooled to 128 × 128 (max)"
    # The grid: every head of the 2 x 4 overview drawn, no aggregate column (a mean of maxima says nothing).
    assert page.locator("#grid .thumb").count() == 8 and page.locator("#grid .thumb-agg").count() == 0
    assert page.locator('#grid .thumb[data-drawn="true"]').count() == 8
    # The detail: long-detail.js's figure, where the normal heatmap would be.
    page.wait_for_selector("#long-detail[data-state=ready]")
    assert page.evaluate("document.querySelector('#long-detail').data.length") >= 1
    assert page.locator("#detail-scroll").is_hidden() and page.locator("#long-view").is_visible()

    # The text view: a span a token; the last token's row first (what the next token would be chosen from).
    assert page.locator("#long-text-tokens .lt-token").count() == n
    wait_row(page, n - 1, 0, 0)
    q = 1234
    choose(page, q)
    wait_row(page, q, 0, 0)
    want = row(session.base, text, long_model, 0, 0, q)
    # Both sides are the same 6-decimal JSON numbers, parsed: equal exactly (ROUND6 is the API's rounding).
    assert page.evaluate(WEIGHTS_JS) == want
    assert page.evaluate(SHADES_JS) == []
    assert page.evaluate(TOP_JS) == top10(want)
    assert page.locator(f"#lt-{q}").get_attribute("class").split().count("query") == 1
    page.hover(f"#lt-{q - 1}")  # the title says the weight, written on hover
    assert page.get_attribute(f"#lt-{q - 1}", "title").endswith(f"(token {q - 1}): {want[q - 1]:.6f}")

    # A top-k entry scrolls its token into view and puts the cursor on it.
    far = int(max(top10(want), key=lambda entry: abs(entry[0] - q))[0])  # the entry furthest from the query
    page.click(f'#long-text-top button[data-index="{far}"]')
    box = page.locator("#long-text-tokens").bounding_box()
    token = page.locator(f"#lt-{far}").bounding_box()
    assert box["y"] <= token["y"] and token["y"] + token["height"] <= box["y"] + box["height"] + 1
    assert "cursor" in page.locator(f"#lt-{far}").get_attribute("class").split()

    # Another head: the same query token's row again, from the trace.
    page.click('#grid .thumb[data-layer="1"][data-head="2"]')
    wait_row(page, q, 1, 2)
    assert page.evaluate(WEIGHTS_JS) == row(session.base, text, long_model, 1, 2, q)
    assert "L1 H2" in page.locator("#detail-title").text_content()

    # The detail zoomed down to exact cells (a drag's relayout): hovering (q, j) reads the trace's row.
    want = row(session.base, text, long_model, 1, 2, q)
    j = max(range(q + 1), key=lambda key: want[key])  # the heaviest key: a weight worth reading
    k0 = min(max(j - 50, 0), n - 100)
    page.evaluate(ZOOM_JS, [[k0, k0 + 100], [q + 50, q - 50]])
    page.wait_for_selector(f'#long-detail[data-state=ready][data-exact=true][data-cols="{k0},{k0 + 100}"]')
    page.mouse.move(*page.evaluate(CELL_JS, [q, j]))
    hover = page.locator("#long-detail .hoverlayer .hovertext")
    hover.wait_for()
    said = hover.text_content() or ""
    match = re.fullmatch(r"query '.*' \((\d+)\) → key '.*' \((\d+)\): (\d\.\d{6})", said, re.S)
    assert match, said
    assert (int(match[1]), int(match[2])) == (q, j)
    value = match[3]
    # The same trace read two ways: a window's block of rows and one row, GEMMs of other shapes
    # (tolerances.regemm_weight), each rounded to 6 decimals.
    kept = mha.load_pretrained(long_llama_dir, device="cpu").trace(text)
    layer = kept.layers[1]
    q_norm = layer.q[2].double().norm(dim=-1).max().item()
    k_norm = layer.k[2 // (layer.q.shape[0] // layer.k.shape[0])].double().norm(dim=-1).max().item()
    bound = regemm_weight(layer.q.shape[-1], kept.scale * q_norm * k_norm) + 2 * ROUND6
    assert abs(float(value) - want[j]) <= bound, (value, want[j], bound)

    # The keyboard: the text is one tab stop; arrows move a cursor and Enter chooses.
    page.focus("#long-text-tokens")
    page.keyboard.press("End")
    page.keyboard.press("ArrowLeft")
    assert page.locator("#long-text-cursor").text_content().startswith(f"token {n - 2}: ")  # read out
    page.keyboard.press("Enter")
    wait_row(page, n - 2, 1, 2)
    assert page.evaluate(WEIGHTS_JS) == row(session.base, text, long_model, 1, 2, n - 2)

    # What needs every head's full matrix is off, with the reason on it, and never asked for.
    reason = "the full matrices: available up to 512 tokens."
    for selector in ("#compare", "#words", "#color-by", "#show-badges", "#flow-run", "#tab-tokens"):
        assert page.locator(selector).is_disabled(), selector
        assert reason in page.locator(selector).get_attribute("title"), selector
    assert (
        "Head statistics need the full matrices: available up to 512 tokens."
        in page.locator("#long-insight").text_content()
    )
    asked = {url.split("?")[0].removeprefix(session.base) for url in session.requests if "/api/" in url}
    routes = {"/api/trace/tokens", "/api/trace", "/api/trace/overview", "/api/trace/window", "/api/trace/row"}
    assert asked == routes, asked


def test_cancel_stops_the_trace_and_leaves_the_page_idle(session: Any, long_model: str) -> None:
    text, n = long_text(session.base, long_model, 8000)
    page = start(session, text, long_model)
    page.wait_for_selector("#trace-bar[aria-valuenow]", timeout=TRACE_S)  # layer 0 has started
    page.click("#trace-cancel")
    page.wait_for_function("() => document.querySelector('#status').textContent === 'Cancelled'")
    assert page.evaluate("document.body.dataset.state") == "idle"
    assert page.locator("#trace-progress").is_hidden()
    # Nothing of the cancelled run was drawn.
    assert page.locator("#grid .thumb").count() == 0 and page.locator("#long-view").is_hidden()
    assert page.locator("#error").is_hidden()
    # The server stopped the forward: asked again, the trace starts over from layer 0 (a kept trace would
    # answer with its result alone).
    with post(session.base, "/api/trace", {"text": text, "model": long_model}) as response:
        events = [json.loads(line) for line in response.read().decode().splitlines()]
    assert events[0] == {"event": "progress", "layer": 0, "layers": 2}, events[:2]
    assert events[-1]["event"] == "done" and events[-1]["n"] == n


def test_a_new_run_aborts_the_trace_in_flight(session: Any, long_model: str) -> None:
    failed: list[str] = []
    session.page.on("requestfailed", lambda request: failed.append(request.url.removeprefix(session.base)))
    # Not the cancel test's length: a kept trace streams no progress.
    text, _ = long_text(session.base, long_model, 7000)
    page = start(session, text, long_model)
    page.wait_for_selector("#trace-bar[aria-valuenow]", timeout=TRACE_S)
    session.run("The cat sat on the mat.", model=long_model)
    assert failed == ["/api/trace"]
    assert page.locator("#trace-progress").is_hidden() and page.locator("#long-view").is_hidden()
    assert " tokens · 2 layers × 4 heads" in page.locator("#status").text_content()


def test_over_the_trace_limit_says_the_limit_and_a_short_input_is_the_normal_page(
    session: Any, long_model: str
) -> None:
    text, n = long_text(session.base, long_model, 9000)
    assert n > 8192
    page = start(session, text, long_model)
    page.wait_for_function("() => document.body.dataset.state === 'error'", timeout=TRACE_S)
    alert = page.locator("#error").text_content()
    assert f"input has {n} tokens" in alert and "traces at most 8192 tokens" in alert, alert

    page.check("#words")  # asked for, and not possible for a long input: said, not silently dropped
    page.check("#weighting-norm")  # no run on screen: it waits for the next
    session.run(SENTENCE * 30, model=long_model)  # ~600 tokens: long mode
    assert page.locator("#long-view").is_visible() and page.locator("#compare").is_disabled()
    assert page.locator("#weighting-norm").is_disabled()  # the radios, through their disabled fieldset
    assert "full matrices" in (page.locator("#weighting-switch").get_attribute("title") or "")
    # The trace routes read the input alone: the words asked for never reach the detail's windows.
    page.wait_for_selector("#long-detail[data-state=ready]")
    notice = page.locator("#notice").text_content()
    need = "Words mode and weight × value norm need the full matrices: available up to 512 tokens."
    assert need in notice, notice
    assert page.locator("#grid-weighting").is_hidden()  # the overview is of the weights
    page.fill("#text", "The cat sat on the mat.")  # typing gives the form's controls back
    assert page.locator("#words").is_enabled() and page.locator("#compare").is_enabled()
    assert page.locator("#weighting-norm").is_enabled()
    page.uncheck("#words")
    page.evaluate("document.querySelector('#weighting-weight').checked = true")  # no run: the next one below
    session.run("The cat sat on the mat.", model=long_model)
    assert page.locator("#long-view").is_hidden() and page.locator("#detail-scroll").is_visible()
    assert page.evaluate("document.querySelector('#head-detail').data.length") >= 1
    assert page.locator("#grid .thumb-agg").count() == 2  # the layer means are back
    for selector in ("#compare", "#words", "#color-by", "#tab-tokens", "#export-json"):
        assert page.locator(selector).is_enabled(), selector
    assert " tokens · 2 layers × 4 heads" in page.locator("#status").text_content()
    page.wait_for_function("() => document.body.dataset.insight === 'ready'")
    assert page.locator("#long-insight").is_hidden() and page.locator("#analysis-body").is_visible()


def test_a_text_just_over_the_limit_in_bytes_but_not_in_tokens_is_the_normal_page(
    session: Any, long_model: str
) -> None:
    text = SENTENCE * 8  # ~800 bytes: counted (/api/trace/tokens), ~200 tokens: the attention route
    page = session.open()
    session.run(text, model=long_model)
    assert page.locator("#long-view").is_hidden() and page.locator("#detail-scroll").is_visible()
    asked = [url.split("?")[0].removeprefix(session.base) for url in session.requests if "/api/trace" in url]
    assert asked == ["/api/trace/tokens"]
