"""The Corpus view in Chromium, on runs written to the contract by tests/corpus_fixture.py: pick a run, the
grid coloured by a statistic's corpus mean, a head's distribution and examples, and one click from an
example to the normal view of that text with that head open."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from corpus_fixture import random_values, sentences, write_demo_runs, write_run

from benchmarks.launch import serve
from mha.corpus import run as corpus_run
from mha.corpus.aggregate import SNIPPET_CHARS
from tests.browser.test_phone import EDGE_PX, OVERFLOW_JS

pytestmark = pytest.mark.browser

LAYERS, HEADS, TEXTS = 6, 12, 30  # the embedded default, all-MiniLM-L6-v2: its texts open in the normal view


REAL_TEXTS = [
    "The cat sat on the mat.",
    "A quick brown fox jumps over the lazy dog, twice.",
    "",  # a bad record: errors.jsonl, not the page
    "Attention heads look at tokens; some look at the previous one.",
    "Paris is the capital of France.",
    'She said: "heads, not tails!"',
    "Short.",
]


LONG_TEXT = " ".join(f"word{k}" for k in range(150))  # ~1,000 characters


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    runs = write_demo_runs(tmp_path_factory.mktemp("runs"), layers=LAYERS, heads=HEADS, texts=TEXTS, seed=7)
    # Beside the fixture's numbers, a run the job itself made, on the model the server serves.
    source = tmp_path_factory.mktemp("input") / "texts.txt"
    source.write_text("\n".join(REAL_TEXTS) + "\n", encoding="utf-8")
    corpus_run(source, None, runs["root"] / "minilm-real", batch=4, shard_size=4, device="cpu")
    # A text longer than examples.parquet's snippets, the highest entropy of L0 H0.
    records = sentences(6)
    records[2] = {**records[2], "text": LONG_TEXT, "text_pair": None}
    values = random_values(6, LAYERS, HEADS, seed=9)
    values["entropy"][:, 0, 0] = [0.5, 0.6, 2.9, 0.7, 0.8, 0.9]
    write_run(runs["root"] / "snippets-demo", records, values)
    return runs


@pytest.fixture(scope="module")
def server(corpus: dict[str, Any], artifacts: Path) -> Iterator[str]:
    """This module's own server: the embedded default model and the runs folder, nothing else."""
    env = {
        "HEADSCOPE_RUNS_DIR": str(corpus["root"]),
        "HEADSCOPE_DEVICE": "cpu",
        "HEADSCOPE_THREADS": "1",
        "HEADSCOPE_LOG_LEVEL": "warning",
    }
    with serve(env, log=artifacts / "corpus-server.log", start_s=180) as running:
        yield running.base


def wait_corpus(page: Any, state: str = "ready") -> None:
    page.wait_for_function(
        "() => ['ready', 'empty', 'error'].includes(document.body.dataset.state)", timeout=30_000
    )
    found = page.evaluate("document.body.dataset.state")
    assert found == state, f"corpus view ended {found!r}: {page.locator('#error').text_content()!r}"


def plot_values(page: Any) -> list[list[float]]:
    return page.evaluate("() => document.querySelector('#corpus-plot').data.map((t) => Array.from(t.y))")


