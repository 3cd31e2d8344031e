"""The "Weights | Weight × value norm" switch in headless Chromium against the real app.

One page session on the default MiniLM: the switch, flipped by keyboard, reruns the input with
`"weighting": "norm"` in every request, lives in the URL, and every view says which map it shows (colour
bar, caption, grid badge, statistics, rollout, token lines); the detail's exact head is the API's norm head,
its hover gives share and size (the share alone before the exact head); flipping back restores the weights;
an encoder-decoder's cross-attention takes it too. Every expected number comes from the API itself.
Fixtures are in conftest.py.
"""

from __future__ import annotations

import json
import math
import re
import urllib.request
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

pytestmark = pytest.mark.browser

SENTENCE = "The cat sat on the mat because the cat was tired."
SOURCE = "The house is wonderful."  # the encoder-decoder's input, forced through TARGET
TARGET = "Das Haus ist wunderbar."
SWITCH = "#weighting-switch"

# The statistics table prints 3 decimals: half a unit in the last place, plus float64's own rounding.
TABLE_ROUND = 5e-4 + 1e-15
# The hover prints a share with 3 decimals (as above) and a size with 3 significant digits (size_round).
SHARE_ROUND = 5e-4 + 1e-15

DETAIL_JS = """() => {
  const gd = document.querySelector('#head-detail');
  const heatmap = gd.data.find((t) => t.type === 'heatmap');
  return {z: heatmap.z, bar: heatmap.colorbar.title.text, exact: gd.dataset.exact};
}"""

TABLE_JS = """() => {
  const keys = [...document.querySelectorAll('#stats-table th')].map((th) => th.dataset.key);
  return [...document.querySelectorAll('#stats-table tbody tr')].map((row) => [
    Number(row.dataset.layer), Number(row.dataset.head),
    Object.fromEntries([...row.cells].map((cell, i) => [keys[i], cell.textContent])),
  ]);
}"""


