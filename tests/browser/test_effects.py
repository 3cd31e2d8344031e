"""The "Which heads matter" panel in headless Chromium against the real app, on the tiny Llama (3 layers x 4
heads: a measurement in milliseconds).

One page session: nothing is measured until the button is clicked; then the L x H map holds the API's
effects exactly, the panel names the output they refer to (the next token and its probability), the
statistics table gains a sortable effect column, clicking a head in the map or a chip opens it, and a new
run of another input clears the panel; an encoder-decoder's panel shows the heads of the kind on screen and
follows the kind switch. Every expected number comes from the API itself. Fixtures are in conftest.py.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

pytestmark = pytest.mark.browser

SENTENCE = "The capital of France is"

MAP_JS = """() => [...document.querySelectorAll('#effects-map .effects-cell')].map((cell) => [
  Number(cell.dataset.layer), Number(cell.dataset.head), Number(cell.dataset.value),
])"""

TABLE_JS = """() => {
  const keys = [...document.querySelectorAll('#stats-table th')].map((th) => th.dataset.key);
  return {keys, rows: [...document.querySelectorAll('#stats-table tbody tr')].map((row) => [
    Number(row.dataset.layer), Number(row.dataset.head), row.cells[keys.indexOf('effect')]?.textContent,
  ])};
}"""


def effects(base: str, payload: dict[str, Any]) -> dict[str, Any]:
    """POST /api/head-effects, its last line (the result)."""
    request = urllib.request.Request(
        f"{base}/api/head-effects",
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 (local test server)
        lines = response.read().decode().splitlines()
    done = json.loads(lines[-1])
    assert done["event"] == "done", done
    return done


def spelled(token: str) -> str:
    """A byte-level token as the page shows it (app/static/js/decoder.js displayToken)."""
    for mark, sign in (("Ġ", "␣"), ("Ċ", "↵"), ("ĉ", "⇥"), ("▁", "␣")):
        token = token.replace(mark, sign)
    return token


def settle(session: Any) -> None:
    page = session.page
    page.wait_for_function("() => ['ready', 'error'].includes(document.body.dataset.insight)")
    assert page.evaluate("document.body.dataset.insight") == "ready"


def selected(page: Any) -> tuple[int, int]:
    query = parse_qs(urlparse(page.url).query)
    return int(query.get("layer", ["0"])[0]), int(query.get("head", ["0"])[0])


def test_the_panel_measures_on_request_names_its_output_sorts_and_opens_heads(
    session: Any, server: str, grouped_model: str, seq2seq_model: str
) -> None:
    page = session.page
    session.open()
    session.run(SENTENCE, model=grouped_model)
    settle(session)
    panel = page.locator("#effects-panel")
    assert panel.get_attribute("data-state") == "idle"  # not in the first view: it costs L·H/2 forwards
    assert page.locator("#effects-map").is_hidden() and page.locator("#effects-run").is_enabled()
    assert "effect" not in page.evaluate(TABLE_JS)["keys"]
    assert not [url for url in session.requests if "/api/head-effects" in url]

    page.click("#effects-run")
    page.wait_for_function("() => document.querySelector('#effects-panel').dataset.state === 'ready'")
    expected = effects(server, {"text": SENTENCE, "model": grouped_model})
    cells = page.evaluate(MAP_JS)
    assert [(layer, head) for layer, head, _ in cells] == [
        (layer, head) for layer in range(expected["layers"]) for head in range(expected["heads"])
    ]
    assert [value for _, _, value in cells] == [v for row in expected["effects"] for v in row]  # exactly
    assert page.locator("#effects-progress").is_hidden()

    # The output named: the next token after the last one, its probability.
    after = spelled(expected["tokens"][expected["positions"][-1]])
    token = spelled(expected["top_tokens"][-1])
    named = f"next token after “{after}”: “{token}” {expected['top_probs'][-1]:.2f}"
    assert named in str(page.locator("#effects-caption").text_content())
    assert page.locator("#effects-output-field").is_hidden()  # one output: the caption names it

    # The statistics table's effect column, sorted largest first by a click on its header.
    table = page.evaluate(TABLE_JS)
    assert "effect" in table["keys"]
    page.click("#stats-table th[data-key=effect] button")
    order = [(layer, head) for layer, head, _ in page.evaluate(TABLE_JS)["rows"]]
    flat = [(layer, head, v) for layer, row in enumerate(expected["effects"]) for head, v in enumerate(row)]
    assert order == [(layer, head) for layer, head, _ in sorted(flat, key=lambda c: (-c[2], c[0], c[1]))]
    assert page.get_attribute("#stats-table th[data-key=effect]", "aria-sort") == "descending"

    # Clicking a head in the map opens it: the URL's selection, the table's row, the map's cell.
    layer, head = next((layer, head) for layer, head, _ in flat if (layer, head) != selected(page))
    page.click(f"#effects-map [data-layer='{layer}'][data-head='{head}']")
    page.wait_for_function(f"() => new URL(location.href).searchParams.get('head') === '{head}'")
    assert selected(page) == (layer, head)
    row = page.locator("#stats-table tbody tr.selected")
    assert (row.get_attribute("data-layer"), row.get_attribute("data-head")) == (str(layer), str(head))
    cell = page.locator("#effects-map .effects-cell.selected")
    assert (cell.get_attribute("data-layer"), cell.get_attribute("data-head")) == (str(layer), str(head))
    # The largest effect's chip opens that head.
    top = order[0]
    page.click("#effects-ranking button >> nth=0")
    page.wait_for_function(f"() => new URL(location.href).searchParams.get('head') === '{top[1]}'")
    assert selected(page) == top

    # Another input clears the panel and its column.
    session.run(SENTENCE + " Paris", model=grouped_model)
    settle(session)
    assert panel.get_attribute("data-state") == "idle" and page.locator("#effects-map").is_hidden()
    assert "effect" not in page.evaluate(TABLE_JS)["keys"]

    # An encoder-decoder: one measurement holds its three attentions' heads; the map shows the kind on
    # screen and follows the kind switch without measuring again.
    session.run("The house is wonderful.", model=seq2seq_model)
    settle(session)
    assert panel.get_attribute("data-state") == "idle" and page.locator("#effects-run").is_enabled()
    with page.expect_request("**/api/head-effects") as asked:
        page.click("#effects-run")
    page.wait_for_function("() => document.querySelector('#effects-panel').dataset.state === 'ready'")
    expected = effects(server, json.loads(asked.value.post_data or "{}"))
    shown = page.eval_on_selector("#kind-switch input:checked", "radio => radio.value")  # cross, the default
    for kind in (shown, *sorted({"encoder", "decoder", "cross"} - {shown})):
        if kind != shown:
            page.evaluate("document.body.dataset.insight = 'idle'")
            page.check(f"#kind-switch input[value={kind}]")
            settle(session)
        table = expected["sections"][kind]["effects"]
        assert [value for _, _, value in page.evaluate(MAP_JS)] == [v for row in table for v in row], kind
        caption = str(page.locator("#effects-caption").text_content())
        assert f"Heads of the {kind}" in caption, caption
    assert len([url for url in session.requests if "/api/head-effects" in url]) == 2  # measured once each