def test_a_run_from_grid_to_distribution_to_the_text(session: Any, corpus: dict[str, Any]) -> None:
    values, texts = corpus["values"], corpus["texts"]
    page = session.open("?view=corpus&stat=previous")  # the main page's link form leads here
    wait_corpus(page)
    assert page.url.startswith(f"{session.base}/corpus?")
    assert page.input_value("#corpus-run") == "minilm-demo" and page.input_value("#corpus-stat") == "previous"

    # The grid: each cell is its head's corpus mean of the statistic, as per_head holds it.
    for stat in ("previous", "entropy"):
        page.select_option("#corpus-stat", stat)
        wait_corpus(page)
        cell = page.locator('.corpus-cell[data-layer="2"][data-head="3"]')
        mean = values[stat][:, 2, 3].mean()  # what the fixture wrote as <stat>_mean
        assert float(cell.get_attribute("data-mean")) == mean  # exact: JSON carries a float64 round trip
        assert cell.text_content() == f"{mean:.3f}"
        lo = min(
            float(v) for v in page.eval_on_selector_all(".corpus-cell", "cs => cs.map(c => c.dataset.mean)")
        )
        # Each head's mean as the fixture took it (one column at a time: mean(axis=0) sums in another order).
        assert lo == min(
            values[stat][:, layer, head].mean() for layer in range(LAYERS) for head in range(HEADS)
        )
    colours = page.eval_on_selector_all(".corpus-cell", "cs => new Set(cs.map(c => c.style.background)).size")
    assert colours > LAYERS * HEADS // 2  # coloured by value, not one fill

    # A click: that head's per-text values in the distribution, and the view in the URL.
    page.click('.corpus-cell[data-layer="2"][data-head="3"]')
    wait_corpus(page)
    assert plot_values(page) == [values["entropy"][:, 2, 3].tolist()]
    assert "layer=2&head=3" in page.url and "stat=entropy" in page.url
    assert page.locator("#corpus-head-title").text_content().startswith("Layer 2, head 3")
    summary = page.locator("#corpus-head-summary").text_content()
    assert f"mean {values['entropy'][:, 2, 3].mean():.3f}" in summary and f"{TEXTS} texts. Role: " in summary

    # Keyboard: the selected cell is the grid's one tab stop; an arrow moves to the next head.
    page.focus('.corpus-cell[tabindex="0"]')
    page.keyboard.press("ArrowRight")
    wait_corpus(page)
    assert page.evaluate("document.activeElement.dataset.head") == "4"
    column = values["entropy"][:, 2, 4]
    assert plot_values(page) == [column.tolist()]

    # The layer side by side, as violins.
    page.check("#corpus-all")
    page.select_option("#corpus-plot-kind", "violin")
    wait_corpus(page)
    assert plot_values(page) == [values["entropy"][:, 2, h].tolist() for h in range(HEADS)]
    assert page.evaluate("document.querySelector('#corpus-plot').data[0].type") == "violin"
    page.uncheck("#corpus-all")
    wait_corpus(page)

    # The examples: the highest text first; one click opens it in the normal view with that head.
    top = texts[int(np.argmax(column))]
    first = page.locator("#corpus-top li").first
    assert first.get_attribute("data-line") == str(top["line"])
    link = first.locator("a")
    assert link.text_content().startswith(top["text"])
    link.click()
    assert_normal_view(session, top, "2", "4")


def assert_normal_view(session: Any, record: dict[str, Any], layer: str, head: str) -> None:
    """The page went to the normal view of `record`'s text and pair with (layer, head) open."""
    page = session.page
    page.wait_for_url(f"{session.base}/?*")
    session.wait_ready(timeout_ms=60_000)
    assert page.input_value("#text") == record["text"]
    assert page.input_value("#text-pair") == (record["text_pair"] or "")
    selected = page.locator(".thumb.selected")
    assert (selected.get_attribute("data-layer"), selected.get_attribute("data-head")) == (layer, head)


# The centre of the topmost drawn point of the plot (the highest value: y grows downwards on screen).
TOP_POINT_JS = """() => {
  const boxes = [...document.querySelectorAll('#corpus-plot .point')].map((p) => p.getBoundingClientRect());
  const top = boxes.reduce((a, b) => (b.top < a.top ? b : a));
  return { x: top.left + top.width / 2, y: top.top + top.height / 2, drawn: boxes.length };
}"""