def api(base: str, path: str, payload: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        f"{base}{path}", data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 (local test server)
        return json.load(response)


def settle(session: Any) -> None:
    """Wait for the run the switch started: the grid and detail, then the statistics."""
    session.wait_ready()
    page = session.page
    page.wait_for_function("() => ['ready', 'error'].includes(document.body.dataset.insight)")
    state = page.evaluate("document.body.dataset.insight")
    assert state == "ready", page.locator("#insight-status").text_content()


def flip(session: Any, key: str) -> None:
    """Move the switch with the keyboard, as a radio group moves (the run it starts is awaited)."""
    page = session.page
    page.evaluate("document.body.dataset.state = 'idle'; document.body.dataset.insight = 'idle'")
    page.focus(f"{SWITCH} input:checked")
    page.keyboard.press(key)
    settle(session)


def table(page: Any) -> dict[tuple[int, int], dict[str, str]]:
    return {(layer, head): cells for layer, head, cells in page.evaluate(TABLE_JS)}


def check_table(shown: dict[tuple[int, int], dict[str, str]], analysis: dict[str, Any]) -> None:
    """Every statistic of every head as the API computed it, to the table's 3 decimals."""
    for (layer, head), cells in shown.items():
        for key, values in analysis["stats"].items():
            if key == "distance":  # 2 decimals: checked by test_insight; the shares' columns suffice here
                continue
            assert abs(float(cells[key]) - values[layer][head]) <= TABLE_ROUND, (layer, head, key)


def check_hover(session: Any, head: dict[str, Any], i: int, j: int) -> None:
    """The detail's hover over (i, j) gives the API head's share and its size, share × its row's total."""
    hover = session.hover_text(i, j)
    found = re.search(r": share (\d\.\d{3}) · ‖α f‖ (\S+)$", hover)
    assert found, hover
    share = head["attention"][i][j]
    size = share * head["row_norms"][i]
    assert abs(float(found[1]) - share) <= SHARE_ROUND, (found[1], share)
    assert abs(float(found[2]) - size) <= size_round(size), (found[2], size)


def size_round(size: float) -> float:
    """A size printed to 3 significant digits: half a unit in the third, 0.5·10^(e-2) at exponent e."""
    return 0.5 * 10 ** (math.floor(math.log10(size)) - 2) + 1e-12


def test_weight_norm_switch_reruns_every_view_and_flips_back(session: Any, seq2seq_model: str) -> None:
    page = session.open()
    posts: list[tuple[str, dict[str, Any]]] = []

    def sent(request: Any) -> None:
        if request.method == "POST":
            posts.append((urlparse(request.url).path, json.loads(request.post_data or "{}")))

    page.on("request", sent)
    session.run(SENTENCE)
    settle(session)
    switch = page.locator(SWITCH)
    # Playwright's enabled is a control's: the radios, which the fieldset's disabled reaches.
    assert page.locator("#weighting-norm").is_enabled() and page.is_checked("#weighting-weight")
    assert "Kobayashi et al. 2020" in (switch.get_attribute("title") or "")
    assert page.locator("#grid-weighting").is_hidden()
    weights_table = table(page)
    page.wait_for_selector("#head-detail[data-exact=true]")

    # Flip by keyboard: the same input again, weighted by norm, in every request of the run.
    posts.clear()
    flip(session, "ArrowRight")
    assert page.is_checked("#weighting-norm")
    assert parse_qs(urlparse(page.url).query)["weighting"] == ["norm"]
    page.wait_for_selector("#head-detail[data-exact=true]")
    page.locator("#rollout-panel").scroll_into_view_if_needed()  # the rollout loads once on screen
    page.wait_for_function("() => document.querySelector('#rollout').dataset.state === 'ready'")
    asked = {path for path, _ in posts}
    routes = ("attention/compact", "attention/head/compact", "analysis", "rollout/compact")
    assert {f"/api/{route}" for route in routes} <= asked, asked
    assert all(payload.get("weighting") == "norm" for _, payload in posts), posts
    assert "norm shares" in (page.locator("#rollout-caption").text_content() or "")

    # The detail is the API's norm head, exactly (the same float32s), and every label says what it is.
    head = {"text": SENTENCE, "layer": 0, "head": 0}
    norm_head = api(session.base, "/api/attention/head", {**head, "weighting": "norm"})
    weight_head = api(session.base, "/api/attention/head", head)
    assert norm_head["weighting"] == "norm" and norm_head["attention"] != weight_head["attention"]
    detail = page.evaluate(DETAIL_JS)
    assert detail["z"] == norm_head["attention"]
    assert detail["bar"].startswith("weight × norm (share)"), detail["bar"]
    assert "weight × norm" in (page.locator("#detail-title").text_content() or "")
    caption = page.locator("#detail-caption").text_content() or ""
    assert "Weight × value norm" in caption and "Kobayashi" in caption, caption
    assert page.locator("#grid-weighting").is_visible()
    assert page.locator("#stats-weighting").is_visible()

    # The statistics are the API's of the norm shares, and not those of the weights.
    norm_table = table(page)
    check_table(norm_table, api(session.base, "/api/analysis", {"text": SENTENCE, "weighting": "norm"}))
    changed = [key for key in norm_table if norm_table[key]["first"] != weights_table[key]["first"]]
    assert len(changed) > len(norm_table) // 2, changed
    # The glossary says which map the statistics read and what a sink head looks like by norm, first.
    glossary = page.locator("#glossary-body")
    assert "read weight × value norm shares" in (glossary.text_content() or "")
    assert glossary.locator(".sink-by").evaluate_all("ps => ps.map(p => p.dataset.weighting)") == [
        "norm",
        "weight",
    ]
    assert "quiet" in (glossary.locator(".sink-by").first.text_content() or "")

    # The hover: the share and, from the exact head's row totals, the size ‖α f‖ = share × the row's total.
    i, j = 3, 1
    check_hover(session, norm_head, i, j)
    # Token lines say it too.
    page.click("#tab-tokens")
    assert "weight × value norm" in (page.locator("#lines-note").text_content() or "")
    assert "share ≥" in (page.locator("#lines-note").text_content() or "")
    page.click("#tab-heatmap")

    # Before a head's exact values come, the hover gives the share alone (here they never come).
    page.route("**/api/attention/head/compact", lambda route: route.abort())
    page.click('#grid .thumb[data-layer="1"][data-head="2"]')
    caption_js = "() => document.querySelector('#detail-caption').textContent.includes('unavailable')"
    page.wait_for_function(caption_js)
    hover = session.hover_text(i, j)
    assert re.search(r": share \d\.\d{3}$", hover) and "‖α f‖" not in hover, hover
    page.unroute("**/api/attention/head/compact")
    page.click('#grid .thumb[data-layer="0"][data-head="0"]')

    # A reload keeps the view: weighting=norm comes back from the URL.
    page.reload()
    settle(session)
    assert page.is_checked("#weighting-norm") and page.locator("#grid-weighting").is_visible()
    # The reloaded view's exact head has come: a request of the norm view still in flight when the posts
    # are cleared would be counted as the flip's (seen once in CI).
    page.wait_for_selector("#head-detail[data-exact=true]")

    # Back to the weights: no weighting in the requests or the URL, the API's weights drawn, the table again.
    posts.clear()
    flip(session, "ArrowLeft")
    assert "weighting" not in parse_qs(urlparse(page.url).query)
    assert posts and all("weighting" not in payload for _, payload in posts), posts
    page.wait_for_selector("#head-detail[data-exact=true]")
    detail = page.evaluate(DETAIL_JS)
    assert detail["z"] == weight_head["attention"]
    assert detail["bar"] == "attention", detail["bar"]
    assert page.locator("#grid-weighting").is_hidden() and page.locator("#stats-weighting").is_hidden()
    assert table(page) == weights_table
    assert "read the attention weights" in (page.locator("#glossary-body").text_content() or "")

    # An encoder-decoder takes it too (its encoder, decoder and cross attention are each weighted): the
    # cross-attention head drawn is the API's norm head, and its hover gives share and size.
    page.select_option("#model", seq2seq_model)
    page.wait_for_selector("#target-field", state="visible")
    page.fill("#text", SOURCE)
    page.fill("#target", TARGET)
    flip(session, "ArrowRight")  # runs the form as it stands
    assert parse_qs(urlparse(page.url).query)["weighting"] == ["norm"]
    page.wait_for_selector("#head-detail[data-exact=true]")
    body = {"text": SOURCE, "model": seq2seq_model, "target": TARGET, "kind": "cross", "layer": 0, "head": 0}
    cross = api(session.base, "/api/attention/head", {**body, "weighting": "norm"})
    detail = page.evaluate(DETAIL_JS)
    assert detail["z"] == cross["attention"]
    assert detail["bar"].startswith("weight × norm (share)"), detail["bar"]
    assert "Cross-attention" in (page.locator("#detail-title").text_content() or "")
    check_hover(session, cross, 1, 2)
