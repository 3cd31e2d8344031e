"""The page on a phone (390 x 844, touch) and every token labelled on a desktop (1440 x 900).

On the phone nothing may be wider than the screen (no sideways page scroll), the grid scrolls in its own
box with its labels kept in view, and a thumbnail tap brings the detail into view. On the desktop every
token is labelled on both axes up to 64 tokens, in the detail, the words view and the compare maps.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import pytest

from tests.browser.conftest import PageSession

pytestmark = pytest.mark.browser

PHONE = {
    "viewport": {"width": 390, "height": 844},
    "device_scale_factor": 3,
    "is_mobile": True,
    "has_touch": True,
}
DESKTOP = {"viewport": {"width": 1440, "height": 900}}
WORDS = "the cat sat on the mat and the dog ran to the park".split()
PAIR = ("The cat sat on the mat.", "It was tired, so it slept.")
# Half a pixel: layout boxes are fractional, and a box that ends within it draws no wider than the screen.
EDGE_PX = 0.5


def sentence(n: int) -> str:
    """A MiniLM input of n tokens: n - 2 one-piece words between [CLS] and [SEP]."""
    return " ".join(WORDS[i % len(WORDS)] for i in range(n - 2))


@pytest.fixture(scope="module")
def contexts(browser: Any) -> Iterator[Callable[[dict[str, Any]], Any]]:
    """The context of a screen's options (PHONE, DESKTOP), one each, made when a test first asks for it and
    closed with the module: each test's page is its own, where the pages before it left V8's compiled
    plotly.js and the HTTP cache, as `session`'s profile keeps them (the page keeps nothing in storage)."""
    made: dict[str, Any] = {}

    def context(options: dict[str, Any]) -> Any:
        key = json.dumps(options, sort_keys=True)
        if key not in made:
            made[key] = browser.new_context(**options)
        return made[key]

    yield context
    for each in made.values():
        each.close()


@pytest.fixture
def screen(request: Any, contexts: Callable[[dict[str, Any]], Any], server: str) -> Iterator[PageSession]:
    """A PageSession, a new page in the context of the size a test names (indirect parametrisation); it
    must end on our server, error-free."""
    page = contexts(request.param).new_page()
    page.set_default_timeout(30_000)
    tracked = PageSession(page, server)
    tracked.width = request.param["viewport"]["width"]  # type: ignore[attr-defined]
    yield tracked
    page.close()
    assert tracked.errors == [], f"uncaught page errors: {tracked.errors}"
    assert all(url.startswith((server + "/", f"blob:{server}/")) for url in tracked.requests)


# What reaches past the right edge of the screen, and how wide the page is (the layout viewport grows with
# it on a phone, so innerWidth is no measure: the context's width is).
OVERFLOW_JS = """([width, slack]) => {
  const wide = [];
  for (const e of document.querySelectorAll('main *, header *')) {
    const r = e.getBoundingClientRect();
    if (!r.width || !e.checkVisibility()) continue;
    // Content of a scroll box may lie beyond the screen: the box itself may not.
    const boxes = '.grid-scroll, .detail-scroll, .token-view, .plot-scroll, .table-scroll';
    if (e.parentElement.closest(boxes)) continue;
    if (r.right > width + slack || r.left < -slack) wide.push(`${e.tagName}#${e.id} ${r.right}`);
  }
  return {scrollWidth: document.documentElement.scrollWidth, wide};
}"""

# Right edges of every drawn figure: Plotly's and the token lines.
FIGURES_JS = """() => [
  ...document.querySelectorAll('.js-plotly-plot .main-svg:first-of-type, svg.token-lines')
].filter((e) => e.checkVisibility()).map((e) => [e.closest('[id]').id, e.getBoundingClientRect().right])"""

TICKS_JS = """(sel) => {
  const gd = document.querySelector(sel);
  return {
    n: gd.querySelector('.heatmaplayer') ? gd.data.find((t) => t.type === 'heatmap').z.length : 0,
    x: gd.layout.xaxis.ticktext.length, y: gd.layout.yaxis.ticktext.length,
    xdom: gd.querySelectorAll('.xtick text').length, ydom: gd.querySelectorAll('.ytick text').length,
    xvals: gd.layout.xaxis.tickvals, font: gd.layout.xaxis.tickfont.size,
  };
}"""


