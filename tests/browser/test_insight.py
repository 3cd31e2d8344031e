"""The insight views of the page in headless Chromium against the real app.

Statistics table, grid colour-by and similar heads; the words toggle; rollout and flow; compare mode;
markup staying literal. Fixtures (server, Chromium, the no-request-leaves-the-server check) are in
conftest.py. Every expected number comes from the API itself, so the page is checked against the service.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from tolerances import ROUND6, quant8

from tests.browser.conftest import UNCOMPARED

pytestmark = pytest.mark.browser

SENTENCE = "The cat sat on the mat because the cat was tired."
OTHER = "The dog sat on the rug because the dog was hungry."
# The page's 8-bit rollout against /api/rollout's: the transport's bound (decoded in float32), plus the
# JSON's rounding to 6 decimals; both computed by one function from the same cached attention.
QUANT_ERROR = quant8() + ROUND6

# One Plotly figure's heatmap: rows x columns, tick labels, colour range.
FIGURE_JS = """(selector) => {
  const gd = document.querySelector(selector);
  const heatmap = gd.data.find((t) => t.type === 'heatmap');
  return {
    z: heatmap.z,
    tickvals: gd.layout.xaxis.tickvals,
    ticktext: gd.layout.xaxis.ticktext,
    yticktext: gd.layout.yaxis.ticktext,
    zmin: heatmap.zmin,
    zmax: heatmap.zmax,
    colorscale: heatmap.colorscale,
    title: gd.layout.title.text,
  };
}"""


def post(base: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"{base}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 (local test server)
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def api(base: str, path: str, body: dict[str, Any]) -> Any:
    status, answer = post(base, path, body)
    assert status == 200, answer
    return answer


def unescape(label: str) -> str:
    return label.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def wait_insight(page: Any) -> None:
    page.wait_for_function("() => ['ready', 'error'].includes(document.body.dataset.insight)")
    state = page.evaluate("document.body.dataset.insight")
    assert state == "ready", page.locator("#insight-status").text_content()


ROLLOUT_SETTLED = "() => ['ready', 'error'].includes(document.querySelector('#rollout').dataset.state)"


def show_rollout(page: Any) -> None:
    """Scroll to the rollout (it loads once on screen) and wait until it is drawn."""
    page.locator("#rollout-panel").scroll_into_view_if_needed()
    page.wait_for_function(ROLLOUT_SETTLED)
    caption = page.locator("#rollout-caption").text_content()
    assert page.get_attribute("#rollout", "data-state") == "ready", caption


def rerun_with_words(session: Any) -> None:
    """Tick #words (which re-runs the input) and wait for the new run's views."""
    session.page.evaluate("document.body.dataset.state = 'idle'; document.body.dataset.insight = 'idle'")
    session.page.check("#words")
    session.wait_ready()
    wait_insight(session.page)


def selected(page: Any) -> list[str]:
    return page.locator("#grid .thumb.selected").evaluate("t => [t.dataset.layer, t.dataset.head]")


def table_order(page: Any) -> list[tuple[int, int]]:
    rows = page.evaluate(
        "[...document.querySelectorAll('#stats-table tbody tr')]"
        ".map((r) => [r.dataset.layer, r.dataset.head])"
    )
    return [(int(layer), int(head)) for layer, head in rows]


