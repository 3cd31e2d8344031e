"""Token lines of every head of a layer (bertviz's head view), at the desktop size: a colour per head, swatch
toggles and isolation, the sentence-pair filter, tapping or Enter on a token, and the values lines read as."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlparse

import pytest

from tests.browser.conftest import PageSession
from tests.browser.test_page import api_attention, post

A, B = "The animal didn't cross the street.", "It was too tired."
# A line's readout: "L2 H3: 'it' → 'animal' ≈0.412" (≈: the page's 8-bit values).
READOUT = re.compile(r"^L(\d+) H(\d+): '(.*)' → '(.*)' (≈?)(\d\.\d{3})$")
# The page's 8-bit value is within scale/510 <= 1/510 of the model's (app/compact.py), its readout rounds to
# 3 decimals (5e-4) and the JSON API to 6 (5e-7).
READ_TOLERANCE = 1 / 510 + 5e-4 + 5e-7

SPECIAL_JS = """() => [...document.querySelectorAll('#token-lines text.left')]
  .map((t) => [t.textContent, t.classList.contains('special')])"""
LINES_JS = """() => [...document.querySelectorAll('#token-lines line')]
  .filter((l) => getComputedStyle(l).display !== 'none')
  .map((l) => ({i: +l.parentNode.dataset.i, j: +l.dataset.j, h: +l.dataset.h,
                 stroke: l.getAttribute('stroke')}))"""


@pytest.fixture
def desktop(session: PageSession) -> PageSession:
    """conftest's `session` (no outside request, no script error) at the desktop size."""
    session.page.set_viewport_size({"width": 1440, "height": 900})
    return session


def all_heads(page: Any) -> list[dict[str, Any]]:
    page.click("#tab-tokens")
    page.check("#lines-mode input[value=layer]")
    page.wait_for_selector("#token-view[data-mode=layer]")
    lines: list[dict[str, Any]] = page.evaluate(LINES_JS)
    return lines


def visible(page: Any) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = page.evaluate(LINES_JS)
    return lines


def test_all_heads_draw_a_colour_each_and_swatches_toggle_them(desktop: PageSession, artifacts: Path) -> None:
    page = desktop.open()
    desktop.run(A, pair=B)
    heads = api_attention(desktop.base, A, B)["heads"]
    lines = all_heads(page)
    colours = {line["h"]: line["stroke"] for line in lines}
    assert sorted(colours) == list(range(heads))  # a row's largest weight is >= 1/n > 0.01: every head draws
    assert len(set(colours.values())) == heads  # each its own colour
    assert all(colours[line["h"]] == line["stroke"] for line in lines)
    assert page.text_content("#detail-title") == "Head detail: layer 0, all heads"
    assert parse_qs(urlparse(page.url).query)["lines"] == ["layer"]
    page.locator(".detail-panel").screenshot(path=artifacts / "lines-all-heads.png")
    # The SVG export is named for what it holds, and keeps every head's colour.
    with page.expect_download() as info:
        page.click("#export-svg")
    assert info.value.suggested_filename == "headscope-all-MiniLM-L6-v2-L0-all-heads-tokens.svg"
    saved = artifacts / "lines-all-heads.svg"
    info.value.save_as(saved)
    assert all(f'stroke="{colour}"' in saved.read_text() for colour in colours.values())

    # A swatch press hides that head's lines and says so; a second press brings them back.
    swatch = page.locator("#lines-swatches .swatch[data-h='3']")
    swatch.click()
    assert swatch.get_attribute("aria-pressed") == "false"
    assert {line["h"] for line in visible(page)} == set(range(heads)) - {3}
    swatch.click()
    assert {line["h"] for line in visible(page)} == set(range(heads))

    # "only" (keyboard and touch) and a double-click both leave one head; "All heads" shows them all again.
    page.locator("#lines-swatches .swatch-only[data-h='5']").press("Enter")
    assert {line["h"] for line in visible(page)} == {5}
    page.locator("#lines-swatches .swatch[data-h='2']").dblclick()
    assert {line["h"] for line in visible(page)} == {2}
    page.click("#lines-swatches .swatch-all")
    assert {line["h"] for line in visible(page)} == set(range(heads))

    # Hiding the first token renormalises every head without it: no line ends there.
    page.check("#hide-first")
    page.wait_for_function("() => !document.querySelector('#token-lines line[data-j=\"0\"]')")
    assert visible(page)


