"""The "Find heads" panel in headless Chromium against the real app, on the default model (MiniLM, 6 x 12
heads: its default probe runs in about a second on one core).

One page session: nothing is probed until the button is pressed (from the keyboard); then the scatter
holds one point per head at the API's own scores, the chips rank the heads the probe labels, a chip opens
its head on the probe's own input (input=probe: the first sequence, the typed text kept for the way back),
the URL carries the probe (probe=heads&seed=0) and reopening it probes again by itself; the CSV
and JSON exports hold the answer; on a phone's width the panel scrolls nothing sideways. Every expected
number comes from the API itself. Fixtures are in conftest.py.
"""

from __future__ import annotations

import csv
import io
import json
import urllib.request
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

pytestmark = pytest.mark.browser

SENTENCE = "The cat sat on the mat."
KINDS = ("previous_token", "duplicate_token", "induction")

POINTS_JS = """() => document.querySelector('#probe-plot').data.flatMap((trace) =>
  trace.customdata.map(([layer, head], i) => [layer, head, trace.x[i], trace.y[i]]))"""


def probe(base: str, payload: dict[str, Any]) -> dict[str, Any]:
    """POST /api/probe, its last line (the result)."""
    request = urllib.request.Request(
        f"{base}/api/probe", data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310 (local test server)
        done = json.loads(response.read().decode().splitlines()[-1])
    assert done["event"] == "done", done
    return done  # type: ignore[no-any-return]


def ready(page: Any) -> None:
    page.wait_for_function(
        "() => ['ready', 'error'].includes(document.querySelector('#probe-panel').dataset.state)"
    )
    assert page.locator("#probe-panel").get_attribute("data-state") == "ready", page.text_content(
        "#probe-message"
    )


def test_find_heads_draws_every_head_ranks_opens_links_and_exports(
    session: Any, server: str, artifacts: Any
) -> None:
    page = session.page
    session.open()
    session.run(SENTENCE)
    page.wait_for_function("() => ['ready', 'error'].includes(document.body.dataset.insight)")
    assert page.locator("#probe-panel").get_attribute("data-state") == "idle"
    assert not [url for url in session.requests if "/api/probe" in url]  # only on request

    page.focus("#probe-run")
    page.keyboard.press("Enter")  # the keyboard's way in
    ready(page)
    answer = probe(server, {"seed": 0, "sequences": 8})
    layers, heads = answer["layers"], answer["heads"]
    points = page.evaluate(POINTS_JS)
    # Every head once, at (previous-token, induction), the default axes.
    assert sorted((p[0], p[1]) for p in points) == [(i, j) for i in range(layers) for j in range(heads)]
    for layer, head, x, y in points:
        assert (x, y) == (
            answer["scores"]["previous_token"][layer][head],
            answer["scores"]["induction"][layer][head],
        )
    query = parse_qs(urlparse(page.url).query)
    assert (query["probe"], query["seed"]) == (["heads"], ["0"])

    page.locator("#probe-panel").screenshot(path=artifacts / "probe-minilm.png")

    # The chips: only labelled heads, best first; a chip (from the keyboard) opens its head.
    chips = page.locator("#probe-top .chip")
    labelled = {
        kind: [(i, j) for i in range(layers) for j in range(heads) if kind in answer["labels"][i][j]]
        for kind in KINDS
    }
    assert chips.count() == sum(min(5, len(v)) for v in labelled.values()) > 0
    chip = chips.first
    layer, head = int(chip.get_attribute("data-layer")), int(chip.get_attribute("data-head"))
    assert (layer, head) in labelled[chip.get_attribute("data-kind")]
    chip.focus()
    # The chip opens its head on the probe's own input: the first sequence, asked by seed, not by text.
    page.evaluate("document.body.dataset.state = 'idle'")
    with page.expect_request(lambda r: "/api/attention/compact" in r.url) as asked:
        page.keyboard.press("Enter")
    assert asked.value.post_data_json == {"model": answer["model"], "probe": {"seed": 0, "length": 50}}
    session.wait_ready()
    query = parse_qs(urlparse(page.url).query)
    assert (query["layer"], query["head"], query["input"]) == ([str(layer)], [str(head)], ["probe"])
    assert query["text"] == [SENTENCE]  # the form keeps the typed text, for the way back
    assert page.input_value("#text") == SENTENCE
    notice = page.locator("#probe-input")
    assert notice.is_visible() and "seed 0" in (notice.text_content() or "")
    rows = page.evaluate("document.querySelector('#head-detail').data[0].z.length")
    assert rows == len(answer["token_ids"]) == 2 * 50 + 1  # [CLS], 50 drawn, the 50 again
    assert page.locator("#effects-run").is_disabled()  # an ablation measures a text

    # Another chip while the probe's input is on screen: its head is selected there, nothing runs again.
    asked_before = [url for url in session.requests if "/api/attention/compact" in url]
    other = chips.nth(min(1, chips.count() - 1))
    layer2, head2 = int(other.get_attribute("data-layer")), int(other.get_attribute("data-head"))
    other.click()
    page.wait_for_function(
        f"() => document.querySelector('#detail-title').textContent.endsWith('layer {layer2}, head {head2}')"
    )
    assert [url for url in session.requests if "/api/attention/compact" in url] == asked_before
    assert parse_qs(urlparse(page.url).query)["input"] == ["probe"]
    page.locator("#probe-panel").scroll_into_view_if_needed()

    # Another axis: the points move to those scores.
    page.select_option("#probe-x", "duplicate_token")
    page.wait_for_function(
        "() => document.querySelector('#probe-plot').layout.xaxis.title.text.startsWith('duplicate')"
    )
    moved = [p for p in page.evaluate(POINTS_JS)]
    assert all(x == answer["scores"]["duplicate_token"][i][j] for i, j, x, _ in moved)

    # The exports hold the answer.
    with page.expect_download() as info:
        page.click("#probe-csv")
    assert info.value.suggested_filename == "probe-all-MiniLM-L6-v2-seed0-8x50.csv"
    text = open(info.value.path(), encoding="utf-8").read()
    rows = list(csv.DictReader(io.StringIO(text.split("\n", 1)[1])))
    assert len(rows) == layers * heads
    assert float(rows[0]["induction"]) == answer["scores"]["induction"][0][0]
    with page.expect_download() as info:
        page.click("#probe-json")
    saved = json.loads(open(info.value.path(), encoding="utf-8").read())
    assert saved["scores"] == answer["scores"] and saved["labels"] == answer["labels"]

    # The link reopens the probe and its input by itself (cached answers), and on a phone nothing scrolls
    # sideways.
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(page.url)
    session.wait_ready()
    ready(page)
    assert len(page.evaluate(POINTS_JS)) == layers * heads
    assert page.locator("#probe-input").is_visible()
    assert page.evaluate("document.querySelector('#head-detail').data[0].z.length") == 2 * 50 + 1
    page.locator("#probe-panel").scroll_into_view_if_needed()
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    assert page.evaluate(
        "document.querySelector('#probe-plot').getBoundingClientRect().right <= window.innerWidth"
    )
    box = page.locator("#probe-input-back").bounding_box()
    assert box is not None and box["x"] + box["width"] <= 390

    # Back to the text: the typed sentence runs again, and the notice goes.
    page.evaluate("document.body.dataset.state = 'idle'")
    page.focus("#probe-input-back")
    page.keyboard.press("Enter")
    session.wait_ready()
    assert page.locator("#probe-input").is_hidden()
    assert "input" not in parse_qs(urlparse(page.url).query)
    tokens = page.evaluate("document.querySelector('#head-detail').data[0].z.length")
    assert tokens < 2 * 50 + 1 and page.locator("#effects-run").is_enabled()
    assert not session.errors, session.errors