def test_stats_table_sorts_opens_heads_colours_the_grid_and_finds_similar_heads(session: Any) -> None:
    page = session.open()
    session.run(SENTENCE)
    wait_insight(page)
    analysis = api(session.base, "/api/analysis", {"text": SENTENCE})
    L, H = analysis["layers"], analysis["heads"]

    # One row per head, every statistic of the API a column.
    assert len(table_order(page)) == L * H
    columns = page.evaluate("[...document.querySelectorAll('#stats-table th')].map((th) => th.dataset.key)")
    assert columns[:3] == ["layer", "head", "label"] and set(columns[3:]) == set(analysis["stats"])

    # Sort by "previous": high to low first, then reversed; the order is the API's values'.
    previous = analysis["stats"]["previous"]
    page.click("#stats-table th button[data-key=previous]")
    values = [previous[layer][head] for layer, head in table_order(page)]
    assert values == sorted(values, reverse=True) and values[0] > values[-1]
    assert page.get_attribute("#stats-table th[data-key=previous]", "aria-sort") == "descending"
    page.click("#stats-table th button[data-key=previous]")
    values = [previous[layer][head] for layer, head in table_order(page)]
    assert values == sorted(values)
    # Labels show as text in the table and in the thumbnails' titles.
    layer, head = table_order(page)[-1]  # the most previous-token head
    label = analysis["labels"][layer][head]
    row = page.locator(f'#stats-table tbody tr[data-layer="{layer}"][data-head="{head}"]')
    assert row.locator("td").nth(2).text_content() == label
    thumb = page.locator(f'#grid .thumb[data-layer="{layer}"][data-head="{head}"]')
    assert label in (thumb.get_attribute("title") or "")

    # Clicking a row opens that head; Enter on a focused row does too.
    row.click()
    assert selected(page) == [str(layer), str(head)]
    assert f"layer {layer}, head {head}" in page.locator("#detail-title").text_content()
    assert row.get_attribute("aria-selected") == "true"
    other = page.locator('#stats-table tbody tr[data-layer="0"][data-head="1"]')
    other.focus()
    page.keyboard.press("Enter")
    assert selected(page) == ["0", "1"]

    # "Heads like this one": the API's five nearest heads, clickable.
    chips = page.locator("#similar button.chip")
    expected = [[s[0], s[1]] for s in analysis["similar"][0][1]]
    shown = chips.evaluate_all("(cs) => cs.map((c) => [Number(c.dataset.layer), Number(c.dataset.head)])")
    assert shown == expected
    assert len(expected) == 5
    chips.first.click()
    assert selected(page) == [str(v) for v in expected[0]]

    # Colour the grid by a statistic: frames take colours from the statistic, with a legend.
    frame_js = (
        "[...document.querySelectorAll('#grid .thumb:not(.thumb-agg)')]"
        ".map((t) => [t.dataset.layer, t.dataset.head, getComputedStyle(t).borderTopColor])"
    )
    before = {(int(layer), int(head)): colour for layer, head, colour in page.evaluate(frame_js)}
    page.select_option("#color-by", "previous")
    after = {(int(layer), int(head)): colour for layer, head, colour in page.evaluate(frame_js)}
    assert page.locator("#grid .thumb.colored").count() == L * H
    low = min(before, key=lambda k: previous[k[0]][k[1]])
    high = max(before, key=lambda k: previous[k[0]][k[1]])
    assert after[low] != after[high] and after[high] != before[high]
    assert len(set(after.values())) > 5
    legend = page.locator("#color-legend")
    assert legend.is_visible() and "previous" in legend.text_content()
    assert parse_qs(urlparse(page.url).query)["color"] == ["previous"]
    page.select_option("#color-by", "")
    assert page.locator("#grid .thumb.colored").count() == 0


def test_words_toggle_shows_whole_words_in_every_view(session: Any) -> None:
    page = session.open()
    text = "Headscope shows attention."
    session.run(text)
    pieces = api(session.base, "/api/attention/head", {"text": text, "layer": 0, "head": 0})["tokens"]
    assert "##cope" in pieces  # the word is split into pieces by the tokenizer
    words = api(session.base, "/api/attention/head", {"text": text, "layer": 0, "head": 0, "words": True})
    assert "Headscope" in words["tokens"]

    rerun_with_words(session)  # toggling re-runs the same input merged to words
    figure = page.evaluate(FIGURE_JS, "#head-detail")
    assert [unescape(t) for t in figure["ticktext"]] == words["tokens"]
    assert "##cope" not in figure["ticktext"]
    page.wait_for_selector("#head-detail[data-exact=true]")
    assert page.evaluate(FIGURE_JS, "#head-detail")["z"] == words["attention"]  # exact: the same float32s
    assert parse_qs(urlparse(page.url).query)["words"] == ["1"]
    # The insight views follow: rollout axes and the statistics are per word too.
    show_rollout(page)
    rollout = page.evaluate(FIGURE_JS, "#rollout")
    assert [unescape(t) for t in rollout["ticktext"]] == words["tokens"]
    page.click("#tab-tokens")
    shown = page.evaluate("[...document.querySelectorAll('#token-view text.left')].map((t) => t.textContent)")
    assert shown == words["tokens"]

    page.reload()  # words=1 in the URL comes back
    session.wait_ready()
    assert page.is_checked("#words")


def test_rollout_heatmap_and_layer_slider_match_the_api(session: Any) -> None:
    page = session.open()
    session.run(SENTENCE)
    wait_insight(page)
    show_rollout(page)
    reference = api(session.base, "/api/rollout", {"text": SENTENCE})
    n, tokens, L = reference["n"], reference["tokens"], reference["layers"]

    figure = page.evaluate(FIGURE_JS, "#rollout")
    assert len(figure["z"]) == n and all(len(row) == n for row in figure["z"])
    assert [unescape(t) for t in figure["ticktext"]] == tokens
    assert [unescape(t) for t in figure["yticktext"]] == tokens
    assert max_diff(figure["z"], reference["rollout"]) <= QUANT_ERROR
    assert page.get_attribute("#rollout", "data-layer") == str(L - 1)
    assert "final" in page.locator("#rollout-layer-value").text_content()

    # The slider shows the cumulative rollout after an earlier layer (keyboard: Home = layer 0).
    page.focus("#rollout-layer")
    page.keyboard.press("Home")
    page.wait_for_selector("#rollout[data-layer='0']")
    z0 = page.evaluate(FIGURE_JS, "#rollout")["z"]
    assert max_diff(z0, reference["per_layer"][0]) <= QUANT_ERROR
    assert max_diff(reference["per_layer"][0], reference["rollout"]) > 0.05  # a different picture


