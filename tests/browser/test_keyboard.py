"""The page by keyboard alone, at 1440x900: the head grid as one tab stop whose focus follows the selection,
the heatmap's cell cursor read out in a live region, the detail's view switch as tabs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from api_client import post_json
from tolerances import ROUND6

pytestmark = pytest.mark.browser

SENTENCE = "The cat sat on the mat because the cat was tired."

# The readout prints 3 decimals of the drawn exact float32 value; /api/attention rounds the same float32
# value to 6. They differ by at most half a unit of the 3rd decimal plus the JSON's rounding.
READOUT = 5e-4 + ROUND6

# An element named for the assertions: its id, or a thumbnail's "thumb <layer> <head>".
NAME_JS = """(e) => e.matches('#grid .thumb') ? `thumb ${e.dataset.layer} ${e.dataset.head}`
  : e.id || e.tagName.toLowerCase()"""
ACTIVE_JS = f"() => ({NAME_JS})(document.activeElement)"

# The tab stops DOM order implies between the text box and the heatmap, each named as ACTIVE_JS names it.
# A group of radios is one stop, its checked radio (the weighting switch).
TAB_STOPS_JS = f"""() => {{
  const all = [...document.querySelectorAll('a[href], button, input, select, textarea, [tabindex]')];
  const name = {NAME_JS};
  const visible = (e) => e.checkVisibility({{visibilityProperty: true}});
  const checked = (e) => e.form?.querySelector(`input[name="${{e.name}}"]:checked`);
  const grouped = (e) => e.type === 'radio' && !e.checked && checked(e);
  const stops = all.filter((e) => e.tabIndex >= 0 && !e.matches(":disabled") && visible(e) && !grouped(e));
  const from = stops.indexOf(document.querySelector('#text'));
  const to = stops.indexOf(document.querySelector('#head-detail'));
  return stops.slice(from + 1, to + 1).map(name);
}}"""


@pytest.fixture
def desktop(session: Any) -> Any:
    """conftest's session at 1440x900, the size the keyboard problems were found at."""
    session.page.set_viewport_size({"width": 1440, "height": 900})
    return session


def api_attention(base: str, text: str) -> Any:
    """/api/attention for `text` on the default model: every head, values rounded to 6 decimals."""
    return post_json(base, "/api/attention", {"text": text})


def active(page: Any) -> str:
    return str(page.evaluate(ACTIVE_JS))


def selected(page: Any) -> str:
    """The highlighted thumbnail, named as ACTIVE_JS names a focused one."""
    return str(page.locator("#grid .thumb.selected").evaluate(NAME_JS))


def wait_title(page: Any, names: str) -> None:
    """Until the detail's title names `names` ("layer 2, head 6")."""
    title = "(s) => document.querySelector('#detail-title').textContent.includes(s)"
    page.wait_for_function(title, arg=names)


def test_the_grid_is_one_tab_stop_on_the_selected_head(desktop: Any, artifacts: Path) -> None:
    page = desktop.open()
    desktop.run(SENTENCE)
    reference = api_attention(desktop.base, SENTENCE)
    cells = reference["layers"] * (reference["heads"] + 1)  # every head and each layer's mean
    assert page.locator("#grid .thumb").count() == cells
    assert page.locator('#grid .thumb[tabindex="0"]').count() == 1
    assert page.get_attribute("#grid", "role") == "grid"
    assert page.locator("#grid [role=row]").count() == reference["layers"] + 1  # the header row too

    page.focus("#text")
    visited = []
    for _ in range(cells + 50):  # bounded: more presses than the old page's 89 stops
        page.keyboard.press("Tab")
        visited.append(active(page))
        if visited[-1] == "head-detail":
            break
    assert visited[-1] == "head-detail"
    in_grid = [stop for stop in visited if stop.startswith("thumb ")]
    assert in_grid == ["thumb 0 0"] == [selected(page)]
    # Every other stop is one DOM order gives: nothing skipped, nothing visited twice.
    assert visited == page.evaluate(TAB_STOPS_JS)
    assert len(visited) == len(set(visited))

    # Back into the grid from the other side: the selected cell again, its ring visible.
    page.keyboard.press("ArrowRight")  # the heatmap's cursor moves; the selection stays
    assert selected(page) == "thumb 0 0"
    while active(page) != "thumb 0 0":
        page.keyboard.press("Shift+Tab")
        assert active(page) != "text", "Shift+Tab passed the grid"
    ring = page.evaluate(
        "() => [document.activeElement.matches(':focus-visible'),"
        " getComputedStyle(document.activeElement, '::after').boxShadow]"
    )
    assert ring[0] is True and ring[1] != "none"
    page.locator(".grid-panel").screenshot(path=str(artifacts / "keyboard-grid.png"))