def assert_fits(session: PageSession, what: str) -> None:
    width = session.width  # type: ignore[attr-defined]
    found = session.page.evaluate(OVERFLOW_JS, [width, EDGE_PX])
    assert found["scrollWidth"] <= width and found["wide"] == [], f"{what}: {found}"
    figures = session.page.evaluate(FIGURES_JS)
    assert figures, f"{what}: no figure drawn"
    assert all(right <= width + EDGE_PX for _, right in figures), f"{what}: {figures}"


def run_url(session: PageSession, query: str) -> Any:
    page = session.open(query)
    session.wait_ready()
    return page


@pytest.mark.parametrize("screen", [PHONE], indirect=True, ids=["phone"])
def test_phone_never_scrolls_sideways(screen: PageSession) -> None:
    page = run_url(screen, f"?text={quote(PAIR[0])}")
    assert_fits(screen, "a sentence")
    page.click("#tab-tokens")
    page.wait_for_selector("#token-view svg.token-lines")
    assert_fits(screen, "token lines")
    page.click("#tab-heatmap")
    screen.run(PAIR[0], pair=PAIR[1])
    assert_fits(screen, "a pair")
    page.click("#examples button >> text=Long paragraph")
    page.wait_for_function(
        "() => document.body.dataset.state === 'ready'"
        " && Number(document.querySelector('#head-detail').dataset.n) > 64"
    )
    assert_fits(screen, "a long paragraph")
    # The insight views below: rollout (drawn once on screen) and the statistics table.
    page.locator("#rollout").scroll_into_view_if_needed()
    page.wait_for_function("() => document.querySelector('#rollout .main-svg')")
    assert_fits(screen, "rollout")
    # Compare mode: the B inputs, and the A, B and A - B maps one under another.
    run_url(screen, f"?text={quote(PAIR[0])}&compare=1&btext={quote(PAIR[1])}")
    page.locator("#compare-panel").scroll_into_view_if_needed()
    page.wait_for_selector("#compare-panel[data-state=ready]")
    assert_fits(screen, "compare")
    # An error with a long unbroken word (a model name, up to the API's 100 characters) wraps on screen.
    page.evaluate("""() => {
      const option = new Option('x'.repeat(80), 'no-such-model-' + 'x'.repeat(80));
      document.querySelector('#model').append(option);
    }""")
    page.select_option("#model", index=page.locator("#model option").count() - 1)
    page.click("#run")
    page.wait_for_function("() => document.body.dataset.state === 'error'")
    assert page.locator("#error").is_visible() and "no-such-model" in page.locator("#error").text_content()
    assert_fits(screen, "an error")


@pytest.mark.parametrize("screen", [PHONE], indirect=True, ids=["phone"])
def test_phone_grid_scrolls_in_its_box_with_labels_in_view(screen: PageSession) -> None:
    page = run_url(screen, f"?text={quote(PAIR[0])}")
    box = page.locator("#grid-box")
    # 13 columns of MiniLM do not fit 390 px: the box scrolls sideways and says so at its right edge.
    assert "more-right" in box.get_attribute("class").split()
    assert "more-left" not in box.get_attribute("class").split()
    # A short box (as on a landscape phone) scrolls down too: scroll to the far corner.
    page.evaluate("""() => {
      const s = document.querySelector('#grid-scroll');
      s.style.maxHeight = '160px';
      s.scrollTo(s.scrollWidth, s.scrollHeight);
    }""")
    page.wait_for_function("() => document.querySelector('#grid-box').classList.contains('more-left')")
    classes = box.get_attribute("class").split()
    assert "more-top" in classes and "more-right" not in classes and "more-bottom" not in classes
    seen = page.evaluate(
        """(slack) => {
      const box = document.querySelector('#grid-scroll').getBoundingClientRect();
      const inside = (e) => { const r = e.getBoundingClientRect();
        return r.left >= box.left - slack && r.right <= box.right + slack
          && r.top >= box.top - slack && r.bottom <= box.bottom + slack; };
      // The topmost element at a label's centre is the label: nothing scrolled over it.
      const onTop = (e) => { const r = e.getBoundingClientRect();
        return e.contains(document.elementFromPoint((r.left + r.right) / 2, (r.top + r.bottom) / 2)); };
      const rows = [...document.querySelectorAll('#grid .grid-row:not(.grid-header) .row-label')];
      const heads = [...document.querySelectorAll('#grid .grid-header .col-label')];
      const last = rows.at(-1), head = heads.at(-1);
      return {
        last: [last.textContent, inside(last), onTop(last)],
        head: [head.textContent, inside(head), onTop(head)],
      };
    }""",
        EDGE_PX,
    )
    assert seen["last"] == ["L5", True, True]  # the last layer's label, left, over the scrolled thumbnails
    assert seen["head"][1:] == [True, True]  # the last column's label, on top