def test_flow_draws_for_short_inputs_and_explains_the_limit_for_long_ones(session: Any) -> None:
    page = session.open()
    short = "The cat sat."
    session.run(short)
    wait_insight(page)
    reference = api(session.base, "/api/flow", {"text": short})
    page.click("#flow-run")
    page.wait_for_selector("#flow-message[data-state=ready]")
    figure = page.evaluate(FIGURE_JS, "#flow")
    assert [unescape(t) for t in figure["ticktext"]] == reference["tokens"]
    # The published form first, the same JSON numbers drawn as they came; the switch shows the raw form.
    assert figure["z"] == reference["flow_normalized"]
    assert "rows normalised" in figure["title"]
    assert "sums to 1" in (page.locator("#flow-message").text_content() or "")
    page.uncheck("#flow-normalized")
    page.wait_for_selector("#flow[data-form=raw]")
    figure = page.evaluate(FIGURE_JS, "#flow")
    assert figure["z"] == reference["flow"] and "raw max-flow" in figure["title"]

    long = " ".join(["the cat sat on the mat"] * 6)
    status, refusal = post(session.base, "/api/flow", {"text": long})
    assert status == 422
    session.run(long)
    wait_insight(page)
    # Over the limit the button is off and the note says why, before anyone clicks (test_truth.py).
    assert page.locator("#flow-run").is_disabled()
    page.wait_for_selector("#flow-message[data-state=limit]")
    assert "limited to" in (page.locator("#flow-message").text_content() or "")
    assert not page.locator("#error").is_visible()  # a limit, said in words, not an error banner
    assert not page.locator("#flow").is_visible()


def test_compare_two_sentences_scores_heads_and_draws_a_b_and_diff(session: Any, tiny_gpt2_dir: Path) -> None:
    page = session.open()
    page.fill("#text", SENTENCE)
    page.check("#compare")
    page.fill("#text-b", OTHER)
    session.run(SENTENCE)
    wait_insight(page)
    body = {"a": {"text": SENTENCE}, "b": {"text": OTHER}}
    reference = api(session.base, "/api/compare", body)
    L, H = reference["layers"], reference["heads"]
    score = reference["score"]

    # Heads ranked by change, largest first, with the API's scores; the grid is coloured by change.
    ranked = page.locator("#compare-ranking button.chip").evaluate_all(
        "(cs) => cs.map((c) => [Number(c.dataset.layer), Number(c.dataset.head), Number(c.dataset.score)])"
    )
    assert len(ranked) == 10
    assert [s for _, _, s in ranked] == sorted((s for row in score for s in row), reverse=True)[:10]
    # A JS number prints and parses back exactly: equality, not closeness.
    assert all(score[layer][head] == s for layer, head, s in ranked)
    assert page.locator("#grid .thumb.colored").count() == L * H
    assert page.input_value("#color-by") == "change"
    assert page.locator("#stats-table th[data-key=change]").count() == 1
    assert page.get_attribute("#stats-table th[data-key=change]", "aria-sort") == "descending"
    assert table_order(page)[:10] == [(layer, head) for layer, head, _ in ranked]

    # The selected head's A, B and A - B on the aligned tokens; A - B centred on 0.
    page.wait_for_selector("#compare-panel[data-state=ready]")
    head = api(session.base, "/api/compare/head", {**body, "layer": 0, "head": 0})
    m = len(head["tokens"])
    figures = {name: page.evaluate(FIGURE_JS, f"#compare-{name}") for name in ("a", "b", "diff")}
    for name in ("a", "b", "diff"):
        assert len(figures[name]["z"]) == m and all(len(row) == m for row in figures[name]["z"])
        assert [unescape(t) for t in figures[name]["ticktext"]] == head["tokens"]
        assert figures[name]["z"] == head[name]  # the same answer, drawn as it came
    assert figures["diff"]["zmin"] == -figures["diff"]["zmax"] and figures["diff"]["zmax"] > 0
    assert figures["a"]["zmin"] == 0

    # Picking a head from the ranking opens it everywhere, A/B/diff included.
    top_layer, top_head, _ = ranked[0]
    page.click("#compare-ranking button.chip >> nth=0")
    page.wait_for_selector(
        f"#compare-panel[data-head='{top_head}'][data-layer='{top_layer}'][data-state=ready]"
    )
    assert selected(page) == [str(top_layer), str(top_head)]

    # The state is in the URL: reload brings compare mode back.
    params = parse_qs(urlparse(page.url).query)
    assert params["compare"] == ["1"] and params["btext"] == [OTHER]
    page.reload()
    session.wait_ready()
    wait_insight(page)
    assert page.is_checked("#compare") and page.input_value("#text-b") == OTHER
    assert page.locator("#compare-ranking button.chip").count() == 10

    # Another model of another shape, not loaded yet (UNCOMPARED: no other test runs it), cannot be
    # compared: the API's reason, in the alert.
    config = json.loads((tiny_gpt2_dir / "config.json").read_text())
    layers, heads = config["n_layer"], config["n_head"]
    assert (layers, heads) != (L, H)
    page.fill("#text-b", "")
    page.select_option("#model-b", UNCOMPARED)
    session.run(SENTENCE)
    page.wait_for_function("() => !document.querySelector('#error').hidden")
    status, refusal = post(
        session.base, "/api/compare", {"a": {"text": SENTENCE}, "b": {"text": SENTENCE, "model": UNCOMPARED}}
    )
    assert status == 422 and f"{layers} layers x {heads} heads" in refusal["detail"]
    assert page.locator("#error").text_content() == f"Could not compare A and B: {refusal['detail']}"
    assert page.locator("#compare-panel").is_hidden()
    # That comparison loaded B's model: its size is known now, so the B menu turns it off, says why, and
    # B falls back to A's model (test_truth.py has the menu from the start).
    option = f'#model-b option[value="{UNCOMPARED}"]'
    page.wait_for_function(f"() => document.querySelector('{option}').disabled")
    assert f"{layers} layers × {heads} heads" in (page.get_attribute(option, "title") or "")
    assert page.input_value("#model-b") == page.input_value("#model")
    notice = page.locator("#state-notice").text_content() or ""
    assert f"B model “{UNCOMPARED}” cannot be compared" in notice


