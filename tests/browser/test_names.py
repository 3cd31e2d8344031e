"""Names people read and status where it is seen, at the desktop size (1440 x 900).

Statistics headers in words with units, the open glossary naming every column and badge, badges only on
the heads that stand out (and a toggle), the truncation notice, words in the detail title, PNG's reason in
the token view, JSON exports named for what they hold, Copy link, and no Plotly tip over the tabs.
Fixtures (server, Chromium, the no-request-leaves-the-server check) are in conftest.py.
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.browser

SENTENCE = "When Mary met John at the station, she gave him the keys to her old car."
MODEL = "all-MiniLM-L6-v2"
DESKTOP = {"width": 1440, "height": 900}
# A head's share of weight on its role's target from which its badge shows (app/static/js/names.js).
BADGE_MIN_SHARE = 0.8
# label -> (badge, the statistic that decides it): names.js ROLES, the roles that carry a badge.
BADGED = {
    "previous-token": ("prev", "previous"),
    "next-token": ("next", "next"),
    "self": ("self", "self"),
    "special-sink": ("spec", "special"),
    "first-token-sink": ("1st", "first"),
    "punctuation": ("punc", "punctuation"),
    "local": ("local", "local"),
    "induction": ("ind", "induction"),
}


def api(base: str, path: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{base}{path}", data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 (local test server)
        return json.load(response)


def desktop(session: Any) -> Any:
    page = session.page
    page.set_viewport_size(DESKTOP)
    return page


def wait_insight(page: Any) -> None:
    page.wait_for_function("() => ['ready', 'error'].includes(document.body.dataset.insight)")
    assert page.evaluate("document.body.dataset.insight") == "ready"


def test_headers_glossary_and_badges(session: Any) -> None:
    page = desktop(session)
    session.open()
    session.run(SENTENCE)
    wait_insight(page)
    analysis = api(session.base, "/api/analysis", {"text": SENTENCE})

    headers = page.locator("#stats-table th button.sort").all_text_contents()
    keys = page.eval_on_selector_all("#stats-table th", "ths => ths.map((th) => th.dataset.key)")
    assert len(headers) == len(keys) == 3 + len(analysis["stats"])  # layer, head, role, every statistic
    for text, key in zip(headers, keys, strict=True):
        assert "_" not in text and text != key and text[0].isupper(), (key, text)
    assert "Entropy (normalised, 0–1)" in headers and "Attention to first token (share)" in headers
    # Thresholds read as sentences, never JSON.
    role_help = page.get_attribute('#stats-table th button[data-key="label"]', "title")
    assert "{" not in role_help and "more than 50% of its weight" in role_help

    glossary = page.locator("#glossary")
    assert glossary.is_visible() and glossary.get_attribute("open") is not None
    terms = page.locator("#glossary dt").all_text_contents()
    for text in headers:
        assert text in terms, text
    # The detection scores by name, each with its formula, and the induction rule as a sentence.
    assert {
        "Previous-token score (share)",
        "Duplicate-token score (share)",
        "Induction score (share)",
    } <= set(terms)
    for sentence in (
        "normalised entropy is at least 0.8",
        "Any other head is mixed",
        "A badge marks a head",
        "Formula: mean over R = {i : some j <= i has t_j-1 = t_i",
        "induction score is at least 0.5 and at least 0.3 above",
    ):
        assert sentence in glossary.text_content()

    # Badges: exactly the heads whose role's statistic reaches the stated share, fewer than half of them,
    # each one explained in the glossary.
    expected = {}
    for layer, row in enumerate(analysis["labels"]):
        for head, label in enumerate(row):
            badge, stat = BADGED.get(label, ("", ""))
            if badge and analysis["stats"][stat][layer][head] >= BADGE_MIN_SHARE:
                expected[(layer, head)] = badge
    shown = page.eval_on_selector_all(
        "#grid .thumb .badge",
        "bs => bs.map((b) => [+b.parentElement.dataset.layer, +b.parentElement.dataset.head, b.textContent])",
    )
    assert {(layer, head): text for layer, head, text in shown} == expected
    assert len(shown) < analysis["layers"] * analysis["heads"] / 2
    explained = set(page.eval_on_selector_all("#glossary [data-badge]", "bs => bs.map((b) => b.textContent)"))
    assert {badge for badge, _ in BADGED.values()} <= explained
    page.uncheck("#show-badges")
    assert page.locator("#grid .thumb .badge").count() == 0
    page.check("#show-badges")
    assert page.locator("#grid .thumb .badge").count() == len(expected)

    # The table fits its box, or a visible cue says more columns lie to the right (until scrolled there).
    box = page.evaluate(
        "(() => { const b = document.querySelector('#table-scroll');"
        " return [b.scrollWidth, b.clientWidth]; })()"
    )
    cue = page.locator("#table-scroll-cue")
    assert cue.is_visible() == (box[0] > box[1])
    if box[0] > box[1]:
        page.evaluate("document.querySelector('#table-scroll').scrollLeft = 1e6")
        cue.wait_for(state="hidden")


def test_truncation_notice_is_a_visible_status(session: Any, causal_model: str) -> None:
    page = desktop(session)
    session.open()
    session.run("a b c d e f g h " * 20, model=causal_model)  # 160 words: past the tiny GPT-2's 64 positions
    n = page.evaluate("+document.querySelector('#head-detail').dataset.n")
    notice = page.locator("#notice")
    assert notice.is_visible() and notice.get_attribute("role") == "status"
    assert f"Input truncated to {n} tokens" in notice.text_content()
    assert "truncated" not in page.locator("#detail-caption").text_content()  # said once, where it is seen
    session.run("a b c", model=causal_model)
    assert notice.is_hidden()


def test_words_title_and_png_reason(session: Any) -> None:
    page = desktop(session)
    session.open()
    session.run(SENTENCE)
    assert "words" not in page.locator("#detail-title").text_content()
    page.evaluate("document.body.dataset.state = 'idle'")
    page.check("#words")  # runs again, merged to words
    session.wait_ready()
    assert page.locator("#detail-title").text_content().endswith("· words")
    # This head's JSON in words mode: named so, holding the words' n x n.
    with page.expect_download() as info:
        page.click("#export-json-head")
    assert info.value.suggested_filename == f"headscope-{MODEL}-L0-H0-words.json"
    one = json.loads(Path(info.value.path()).read_text())
    n = page.evaluate("+document.querySelector('#head-detail').dataset.n")
    assert len(one["tokens"]) == len(one["attention"]) == n

    reason = page.locator("#export-png-reason")
    assert page.is_enabled("#export-png") and reason.is_hidden()
    page.click("#tab-tokens")
    page.wait_for_selector("#token-view svg")
    assert page.is_disabled("#export-png")
    assert page.get_attribute("#export-png", "aria-describedby") == "export-png-reason"
    assert reason.is_visible() and "SVG" in reason.text_content()
    assert page.get_attribute("#export-png", "title") == reason.text_content()
    page.click("#tab-heatmap")
    assert page.is_enabled("#export-png") and reason.is_hidden()


def test_json_exports_all_heads_and_this_head(session: Any, tmp_path: Path) -> None:
    page = desktop(session)
    session.open()
    session.run(SENTENCE)
    page.click('#grid .thumb[data-layer="2"][data-head="7"]')

    def save(button: str) -> tuple[str, Any]:
        with page.expect_download() as info:
            page.click(button)
        path = tmp_path / info.value.suggested_filename
        info.value.save_as(path)
        return info.value.suggested_filename, json.loads(path.read_text())

    name, every = save("#export-json")
    assert name == f"headscope-{MODEL}-all-heads.json"
    n = every["n"]
    assert len(every["attention"]) == 6 and {len(layer) for layer in every["attention"]} == {12}
    assert len(every["attention"][2][7]) == n and len(every["attention"][2][7][0]) == n

    name, one = save("#export-json-head")
    assert name == f"headscope-{MODEL}-L2-H7.json"
    assert (one["layer"], one["head"]) == (2, 7) and one["tokens"] == every["tokens"]
    assert len(one["attention"]) == n and {len(row) for row in one["attention"]} == {n}  # n x n, one head
    # The answer as the API gives it, with the tokens as the page spells them beside (WordPiece: unchanged).
    spelled = one.pop("display_tokens")
    assert spelled == one["tokens"] and every.pop("display_tokens") == every["tokens"]
    assert one == api(session.base, "/api/attention/head", {"text": SENTENCE, "layer": 2, "head": 7})

    # The layer's mean is the page's own: named for it, n x n, its error bound stated.
    page.click('#grid .thumb[data-layer="1"][data-head="mean"]')
    name, mean = save("#export-json-head")
    assert name == f"headscope-{MODEL}-L1-mean.json"
    assert mean["head"] == "mean" and len(mean["attention"]) == n and mean["max_abs_error"] > 0
    # Each row of a mean of softmax rows sums to 1, within n values each off by the 8-bit bound, plus n
    # roundings to 6 decimals (5e-7 each).
    bound = n * (mean["max_abs_error"] + 5e-7)
    assert all(abs(sum(row) - 1) <= bound for row in mean["attention"])


def test_copy_link_reopens_the_view(session: Any, browser: Any) -> None:
    page = desktop(session)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=session.base)
    session.open()
    session.run(SENTENCE)
    page.click('#grid .thumb[data-layer="3"][data-head="4"]')
    page.click("#tab-tokens")
    page.click("#copy-link")
    status = page.locator("#share-status")
    status.wait_for(state="visible")
    assert "Link copied" in status.text_content() and status.get_attribute("role") == "status"
    copied = page.evaluate("navigator.clipboard.readText()")
    assert copied == page.url and "text=" in copied

    again = page.context.new_page()
    again.goto(copied)
    again.wait_for_function("() => document.body.dataset.state === 'ready'")
    assert again.locator("#text").input_value() == SENTENCE
    assert again.locator("#detail-title").text_content() == "Head detail: layer 3, head 4"
    assert again.get_attribute("#tab-tokens", "aria-selected") == "true"
    again.close()


def test_zoom_shows_no_plotly_tip_over_the_tabs(session: Any) -> None:
    page = desktop(session)
    session.open()
    session.run(SENTENCE)
    box = page.locator("#head-detail .nsewdrag").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.2, box["y"] + box["height"] * 0.2)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] * 0.6, steps=5)
    page.mouse.up()
    page.wait_for_function("() => document.querySelector('#head-detail').layout.xaxis.autorange === false")
    # Plotly's tip ("Double-click to zoom back out") is a fixed note at the page's top right when shown.
    notes = page.locator(".plotly-notifier .notifier-note").all_text_contents()
    assert not [note for note in notes if re.search("double-click", note, re.IGNORECASE)]


def test_absent_detection_scores_show_a_dash_and_colour_nothing(session: Any) -> None:
    """A text with no repeated token: the duplicate-token and induction scores are null in the answer,
    "–" in every table cell (never 0), and colouring the grid by them leaves every frame plain."""
    page = desktop(session)
    session.open()
    text = "One two three."
    session.run(text)
    wait_insight(page)
    analysis = api(session.base, "/api/analysis", {"text": text})
    assert all(v is None for row in analysis["stats"]["induction"] for v in row)
    keys = page.eval_on_selector_all("#stats-table th", "ths => ths.map((th) => th.dataset.key)")
    column = keys.index("induction")
    cells = page.eval_on_selector_all(
        "#stats-table tbody tr", f"rows => rows.map((r) => r.children[{column}].textContent)"
    )
    assert cells and set(cells) == {"–"}
    page.select_option("#color-by", "induction")
    assert page.locator("#grid .thumb.colored").count() == 0
    page.select_option("#color-by", "previous_token")
    assert page.locator("#grid .thumb.colored").count() == analysis["layers"] * analysis["heads"]