@pytest.mark.parametrize("screen", [PHONE], indirect=True, ids=["phone"])
def test_phone_thumbnail_tap_brings_the_detail_into_view(screen: PageSession) -> None:
    page = run_url(screen, f"?text={quote(PAIR[0])}")
    top = "() => document.querySelector('.detail-panel').getBoundingClientRect().top"
    assert page.evaluate(top) > 844  # below the grid, off screen
    page.locator('#grid .thumb[data-layer="1"][data-head="2"]').tap()
    # At the top of the screen, where the (smooth) scroll ends; 1 px for fractional layout.
    page.wait_for_function(f"() => Math.abs(({top})()) <= 1")
    assert "layer 1, head 2" in page.locator("#detail-title").text_content()
    # With the last grid row and the detail's top both on screen, a tap selects and leaves the page be.
    thumb = page.locator('#grid .thumb[data-layer="5"][data-head="0"]')
    page.evaluate("(e) => window.scrollBy(0, e.getBoundingClientRect().bottom - 650)", thumb.element_handle())
    assert page.evaluate(top) < 844 - 120  # more than reveal's 120 px of the detail show
    before = page.evaluate("window.scrollY")
    thumb.tap()
    title = "() => document.querySelector('#detail-title').textContent"
    page.wait_for_function(f"() => ({title})().includes('layer 5, head 0')")
    # A reveal would scroll by over 100 px; 1 px is scroll anchoring rounding a fractional layout.
    assert abs(page.evaluate("window.scrollY") - before) <= 1


@pytest.mark.parametrize("screen", [PHONE], indirect=True, ids=["phone"])
def test_phone_29_tokens_fit_the_screen_labels_thin_and_zoom_brings_them_back(screen: PageSession) -> None:
    page = run_url(screen, f"?text={quote(sentence(29))}")
    ticks = page.evaluate(TICKS_JS, "#head-detail")
    # 29 labels need 290 px at 10 px each; about 250 px of a 390 px screen are left beside the labels.
    assert ticks["n"] == 29 and ticks["xvals"] == list(range(0, 29, 2)) and ticks["font"] >= 9
    assert page.locator("#head-detail .modebar").count() == 0  # it would cover the title
    page.evaluate(
        "() => Plotly.relayout(document.querySelector('#head-detail'),"
        " {'xaxis.range': [-0.5, 9.5], 'yaxis.range': [9.5, -0.5]})"
    )
    page.wait_for_function("() => document.querySelector('#head-detail').layout.xaxis.tickvals.length === 10")
    assert page.evaluate(TICKS_JS, "#head-detail")["ydom"] == 10


@pytest.mark.parametrize("screen", [DESKTOP], indirect=True, ids=["desktop"])
@pytest.mark.parametrize("n", [29, 64])
def test_desktop_labels_every_token_on_both_axes(screen: PageSession, n: int) -> None:
    page = run_url(screen, f"?text={quote(sentence(n))}")
    ticks = page.evaluate(TICKS_JS, "#head-detail")
    assert ticks["n"] == n
    assert ticks["xvals"] == list(range(n)) and [ticks[k] for k in ("x", "y", "xdom", "ydom")] == [n] * 4
    assert ticks["font"] >= 9  # legible
    # The figure fits its panel: beside the grid up to ~40 tokens, else the detail moves under the grid at
    # full width; never a sideways scroll to the colour bar.
    seen = page.evaluate("""() => {
      const panel = document.querySelector('#detail-scroll');
      const bar = document.querySelector('#head-detail .colorbar').getBoundingClientRect();
      return {
        figure: document.querySelector('#head-detail .main-svg').getBoundingClientRect().width,
        room: panel.clientWidth, barInside: bar.right <= panel.getBoundingClientRect().right,
        stacked: document.querySelector('.workspace').classList.contains('stacked'),
      };
    }""")
    assert seen["figure"] <= seen["room"] and seen["barInside"]
    assert seen["stacked"] == (n == 64)  # MiniLM's grid leaves ~560 px beside it: enough for 29, not 64
    if n == 64:  # the next run that fits goes back beside the grid
        screen.run(sentence(29))
        assert not page.evaluate("document.querySelector('.workspace').classList.contains('stacked')")


