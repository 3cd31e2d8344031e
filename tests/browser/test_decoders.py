"""The page for today's decoder models, in headless Chromium against the real app (fixtures in conftest.py).

A tiny random Llama (4 query heads over 2 KV heads) shows the grid's KV groups, the hide-first-token toggle
and a continuation's written tokens. Every expected number comes from the API itself.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from tests.browser.conftest import TINY_GEMMA3
from tests.checkpoints import SLIDING_WINDOW

pytestmark = pytest.mark.browser

PROMPT = "The cat sat on the mat."
WRITE = 3  # tokens the model continues PROMPT by
# Float64, the page (decoder.js withoutFirstToken) and the reference below alike: a row's sum of n terms
# and one quotient, each rounded to half an ulp: n + 1 half-ulps of a value at most 1.
EPS64 = sys.float_info.epsilon

# The detail figure: its values, colour-bar title, tick labels and named shapes.
FIGURE_JS = """() => {
  const gd = document.querySelector('#head-detail');
  const [heatmap] = gd.data.filter((t) => t.type === 'heatmap');
  const {xaxis, yaxis, shapes = []} = gd.layout;
  const named = shapes.map((s) => ({name: s.name, x0: s.x0, y0: s.y0}));
  const colorbar = heatmap.colorbar.title.text;
  return {z: heatmap.z, colorbar, yticktext: yaxis.ticktext, xticktext: xaxis.ticktext, shapes: named};
}"""


def api(base: str, path: str, **fields: Any) -> Any:
    """POST `fields` as JSON to the app; the answer's JSON (an error status raises)."""
    data = json.dumps(fields).encode()
    request = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:  # noqa: S310 (local test server)
        return json.load(answer)


def causal(head: list[list[float]]) -> list[list[float | None]]:
    """A head as the page draws a causal model's: the masked cells (j > i) are gaps."""
    return [[v if j <= i else None for j, v in enumerate(row)] for i, row in enumerate(head)]


def renormalised(head: list[list[float]]) -> list[list[float | None]]:
    """A head without key 0, each row divided by what is left, summed left to right as the page sums."""
    rows: list[list[float | None]] = []
    for i, row in enumerate(head):
        rest = 0.0
        for v in row[1:]:
            rest += v
        rows.append([None] + [v / rest if rest > 0 and j <= i else None for j, v in enumerate(row[1:], 1)])
    return rows


def open_head(session: Any, model: str, layer: int, head: int, *, write: int = 0) -> Any:
    """The page on PROMPT with `model` (continued by `write` tokens), head (layer, head) drawn exactly."""
    query = f"?text={PROMPT}&model={model}&layer={layer}&head={head}"
    page = session.open(query + (f"&continue={write}" if write else ""))
    session.wait_ready()
    page.wait_for_selector("#head-detail[data-exact=true]")
    return page


def thumb(page: Any, layer: int, head: int | str) -> Any:
    return page.locator(f'#grid .thumb[data-layer="{layer}"][data-head="{head}"]')


