"""Byte-level tokens as people read them: "Ġcat" is shown "␣cat" and "Ċ" is "↵" in every view of the page
(axes, hover, token lines, the written panel, statistics, rollout, compare, image exports), while the API's
JSON keeps the tokenizer's own spelling."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.browser

TEXT = "The cat sat on the mat.\nIt was tired."
B_TEXT = "The dog sat on the mat.\nIt was tired."
WRITE = 3  # written tokens: the written panel shows them too
MARKS = ("Ġ", "Ċ")

# Every string a figure shows: tick labels on both axes, hover text, titles of the axes and colour bar.
FIGURE_TEXT_JS = """(selector) => {
  const gd = document.querySelector(selector);
  const out = [];
  for (const axis of ['xaxis', 'yaxis']) out.push(...(gd.layout[axis].ticktext || []));
  for (const trace of gd.data) out.push(...(trace.customdata || []).flat(), ...[].concat(trace.text || []));
  return out.map(String);
}"""

# What the page shows outside the figures: visible text, tooltips and accessible names.
PAGE_TEXT_JS = """() => [
  document.body.innerText,
  ...[...document.querySelectorAll('[title], [aria-label]')]
    .flatMap((e) => [e.getAttribute('title'), e.getAttribute('aria-label')]),
  ...[...document.querySelectorAll('svg text, svg title')].map((e) => e.textContent),
].filter(Boolean)"""


SPELL_JS = "async (ts) => { const m = await import('/static/js/decoder.js'); return ts.map(m.displayToken); }"


def api(base: str, path: str, payload: dict[str, Any]) -> Any:
    body = json.dumps(payload).encode()
    request = urllib.request.Request(f"{base}{path}", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 (local test server)
        return json.load(response)


def spelled(page: Any, tokens: list[str]) -> list[str]:
    """The page's own display function (app/static/js/decoder.js) applied to `tokens`."""
    return list(page.evaluate(SPELL_JS, tokens))


def marked(texts: list[str]) -> list[str]:
    return [text for text in texts if any(mark in text for mark in MARKS)]


def test_no_byte_level_mark_anywhere_on_the_page(session: Any, causal_model: str, tmp_path: Path) -> None:
    # A link asks for the continuation: the page offers it before the model's first run tells it is causal.
    page = session.open(f"?text=&model={causal_model}&continue={WRITE}")
    page.set_viewport_size({"width": 1500, "height": 2600})  # the rollout on screen: it loads at once
    reference = api(session.base, "/api/attention", {"text": TEXT, "model": causal_model})
    tokens = reference["tokens"]
    # The API keeps the tokenizer's spelling: the marks this test looks for are there to be turned.
    assert any(t.startswith("Ġ") for t in tokens) and any("Ċ" in t for t in tokens), tokens

    session.run(TEXT, model=causal_model)
    page.wait_for_selector("#head-detail[data-exact=true]")
    page.wait_for_function("() => ['ready', 'error'].includes(document.body.dataset.insight)")
    page.locator("#rollout-panel").scroll_into_view_if_needed()
    page.wait_for_function(
        "() => ['ready', 'error'].includes(document.querySelector('#rollout').dataset.state)"
    )

    detail = page.evaluate(FIGURE_TEXT_JS, "#head-detail")
    assert detail and marked(detail) == []
    # Every prompt token is labelled, spelled: "␣cat" for "Ġcat", "↵" for "Ċ".
    prompt = spelled(page, tokens)
    assert "␣cat" in prompt and any("↵" in t for t in prompt)
    ticks = page.evaluate("document.querySelector('#head-detail').layout.xaxis.ticktext")
    assert [t.removeprefix("✎ ") for t in ticks][: len(prompt)] == prompt
    assert marked(page.evaluate(FIGURE_TEXT_JS, "#rollout")) == []
    assert page.locator("#written").is_visible() and page.locator("#written-tokens button").count() == WRITE

    page.click("#tab-tokens")
    page.wait_for_selector("#token-view svg")
    lines = page.locator("#token-view text.left").all_text_contents()
    assert lines[: len(prompt)] == prompt
    with page.expect_download() as info:
        page.click("#export-svg")  # the token lines as an image
    assert re.search(r"-L\d+-H\d+-tokens\.svg$", info.value.suggested_filename)  # one head's lines
    path = tmp_path / "tokens.svg"
    info.value.save_as(path)
    assert "␣cat" in path.read_text() and marked([path.read_text()]) == []

    page.click("#tab-heatmap")
    with page.expect_download() as info:
        page.click("#export-svg")  # the heatmap as an image: its labels are the figure's
    info.value.save_as(path)
    assert "␣cat" in path.read_text() and marked([path.read_text()]) == []

    assert marked(page.evaluate(PAGE_TEXT_JS)) == []
    # The JSON export is the API's answer: the tokenizer's spelling, unchanged.
    with page.expect_download() as info:
        page.click("#export-json")
    info.value.save_as(path)
    assert json.loads(path.read_text())["tokens"][: len(tokens)] == tokens


def test_compare_figures_spell_tokens_too(session: Any, causal_model: str) -> None:
    page = session.open()
    page.set_viewport_size({"width": 1500, "height": 2600})
    page.select_option("#model", causal_model)
    page.check("#compare")
    page.fill("#text-b", B_TEXT)
    session.run(TEXT, model=causal_model)
    page.wait_for_selector("#compare-panel[data-state=ready]")
    for name in ("a", "b", "diff"):
        shown = page.evaluate(FIGURE_TEXT_JS, f"#compare-{name}")
        assert shown and marked(shown) == []
    assert any("␣" in t for t in page.evaluate(FIGURE_TEXT_JS, "#compare-a"))
    assert marked(page.evaluate(PAGE_TEXT_JS)) == []