@pytest.mark.parametrize("screen", [DESKTOP], indirect=True, ids=["desktop"])
def test_desktop_words_and_compare_views_label_every_token(screen: PageSession) -> None:
    text = sentence(29)
    page = run_url(screen, f"?text={quote(text)}&words=1")
    ticks = page.evaluate(TICKS_JS, "#head-detail")
    assert ticks["n"] == 29 and [ticks[k] for k in ("x", "y", "xdom", "ydom")] == [29] * 4
    other = text.replace("cat", "dog")
    page = run_url(screen, f"?text={quote(text)}&compare=1&btext={quote(other)}")
    page.wait_for_selector("#compare-panel[data-state=ready]")
    for name in ("a", "b", "diff"):
        ticks = page.evaluate(TICKS_JS, f"#compare-{name}")
        assert ticks["n"] == 29 and [ticks[k] for k in ("x", "y", "xdom", "ydom")] == [29] * 4, name


@pytest.mark.parametrize("screen", [DESKTOP], indirect=True, ids=["desktop"])
def test_desktop_512_tokens_fit_with_labels_and_colour_bar_in_view(screen: PageSession) -> None:
    text = " ".join(["the quick brown fox jumps over the lazy dog near the river bank"] * 60)
    page = run_url(screen, f"?text={quote(text)}&model=random")
    ticks = page.evaluate(TICKS_JS, "#head-detail")
    assert ticks["n"] == 512 and 8 <= ticks["x"] <= 64
    steps = {b - a for a, b in zip(ticks["xvals"], ticks["xvals"][1:], strict=False)}
    assert len(steps) == 1  # thinned evenly
    # The figure fits its panel sideways, so the colour bar and the query labels are in view unscrolled.
    seen = page.evaluate("""() => {
      const panel = document.querySelector('#detail-scroll').getBoundingClientRect();
      const bar = document.querySelector('#head-detail .colorbar').getBoundingClientRect();
      return [panel.right - bar.right, document.querySelector('#detail-scroll').scrollLeft];
    }""")
    assert seen[0] >= 0 and seen[1] == 0


@pytest.mark.parametrize("screen", [PHONE], indirect=True, ids=["phone"])
def test_phone_grouped_grid_keeps_both_header_rows_in_view(screen: PageSession, grouped_model: str) -> None:
    run_url(screen, f"?text={quote(PAIR[0])}&model={grouped_model}")
    seen = screen.page.evaluate("""() => {
      const s = document.querySelector('#grid-scroll');
      s.style.maxHeight = '90px';
      s.scrollTo(0, s.scrollHeight);
      const box = s.getBoundingClientRect();
      const kv = document.querySelector('#grid .kv-header').getBoundingClientRect();
      const heads = document.querySelector('#grid .grid-header:not(.kv-header)');
      const head = heads.getBoundingClientRect();
      // The first class: the selected head's label is also "current".
      const at = (r) => document.elementFromPoint(r.left + 50, (r.top + r.bottom) / 2).classList[0];
      const scrolled = s.scrollTop > 0;
      return {scrolled, kv: [kv.top - box.top, at(kv)], head: [head.top - kv.bottom, at(head)]};
    }""")
    assert seen["scrolled"]
    # The kv brackets at the top of the box, the head labels right under them, neither covered by thumbnails.
    assert seen["kv"][1] == "kv-label" and abs(seen["kv"][0]) <= EDGE_PX
    assert seen["head"][1] == "col-label" and abs(seen["head"][0]) <= EDGE_PX