def test_arrow_keys_move_focus_with_the_selection_and_enter_opens_the_focused_head(desktop: Any) -> None:
    page = desktop.open()
    desktop.run(SENTENCE)
    layers = api_attention(desktop.base, SENTENCE)["layers"]

    page.click('#grid .thumb[data-layer="2"][data-head="5"]')
    assert active(page) == selected(page) == "thumb 2 5"
    page.keyboard.press("ArrowRight")
    assert active(page) == selected(page) == "thumb 2 6"
    # Enter opens the cell that has focus (the old page re-opened the clicked head 5).
    page.keyboard.press("Enter")
    wait_title(page, "layer 2, head 6")
    assert selected(page) == "thumb 2 6"

    moves = [
        ("ArrowDown", "thumb 3 6"),
        ("End", "thumb 3 mean"),  # the aggregate column is part of the grid
        ("ArrowLeft", "thumb 3 11"),
        ("Home", "thumb 3 0"),
        ("PageDown", f"thumb {layers - 1} 0"),
        ("PageUp", "thumb 0 0"),
        ("Control+End", f"thumb {layers - 1} mean"),
        ("Control+Home", "thumb 0 0"),
    ]
    for key, where in moves:
        page.keyboard.press(key)
        assert (key, active(page), selected(page)) == (key, where, where)
        assert page.locator('#grid .thumb[tabindex="0"]').evaluate("t => t === document.activeElement")
    page.keyboard.press(" ")  # Space opens it too
    wait_title(page, "layer 0, head 0")
    assert page.locator("#grid .thumb[aria-selected=true]").count() == 1


def test_the_heatmap_cursor_reads_cells_as_the_api_gives_them(desktop: Any, artifacts: Path) -> None:
    page = desktop.open()
    desktop.run(SENTENCE)
    reference = api_attention(desktop.base, SENTENCE)
    tokens, n = reference["tokens"], reference["n"]
    page.wait_for_selector("#head-detail[data-exact=true]")  # the exact head, as the API rounds it
    exact = reference["attention"][0][0]

    page.focus("#copy-link")  # the last stop before the heatmap
    page.keyboard.press("Tab")  # a keyboard arrival (not a click): the cursor shows on the first cell
    assert active(page) == "head-detail"
    # Its ring is drawn over the figure (Plotly's opaque paper covers an outline inside the element).
    ring = page.evaluate(
        "() => { const s = getComputedStyle(document.activeElement, '::after');"
        " return [s.boxShadow, s.zIndex]; }"
    )
    assert ring[0] != "none" and int(ring[1]) > 0
    readout = page.locator("#cell-readout")
    cursor = page.locator("#detail-scroll .cell-cursor")
    assert readout.get_attribute("aria-live") == "polite"
    assert readout.text_content().startswith(f"query '{tokens[0]}' (0) → key '{tokens[0]}' (0): ")

    i, j = tokens.index("cat"), tokens.index("sat")
    for key in ["ArrowDown"] * i + ["ArrowRight"] * j:
        page.keyboard.press(key)
    text = readout.text_content()
    match = re.fullmatch(rf"query 'cat' \({i}\) → key 'sat' \({j}\): (\d\.\d{{3}})", text)
    assert match, text
    assert abs(float(match.group(1)) - exact[i][j]) <= READOUT
    # The outline sits on that cell.
    box = cursor.bounding_box()
    x, y = desktop.cell_center(i, j)
    assert cursor.is_visible() and box is not None
    assert box["x"] < x < box["x"] + box["width"] and box["y"] < y < box["y"] + box["height"]
    page.locator(".detail-panel").screenshot(path=str(artifacts / "keyboard-cursor.png"))

    # Home/End within the row; the grid's selection never moved.
    page.keyboard.press("End")
    assert readout.text_content().startswith(f"query 'cat' ({i}) → key '{tokens[n - 1]}' ({n - 1}): ")
    page.keyboard.press("Home")
    assert readout.text_content().startswith(f"query 'cat' ({i}) → key '{tokens[0]}' (0): ")
    assert selected(page) == "thumb 0 0"
    assert active(page) == "head-detail"

    # Escape takes the cursor away; an arrow brings it back where it was.
    page.keyboard.press("Escape")
    assert readout.text_content() == "" and not cursor.is_visible()
    page.keyboard.press("ArrowRight")
    assert readout.text_content().startswith(f"query 'cat' ({i}) → key '{tokens[1]}' (1): ")