def test_pair_filter_keeps_only_lines_from_a_to_b(desktop: PageSession) -> None:
    page = desktop.open()
    desktop.run(A, pair=B)
    segments = api_attention(desktop.base, A, B)["segments"]
    everything = all_heads(page)
    for name, (src, dst) in {"ab": (0, 1), "ba": (1, 0), "aa": (0, 0), "bb": (1, 1)}.items():
        page.select_option("#lines-pairs", name)
        page.wait_for_function(f"() => new URL(location).searchParams.get('pairs') === '{name}'")
        lines = visible(page)
        expected = [x for x in everything if segments[x["i"]] == src and segments[x["j"]] == dst]
        assert lines and sorted(map(str, lines)) == sorted(map(str, expected)), name
    page.select_option("#lines-pairs", "all")
    assert len(visible(page)) == len(everything)

    # Words mode: the same overlay and filter over whole words (the API merges them).
    page.select_option("#lines-pairs", "ab")
    page.evaluate("document.body.dataset.state = 'idle'")
    page.check("#words")
    desktop.wait_ready()
    words = post(desktop.base, "/api/attention", {"text": A, "text_pair": B, "words": True})
    assert page.locator("#token-lines text.left").all_text_contents() == words["tokens"]
    lines = visible(page)
    assert lines and all(words["segments"][x["i"]] == 0 and words["segments"][x["j"]] == 1 for x in lines)
    assert len({x["h"] for x in visible(page)}) > 1


def test_a_tap_or_enter_isolates_a_token_and_escape_clears(desktop: PageSession) -> None:
    page = desktop.open()
    desktop.run(A, pair=B)
    page.wait_for_selector("#head-detail[data-exact=true]")  # else its arrival redraws under the keys below
    all_heads(page)
    for mode in ("layer", "head"):
        page.check(f"#lines-mode input[value={mode}]")
        page.wait_for_selector(f"#token-view[data-mode={mode}]")
        total = len(visible(page))
        page.click("#token-lines text.left[data-i='2']")
        page.mouse.move(0, 0)  # off the tokens: a pinned token stays isolated without the pointer
        assert {line["i"] for line in visible(page)} == {2}
        page.click("#token-lines text.left[data-i='2']")  # a second tap clears
        page.mouse.move(0, 0)
        assert len(visible(page)) == total

        before = parse_qs(urlparse(page.url).query)
        page.focus("#token-lines svg")
        page.keyboard.press("ArrowDown")
        page.keyboard.press("ArrowDown")
        page.keyboard.press("Enter")
        assert {line["i"] for line in visible(page)} == {1}
        page.keyboard.press("ArrowDown")  # a pinned token follows the cursor
        assert {line["i"] for line in visible(page)} == {2}
        page.keyboard.press("Escape")
        assert len(visible(page)) == total
        after = parse_qs(urlparse(page.url).query)
        # The arrows moved in the drawing, not the head selection.
        assert (after["layer"], after["head"]) == (before["layer"], before["head"])


def test_a_redraw_keeps_the_keyboard_in_the_lines(desktop: PageSession) -> None:
    """The drawing is replaced on each redraw (another filter here; the exact head arriving, in use): the
    focus goes to the new one, so the next arrow key moves the token cursor, not the head selection."""
    page = desktop.open()
    desktop.run(A, pair=B)
    page.wait_for_selector("#head-detail[data-exact=true]")
    all_heads(page)
    page.focus("#token-lines svg")
    before = parse_qs(urlparse(page.url).query)
    drawing = page.query_selector("#token-lines svg")
    # A change that moves no focus: the pair filter set from a script, as the exact head's arrival is.
    page.evaluate(
        "() => { const s = document.querySelector('#lines-pairs'); s.value = 'ab'; "
        "s.dispatchEvent(new Event('change', { bubbles: true })); }"
    )
    page.wait_for_function("(old) => !old.isConnected", arg=drawing)
    assert page.evaluate("document.activeElement === document.querySelector('#token-lines svg')")
    page.keyboard.press("ArrowDown")
    assert page.locator("#token-lines text.left.cursor").count() == 1
    after = parse_qs(urlparse(page.url).query)
    assert (after["layer"], after["head"]) == (before["layer"], before["head"])