def test_a_point_of_the_distribution_opens_its_text(session: Any, corpus: dict[str, Any]) -> None:
    values, texts = corpus["values"], corpus["texts"]
    page = session.open("corpus?run=minilm-demo&stat=entropy&layer=3&head=5")
    wait_corpus(page)
    point = page.locator("#corpus-point")
    assert point.text_content().startswith("Each point is a text")
    top = texts[int(np.argmax(values["entropy"][:, 3, 5]))]
    at = page.evaluate(TOP_POINT_JS)
    assert at["drawn"] == TEXTS  # every text a point

    # Hovered: its id, line, value and text under the plot, the text fetched on demand.
    page.mouse.move(at["x"], at["y"])
    page.wait_for_function(
        "() => document.querySelector('#corpus-point').textContent.endsWith('click to open it')"
    )
    assert point.get_attribute("data-line") == str(top["line"])
    words = point.text_content()
    assert words.startswith(f"text {top['id']} (line {top['line']}) · L3 H5 · ") and top["text"] in words

    # Clicked: the normal view of that text and pair with that head, as an example's link opens it.
    page.mouse.click(at["x"], at["y"])
    assert_normal_view(session, top, "3", "5")


def test_a_run_made_by_the_job_shows_its_numbers(session: Any, corpus: dict[str, Any]) -> None:
    folder = corpus["root"] / "minilm-real"
    per_head = pq.read_table(folder / "per_head.parquet").to_pandas().set_index(["layer", "head"])
    per_text = pq.read_table(folder / "per_text.parquet").to_pandas()
    page = session.open("corpus?run=minilm-real&stat=previous&layer=1&head=2")
    wait_corpus(page)
    cell = page.locator('.corpus-cell[data-layer="1"][data-head="2"]')
    assert float(cell.get_attribute("data-mean")) == per_head.loc[(1, 2), "previous_mean"]  # float64 via JSON
    head = per_text[(per_text.layer == 1) & (per_text["head"] == 2)].sort_values("line")
    assert plot_values(page) == [head["previous"].tolist()]
    assert len(head) == len(REAL_TEXTS) - 1  # the blank line is an error, not a text

    # The highest text opens in the normal view with that head.
    top = head.loc[head["previous"].idxmax()]
    first = page.locator("#corpus-top li").first
    assert first.get_attribute("data-line") == str(top["line"])
    first.locator("a").click()
    page.wait_for_url(f"{session.base}/?*")
    session.wait_ready(timeout_ms=60_000)
    assert page.input_value("#text") == REAL_TEXTS[int(top["line"]) - 1]
    selected = page.locator(".thumb.selected")
    assert (selected.get_attribute("data-layer"), selected.get_attribute("data-head")) == ("1", "2")


def test_the_grid_colours_by_the_induction_score_and_lists_where_a_head_copies_most(
    session: Any, corpus: dict[str, Any]
) -> None:
    """The job's induction score in the colour-by menu; its means and distribution over only the texts
    that repeat a token (the others have none: null, not 0); the top texts, where the head copies most."""
    folder = corpus["root"] / "minilm-real"
    per_head = pq.read_table(folder / "per_head.parquet").to_pandas().set_index(["layer", "head"])
    per_text = pq.read_table(folder / "per_text.parquet").to_pandas()
    layer, head = per_head["induction_mean"].idxmax()  # the run's strongest induction head
    page = session.open(f"corpus?run=minilm-real&stat=previous&layer={layer}&head={head}")
    wait_corpus(page)
    assert "induction" in page.locator("#corpus-stat option").evaluate_all("(os) => os.map((o) => o.value)")
    page.select_option("#corpus-stat", "induction")
    wait_corpus(page)
    assert "stat=induction" in page.url
    cell = page.locator(f'.corpus-cell[data-layer="{layer}"][data-head="{head}"]')
    assert float(cell.get_attribute("data-mean")) == per_head.loc[(layer, head), "induction_mean"]
    mine = per_text[(per_text.layer == layer) & (per_text["head"] == head)].sort_values("line")
    present = mine.dropna(subset=["induction"])
    assert 0 < len(present) < len(mine)  # the corpus has texts with no repeated token
    assert plot_values(page) == [present["induction"].tolist()]
    count = per_head.loc[(layer, head), "induction_count"]
    assert f"{count} of {len(mine)} texts" in page.locator("#corpus-head-summary").text_content()
    ranked = present.sort_values(["induction", "line"], ascending=[False, True])
    top = page.locator("#corpus-top li")
    assert top.evaluate_all("(items) => items.map((li) => li.dataset.line)") == [
        str(line) for line in ranked["line"][:5]
    ]