def test_grid_groups_query_heads_by_kv_head(session: Any, grouped_model: str) -> None:
    page = session.open()
    session.run(PROMPT, model=grouped_model)
    reference = api(session.base, "/api/attention", text=PROMPT, model=grouped_model)
    assert (reference["heads"], reference["kv_heads"]) == (4, 2)

    # A bracket per KV head over the two query heads that read it...
    labels = page.locator("#grid .kv-label")
    assert labels.all_text_contents() == ["kv 0", "kv 1"]
    assert [label.evaluate("e => e.style.gridColumn") for label in labels.all()] == ["span 2", "span 2"]
    kv = [label.bounding_box() for label in labels.all()]
    thumbs = [thumb(page, 0, h).bounding_box() for h in range(4)]
    for group, (left, right) in enumerate([(0, 1), (2, 3)]):
        assert kv[group]["x"] <= thumbs[left]["x"]
        assert thumbs[right]["x"] + thumbs[right]["width"] <= kv[group]["x"] + kv[group]["width"] + 1
    # ...and a wider gap between the groups than between the heads of one group.
    within = thumbs[1]["x"] - (thumbs[0]["x"] + thumbs[0]["width"])
    between = thumbs[2]["x"] - (thumbs[1]["x"] + thumbs[1]["width"])
    assert between >= within + 6
    # The row of each layer still holds its 4 heads and the mean on one line.
    assert len({thumb(page, 1, h).bounding_box()["y"] for h in (0, 3, "mean")}) == 1

    # Every head's name carries its group: thumbnails and the detail title.
    assert thumb(page, 2, 3).get_attribute("title").startswith("L2 H3 · kv 1")
    thumb(page, 2, 1).click()
    assert page.locator("#detail-title").text_content() == "Head detail: L2 H1 · kv 0"
    assert "(2 KV heads)" in page.locator("#status").text_content()

    # The statistics: a kv group column, sortable like the others; similar heads named with their group.
    page.wait_for_function("() => ['ready', 'error'].includes(document.body.dataset.insight)")
    assert page.evaluate("document.body.dataset.insight") == "ready"
    header = page.locator("#stats-table thead th").all_text_contents()
    assert header[:4] == ["Layer", "Head", "KV group", "Role"]
    page.click('#stats-table th button[data-key="kv group"]')
    assert page.get_attribute('#stats-table th[data-key="kv group"]', "aria-sort") == "ascending"
    rows = page.evaluate(
        "[...document.querySelectorAll('#stats-table tbody tr')]"
        ".map((r) => [...r.cells].slice(0, 3).map((c) => Number(c.textContent)))"
    )
    assert [group for _, _, group in rows] == sorted(head // 2 for _, head, _ in rows)
    assert all(group == head // 2 for _, head, group in rows)
    chips = page.locator("#similar button.chip").all_text_contents()
    assert chips and all(" · kv " in chip for chip in chips)

    # Nothing of this for a model without grouping (the default MiniLM: 12 heads, 12 KV heads).
    session.run(PROMPT, model="all-MiniLM-L6-v2")
    assert page.locator("#grid .kv-label").count() == 0
    assert thumb(page, 0, 1).get_attribute("title").startswith("layer 0, head 1")
    page.wait_for_function("() => ['ready', 'error'].includes(document.body.dataset.insight)")
    assert "kv group" not in page.locator("#stats-table thead").text_content()


def test_gemma3_shows_its_kv_groups_and_its_local_layers_windows(session: Any) -> None:
    """Gemma 3 (tests/checkpoints.py: local layers 0 and 2 around a global layer 1, a window of
    SLIDING_WINDOW keys) on the page as Gemma 2 is: its KV groups bracketed, and a local layer's head
    drawn with the keys its window hides as zeros where the global layer's reach back to the first."""
    page = session.open()
    session.run(PROMPT, model=TINY_GEMMA3)
    assert page.locator("#grid .kv-label").all_text_contents() == ["kv 0", "kv 1"]
    assert thumb(page, 0, 3).get_attribute("title").startswith("L0 H3 · kv 1")
    figures = {}
    for layer in (0, 1):
        page = open_head(session, TINY_GEMMA3, layer, 0)
        exact = api(session.base, "/api/attention/head", text=PROMPT, model=TINY_GEMMA3, layer=layer, head=0)
        assert page.evaluate(FIGURE_JS)["z"] == causal(exact["attention"])
        figures[layer] = exact["attention"]
    n = len(figures[0])
    assert n > SLIDING_WINDOW  # some keys lie outside the window of the last query
    last = n - 1
    hidden = range(last - SLIDING_WINDOW + 1)  # keys j <= i - W
    assert all(figures[0][last][j] == 0.0 for j in hidden)
    assert all(figures[1][last][j] > 0.0 for j in hidden)


def test_hide_first_token_renormalises_the_rows(session: Any, grouped_model: str) -> None:
    layer, head = 1, 2
    page = open_head(session, grouped_model, layer, head)
    exact = api(session.base, "/api/attention/head", text=PROMPT, model=grouped_model, layer=layer, head=head)
    assert page.evaluate(FIGURE_JS)["z"] == causal(exact["attention"])  # the toggle starts off

    page.check("#hide-first")
    page.wait_for_function(
        "() => document.querySelector('#head-detail').data[1].colorbar.title.text.includes('renormalised')"
    )
    figure = page.evaluate(FIGURE_JS)
    assert "renormalised without the first token" in figure["colorbar"]
    expected = renormalised(exact["attention"])
    n = len(expected)
    for i in range(n):
        assert figure["z"][i][0] is None  # the first key column is dropped
        for j in range(1, n):
            want, got = expected[i][j], figure["z"][i][j]
            if want is None:
                assert got is None, (i, j)
            else:
                assert abs(got - want) <= (n + 1) * EPS64, (i, j, got, want)
    assert parse_qs(urlparse(page.url).query)["nofirst"] == ["1"]
    assert "First token hidden" in page.locator("#detail-caption").text_content()

    # The hover shows the renormalised value and says so.
    i = n - 1
    j = max(range(1, n), key=lambda k: expected[i][k] or 0.0)
    page.locator("#head-detail").scroll_into_view_if_needed()
    x, y = session.cell_center(i, j)
    page.mouse.move(x, y)
    hover = page.locator("#head-detail .hoverlayer .hovertext")
    hover.wait_for()
    text = hover.text_content()
    assert f": {expected[i][j]:.3f}" in text and "renormalised without the first token" in text

    # Off again: the model's own values, unchanged.
    page.uncheck("#hide-first")
    page.wait_for_function(
        "() => !document.querySelector('#head-detail').data[1].colorbar.title.text.includes('renormalised')"
    )
    assert page.evaluate(FIGURE_JS)["z"] == causal(exact["attention"])


def test_continuation_marks_written_tokens_and_shows_what_each_step_looked_at(
    session: Any, grouped_model: str
) -> None:
    layer, head = 0, 3
    reference = api(session.base, "/api/attention", text=PROMPT, model=grouped_model, max_new_tokens=WRITE)
    n, generated, tokens = reference["n"], reference["generated"], reference["tokens"]
    assert generated == WRITE  # the tiny model writes no end-of-sequence token this early
    prompt = n - generated

    # The control is offered for a causal model only (the API call above loaded the Llama: its kind is known).
    page = session.open()
    assert not page.locator("#new-tokens").is_visible()  # the default model is an encoder
    page.select_option("#model", grouped_model)
    assert page.locator("#new-tokens").is_visible()
    bodies: list[dict[str, Any]] = []
    page.on("request", lambda r: bodies.append(json.loads(r.post_data)) if r.post_data else None)
    page.fill("#new-tokens", str(WRITE))
    session.run(PROMPT, model=grouped_model)
    thumb(page, layer, head).click()
    page.wait_for_selector("#head-detail[data-exact=true]")

    assert page.locator("#status").text_content().startswith(f"{prompt} prompt tokens + {WRITE} written")
    assert parse_qs(urlparse(page.url).query)["continue"] == [str(WRITE)]
    # Every request of the run asks for the same continuation.
    assert len(bodies) >= 3 and all(body.get("max_new_tokens") == WRITE for body in bodies), bodies

    # The written tokens are marked on both axes (✎) and by a divider and a band beside each axis.
    figure = page.evaluate(FIGURE_JS)
    for ticks in (figure["yticktext"], figure["xticktext"]):
        assert [t.startswith("✎ ") for t in ticks] == [i >= prompt for i in range(n)]
    shapes = {s["name"]: s for s in figure["shapes"]}
    assert shapes["written-band-x"]["x0"] == shapes["written-x"]["x0"] == prompt - 0.5
    assert shapes["written-band-y"]["y0"] == shapes["written-y"]["y0"] == prompt - 0.5

    # The panel: one button per written token, reachable by keyboard; Enter on the second shows the
    # row of the step that wrote it (row i - 1) over the prompt, top tokens with their weights as text.
    exact = api(
        session.base,
        "/api/attention/head",
        text=PROMPT,
        model=grouped_model,
        layer=layer,
        head=head,
        max_new_tokens=WRITE,
    )["attention"]
    buttons = page.locator("#written-tokens button")
    assert buttons.count() == WRITE
    buttons.nth(1).focus()
    page.keyboard.press("Enter")
    chosen = prompt + 1
    assert page.get_attribute("#written", "data-chosen") == str(chosen)
    assert buttons.nth(1).get_attribute("aria-pressed") == "true"

    def shown_top() -> list[list[Any]]:
        return page.evaluate(
            "[...document.querySelectorAll('#written-top li')]"
            ".map((li) => [Number(li.dataset.index), li.querySelector('.num').textContent])"
        )

    def api_top(i: int) -> list[list[Any]]:
        row = exact[i - 1]
        best = sorted(range(prompt), key=lambda j: (-row[j], j))[:5]
        return [[j, f"{row[j]:.3f}"] for j in best]

    assert shown_top() == api_top(chosen)
    shaded = page.locator("#written-prompt span")
    assert shaded.count() == prompt
    # The token as the page spells it: the byte-level space "Ġ" shown as "␣".
    spelled = tokens[2].replace("Ġ", "␣")
    assert shaded.nth(2).get_attribute("title") == f"{spelled}: {exact[chosen - 1][2]:.3f}"

    # Clicking a written token's row in the heatmap shows that one.
    last = n - 1
    page.locator("#head-detail").scroll_into_view_if_needed()
    x, y = session.cell_center(last, 0)
    page.mouse.click(x, y)
    page.wait_for_function(f"() => document.querySelector('#written').dataset.chosen === '{last}'")
    assert shown_top() == api_top(last)
    # ...as does a click on its row label, left of the plot.
    x, y = session.cell_center(prompt, 0)
    page.mouse.click(x - 40, y)
    page.wait_for_function(f"() => document.querySelector('#written').dataset.chosen === '{prompt}'")
    assert shown_top() == api_top(prompt)


def test_chat_template_is_a_visible_choice_and_shows_its_tokens(session: Any, grouped_model: str) -> None:
    page = session.open()
    assert not page.locator("#chat-field").is_visible()  # the default model has no chat template
    session.run(PROMPT, model=grouped_model)  # the tiny Llama has one: the choice appears, unticked
    assert page.locator("#chat-field").is_visible() and not page.locator("#chat").is_checked()
    page.check("#chat")
    session.run(PROMPT, model=grouped_model)
    templated = api(session.base, "/api/attention", text=PROMPT, model=grouped_model, chat=True)
    figure = page.evaluate(FIGURE_JS)
    assert len(figure["xticktext"]) == templated["n"] > len(PROMPT.split())  # the template's tokens, drawn
    assert parse_qs(urlparse(page.url).query).get("chat") == ["1"]  # and kept in the link