def read(page: Any) -> tuple[int, int, str, str, float]:
    text = page.text_content("#lines-readout")
    match = READOUT.match(text or "")
    assert match, text
    layer, head, query, key, _, value = match.groups()
    return int(layer), int(head), query, key, float(value)


def test_line_values_read_the_api_on_hover_and_keys(
    desktop: PageSession, grouped_model: str, artifacts: Path
) -> None:
    text = "The cat sat on the mat because it was warm"
    # L1 H0 from the address, and its exact values awaited: arriving later, they would redraw the lines under
    # the keys below and take the focus with them (the page's arrows would then move the head selection).
    page = desktop.open("?" + urlencode({"text": text, "model": grouped_model, "layer": 1, "head": 0}))
    desktop.wait_ready()
    page.wait_for_selector("#head-detail[data-exact=true]")
    api = api_attention(desktop.base, text, model=grouped_model)
    lines = all_heads(page)
    assert all(line["j"] <= line["i"] for line in lines)  # causal: nothing looks ahead
    groups = page.locator("#lines-swatches .swatch-group")
    assert groups.count() == 2 and groups.first.text_content().startswith("kv 0:")
    assert groups.nth(1).locator(".swatch").all_text_contents() == ["H2", "H3"]

    # One head alone, one token pinned: its lines fan out, so the pointer can rest on one of them.
    page.click("#lines-swatches .swatch-only[data-h='2']")
    n = api["n"]
    page.click(f"#token-lines text.left[data-i='{n - 1}']")
    # A line under the view's threshold stays in the DOM with display: none (LINES_JS skips those too).
    line = page.locator(f"#token-lines g[data-i='{n - 1}'] line").filter(visible=True).last
    box = line.bounding_box()  # the click redraws synchronously, and nothing is on the way to redraw again
    assert box is not None
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    layer, head, _, key, value = read(page)
    j = int(line.get_attribute("data-j") or -1)
    assert (layer, head) == (1, 2) and key == api["tokens"][j].replace("▁", "␣")
    assert abs(value - api["attention"][1][2][n - 1][j]) <= READ_TOLERANCE

    # The keyboard reads the pinned token's lines one by one, strongest first.
    page.focus("#token-lines svg")
    page.keyboard.press("ArrowRight")
    layer, head, _, key, value = read(page)
    row = api["attention"][1][2][n - 1]
    assert abs(value - max(row)) <= READ_TOLERANCE
    page.locator(".detail-panel").screenshot(path=artifacts / "lines-grouped-pinned.png")


def test_unknown_words_are_styled_as_special_tokens_are(desktop: PageSession) -> None:
    """[UNK] is no special token (the statistics leave it out), but the page still sets it apart from the
    text's words, as it sets [CLS] and [SEP] apart, in tokens and in words."""
    page = desktop.open()
    desktop.run("The snowman ☃ waved.")
    page.click("#tab-tokens")
    marked = dict(page.evaluate(SPECIAL_JS))
    apart = {"[CLS]", "[UNK]", "[SEP]"}
    assert marked == {
        t: t in apart for t in ["[CLS]", "the", "snow", "##man", "[UNK]", "waved", ".", "[SEP]"]
    }
    page.evaluate("document.body.dataset.state = 'idle'")
    page.check("#words")
    desktop.wait_ready()
    assert dict(page.evaluate(SPECIAL_JS))["☃"] is True  # the word, spelled from the text