def test_an_example_cut_short_shows_its_snippet_and_opens_its_whole_text(session: Any) -> None:
    page = session.open("corpus?run=snippets-demo&stat=entropy&layer=0&head=0")
    wait_corpus(page)
    first = page.locator("#corpus-top li").first
    assert (first.get_attribute("data-line"), first.get_attribute("data-cut")) == ("3", "true")
    link = first.locator("a")
    assert link.text_content() == f"{LONG_TEXT[:SNIPPET_CHARS]}…"
    assert link.get_attribute("href")  # the whole text, fetched by its line before the view said ready
    link.click()
    assert_normal_view(session, {"text": LONG_TEXT, "text_pair": None}, "0", "0")


def test_a_run_of_a_model_not_served_here_says_why_its_texts_do_not_open(session: Any) -> None:
    page = session.open("corpus?run=unserved&stat=max&layer=0&head=1")
    wait_corpus(page)
    note = page.locator("#corpus-link-note")
    assert note.is_visible() and "not-served-here" in note.text_content()
    link = page.locator("#corpus-top li a").first
    assert link.get_attribute("href") is None and link.get_attribute("aria-disabled") == "true"
    assert "not served here" in link.get_attribute("title")

    # A point says the same and stays on the page.
    at = page.evaluate(TOP_POINT_JS)
    page.mouse.click(at["x"], at["y"])
    page.wait_for_function("() => document.querySelector('#corpus-point').textContent.includes('not served')")
    assert page.url.startswith(f"{session.base}/corpus?")


def test_an_unknown_run_in_a_link_is_said_and_the_first_shown(session: Any) -> None:
    page = session.open("corpus?run=..%2Fsecret&layer=99&head=99")
    wait_corpus(page)
    notice = page.locator("#corpus-notice").text_content()
    assert (
        "no finished run “../secret”" in notice
        and "L99 H99 is beyond this run's 6 layers × 12 heads" in notice
    )
    assert page.input_value("#corpus-run") == "minilm-demo"
    assert "layer=5&head=11" in page.url  # clamped to the run's model


@pytest.mark.parametrize(
    ("listing", "words"),
    [
        (
            {"configured": False, "hint": "set HEADSCOPE_RUNS_DIR to a folder", "runs": []},
            "HEADSCOPE_RUNS_DIR",
        ),
        ({"configured": True, "hint": None, "runs": []}, "headscope corpus"),
    ],
)
def test_no_runs_folder_or_no_runs_is_a_clear_empty_state(
    session: Any, listing: dict[str, Any], words: str
) -> None:
    page = session.page
    page.route("**/api/corpus/runs", lambda route: route.fulfill(json=listing))
    session.open("corpus")
    wait_corpus(page, "empty")
    assert words in page.locator("#corpus-empty").text_content()
    assert page.locator("#corpus-workspace").is_hidden() and page.locator("#corpus-run").is_disabled()


def test_the_main_page_links_to_the_corpus_view(session: Any) -> None:
    page = session.open()
    page.click("nav >> text=Corpus runs")
    wait_corpus(page)
    assert (
        json.loads(page.evaluate("JSON.stringify(document.querySelector('#corpus-plot').data.length)")) == 1
    )


def test_on_a_phone_nothing_is_wider_than_the_screen(browser: Any, server: str) -> None:
    width = 390
    context = browser.new_context(viewport={"width": width, "height": 844}, is_mobile=True, has_touch=True)
    try:
        page = context.new_page()
        page.goto(f"{server}/corpus?stat=previous&layer=2&head=11")
        wait_corpus(page)
        found = page.evaluate(OVERFLOW_JS, [width, EDGE_PX])
        assert found["scrollWidth"] <= width and found["wide"] == [], found
        # A tap on a head brings its panel, under the grid here, into view.
        page.evaluate("window.scrollTo(0, 0)")
        page.tap('.corpus-cell[data-layer="1"][data-head="0"]')
        wait_corpus(page)
        page.wait_for_function(
            "() => document.querySelector('.corpus-head').getBoundingClientRect().top < 200"
        )
    finally:
        context.close()