def test_markup_stays_literal_in_every_insight_view(session: Any) -> None:
    page = session.open()
    payload = "<img src=x onerror=alert(1)> <b>bold</b>"
    page.check("#compare")  # B blank: the same input again
    session.run(payload)
    wait_insight(page)
    page.wait_for_selector("#compare-panel[data-state=ready]")
    show_rollout(page)
    tokens = api(session.base, "/api/rollout", {"text": payload})["tokens"]
    assert "<" in tokens
    shown = []
    for selector in ("#rollout", "#compare-a", "#compare-diff"):
        figure = page.evaluate(FIGURE_JS, selector)
        # Side-by-side figures thin their labels; each label drawn is its token, as text.
        drawn = page.evaluate(
            f"[...document.querySelectorAll('{selector} .xtick text')].map((t) => t.textContent)"
        )
        assert drawn == [tokens[i] for i in figure["tickvals"]]
        shown += drawn
    assert "<" in shown and ">" in shown
    if page.locator("#flow-run").is_enabled():  # off above its limit, the note already says why
        page.click("#flow-run")
    page.wait_for_selector("#flow-message:is([data-state=ready], [data-state=limit])")
    rerun_with_words(session)
    assert session.dialogs == []
    assert page.evaluate("document.querySelectorAll('main img, main b').length") == 0


def test_first_view_fetches_what_it_shows_and_the_rollout_once_on_screen(session: Any) -> None:
    page = session.open()
    page.set_viewport_size({"width": 1500, "height": 700})  # the rollout panel starts below the fold
    session.run(SENTENCE)
    wait_insight(page)
    page.wait_for_selector("#head-detail[data-exact=true]")

    def answers() -> list[str]:
        return [urlparse(url).path for url in session.requests if "/api/" in url]

    assert sorted(answers()) == ["/api/analysis", "/api/attention/compact", "/api/attention/head/compact"]
    assert page.get_attribute("#rollout", "data-state") == "idle"
    show_rollout(page)
    assert answers().count("/api/rollout/compact") == 1
    # Typing scrolls back up: the next run's rollout waits until it is shown again.
    session.run(OTHER)
    wait_insight(page)
    assert page.get_attribute("#rollout", "data-state") == "idle"
    assert answers().count("/api/rollout/compact") == 1
    show_rollout(page)
    reference = api(session.base, "/api/rollout", {"text": OTHER})
    assert max_diff(page.evaluate(FIGURE_JS, "#rollout")["z"], reference["rollout"]) <= QUANT_ERROR
    # On a screen tall enough to show it, a run loads it at once, without any scrolling.
    page.set_viewport_size({"width": 1500, "height": 2400})
    session.run(SENTENCE)
    page.wait_for_selector("#rollout[data-state=ready]")
    assert answers().count("/api/rollout/compact") == 3