def test_the_cursor_says_masked_and_enter_chooses_a_written_row(desktop: Any, grouped_model: str) -> None:
    page = desktop.open(f"?text=The+cat+sat.&model={grouped_model}&continue=2")  # a link's text runs
    desktop.wait_ready()
    n = int(page.get_attribute("#head-detail", "data-n") or 0)
    page.focus("#head-detail")
    page.keyboard.press("ArrowRight")  # query 0 cannot see key 1
    readout = page.locator("#cell-readout")
    assert readout.text_content().endswith(": masked (a causal model cannot look ahead)")
    page.keyboard.press("ArrowDown")  # query 1 sees key 1
    assert re.search(r"\(1\) → key '.*' \(1\): \d\.\d{3}$", readout.text_content())
    # Enter on a written token's row chooses it, as a click on the row does.
    page.keyboard.press("PageDown")
    assert readout.text_content().startswith("query '✎ ")
    page.keyboard.press("Enter")
    chosen = page.locator("#written-tokens button[aria-pressed=true]")
    assert chosen.get_attribute("data-i") == str(n - 1)
    assert active(page) == "head-detail"


def test_the_view_switch_is_a_tab_list(desktop: Any) -> None:
    page = desktop.open()
    desktop.run(SENTENCE)
    tabs = {"heatmap": "#tab-heatmap", "tokens": "#tab-tokens"}
    for name, panel in (("heatmap", "detail-scroll"), ("tokens", "token-view")):
        assert page.get_attribute(tabs[name], "aria-controls") == panel
        assert page.get_attribute(f"#{panel}", "role") == "tabpanel"

    def shown() -> tuple[str, str, str, bool]:
        """The focused element, the selected tab, its tab stop, whether its panel shows."""
        tab = page.locator("[role=tab][aria-selected=true]")
        panel = page.locator("#" + str(tab.get_attribute("aria-controls")))
        stops = page.locator('[role=tab][tabindex="0"]')
        assert stops.count() == 1
        return active(page), str(tab.get_attribute("id")), str(stops.get_attribute("id")), panel.is_visible()

    page.focus("#tab-heatmap")
    assert shown() == ("tab-heatmap", "tab-heatmap", "tab-heatmap", True)
    page.keyboard.press("ArrowRight")
    assert shown() == ("tab-tokens", "tab-tokens", "tab-tokens", True)
    assert not page.locator("#detail-scroll").is_visible()
    assert "view=tokens" in page.url
    page.keyboard.press("ArrowRight")  # wraps round
    assert shown() == ("tab-heatmap", "tab-heatmap", "tab-heatmap", True)
    page.keyboard.press("End")
    assert shown() == ("tab-tokens", "tab-tokens", "tab-tokens", True)
    page.keyboard.press("Home")
    assert shown() == ("tab-heatmap", "tab-heatmap", "tab-heatmap", True)
    # The other tab is no tab stop: Tab leaves the tab list.
    page.keyboard.press("Tab")
    assert active(page) not in tabs.values() and active(page) != "tab-tokens"
