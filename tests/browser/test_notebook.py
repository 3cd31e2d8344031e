"""show() in real notebooks, driven in Chromium: JupyterLab 4 and Notebook 7 on one real Jupyter server
(benchmarks/jupyter.py), one kernel each, running a notebook whose cells load the embedded MiniLM through
mha's public API and show two results.

Each output draws the grid, opens a head on a click and reads a value on hover, and the two views of one
notebook never touch each other. The notebook JupyterLab saved keeps its views: exported by nbconvert to
HTML, opened from file:// with every request blocked, both work. The same notebook changed outside
Jupyter is untrusted: JupyterLab then sanitizes the outputs, and each shows its still image instead.
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tolerances import FORWARD, quant8

from benchmarks.jupyter import Jupyter, jupyter, output_frames, run_all, write_notebook
from mha import AttentionModel

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(
        not all(importlib.util.find_spec(m) for m in ("jupyterlab", "notebook", "nbconvert", "ipykernel")),
        reason="the dev extra's Jupyter packages are not installed",
    ),
]

FIRST = "The cat sat on the mat because it was tired."
SECOND = "A second view of another text."
PAIR = "Its own pair."
CELLS = (
    'from app.snapshot import show\nfrom mha import load_pretrained\n\nmodel = load_pretrained(device="cpu")',
    f"show(model.attend({FIRST!r}))",
    f"show(model.attend({SECOND!r}, {PAIR!r}), model=model, selected=(2, 5))",
)
LAYERS, HEADS = 6, 12  # MiniLM
VIEWPORT = {"width": 1400, "height": 1000}
# A head's value in the detail against the model's in this process: the view's 8-bit values (or exact
# float32 ones) of the kernel's forward, which may sum in another order than ours.
VALUE = quant8() + FORWARD
HOVER = re.compile(r"^(?P<query>.+) → (?P<key>.+): (?P<value>\d\.\d{3})$")

FIGURE_JS = """() => {
  const gd = document.querySelector('#head-detail');
  const heatmap = gd.data.find((t) => t.type === 'heatmap');
  const box = gd.getBoundingClientRect();
  return {z: heatmap.z, ticktext: gd.layout.xaxis.ticktext, box: [box.width, box.height]};
}"""
# The framed layout (headscope.css): the grid and the head detail both within the frame as it opens.
IN_SIGHT_JS = """() => {
  const fits = (selector) => document.querySelector(selector).getBoundingClientRect().bottom <= innerHeight;
  return {framed: document.body.dataset.framed, grid: fits('.grid-panel'), detail: fits('.detail-panel')};
}"""
# The centre of cell (query i, key j) relative to the figure's own box (Playwright adds the frames' offsets).
CELL_JS = """([i, j]) => {
  const gd = document.querySelector('#head-detail');
  const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
  return [xa._offset + xa.l2p(j), ya._offset + ya.l2p(i)];
}"""


class View:
    """One output's view: the frame its iframe holds."""

    def __init__(self, page: Any, frame: Any) -> None:
        self.page = page
        self.frame = frame

    def wait_drawn(self) -> None:
        self.frame.wait_for_function("() => document.body.dataset.state === 'ready'", timeout=30_000)
        drawn = "document.querySelectorAll('#grid .thumb[data-drawn=true]').length"
        self.frame.wait_for_function(f"() => {drawn} === {LAYERS * (HEADS + 1)}", timeout=30_000)

    def selected(self) -> tuple[int, int]:
        layer, head = self.frame.locator("#grid .thumb.selected").evaluate(
            "t => [t.dataset.layer, t.dataset.head]"
        )
        return int(layer), int(head)

    def open(self, layer: int, head: int) -> None:
        self.frame.locator(f'#grid .thumb[data-layer="{layer}"][data-head="{head}"]').click()
        title = "document.querySelector('#detail-title').textContent"
        self.frame.wait_for_function(f"() => {title}.includes('layer {layer}, head {head}')")
        # Settled: the caption's "exact values on the way" gives way to what the file carries, a line
        # longer, which moves the figure down (a hover aimed before would land a row too high).
        caption = "document.querySelector('#detail-caption').textContent"
        self.frame.wait_for_function(f"() => !{caption}.includes('on the way')")

    def hover(self, i: int, j: int) -> str:
        """The detail's hover label over cell (query i, key j), drawn afresh."""
        self.page.mouse.move(0, 0)
        x, y = self.frame.evaluate(CELL_JS, [i, j])
        self.frame.locator("#head-detail").hover(position={"x": x, "y": y})
        label = self.frame.locator("#head-detail .hoverlayer .hovertext")
        label.wait_for()
        return str(label.text_content())

    def figure(self) -> dict[str, Any]:
        return dict(self.frame.evaluate(FIGURE_JS))


def views(page: Any, count: int) -> list[View]:
    """The notebook's `count` views, each drawn, once every cell has run."""
    out = [View(page, frame) for frame in output_frames(page, count)]
    for view in out:
        view.wait_drawn()
    return out


def check_views(first: View, second: View, minilm: AttentionModel) -> None:
    """Both draw, the grid and the detail in sight where the frame opens; a click opens a head in its own
    view only; hover reads the model's value."""
    for view in (first, second):
        assert view.frame.evaluate(IN_SIGHT_JS) == {"framed": "true", "grid": True, "detail": True}
    assert first.selected() == (0, 0) and second.selected() == (2, 5)  # show(..., selected=(2, 5))
    reference = minilm.attend(FIRST)
    first.open(1, 3)
    assert second.selected() == (2, 5)  # the other view did not move
    figure = first.figure()
    assert [t.replace("&amp;", "&") for t in figure["ticktext"]] == reference.tokens
    values = reference.attentions[1, 3]
    n = len(reference.tokens)
    worst = max(abs(figure["z"][i][j] - float(values[i, j])) for i in range(n) for j in range(n))
    assert worst <= VALUE
    i, j = reference.tokens.index("cat"), reference.tokens.index("mat")
    label = HOVER.match(first.hover(i, j))
    assert label is not None
    assert (label["query"], label["key"]) == ("cat", "mat")
    assert label["value"] == f"{figure['z'][i][j]:.3f}"
    second.open(4, 0)
    assert first.selected() == (1, 3)
    assert "[SEP]" in second.figure()["ticktext"][1:-1]  # its own text, a pair


@dataclass
class Fronts:
    lab: Any  # JupyterLab's page, its notebook run (both views drawn) and saved
    saved: Path  # that notebook as JupyterLab saved it, outputs included
    notebook7: Any  # Notebook 7's page, its notebook run: its kernel works while JupyterLab is checked


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, artifacts: Path) -> Iterator[Jupyter]:
    root = tmp_path_factory.mktemp("notebooks")
    write_notebook(root / "lab.ipynb", CELLS)
    write_notebook(root / "nb7.ipynb", CELLS)
    with jupyter(root, log=artifacts / "jupyter-server.log") as running:
        yield running


@pytest.fixture(scope="module")
def fronts(server: Jupyter, browser: Any, artifacts: Path) -> Iterator[Fronts]:
    contexts = [browser.new_context(viewport=VIEWPORT) for _ in range(2)]
    lab, notebook7 = (context.new_page() for context in contexts)
    # Both load at once: one page's scripts compile while the other waits on the server, or its kernel.
    lab.goto(server.url("lab/tree/lab.ipynb"), wait_until="commit")
    notebook7.goto(server.url("notebooks/nb7.ipynb"), wait_until="commit")
    run_all(lab)
    run_all(notebook7)
    views(lab, 2)
    lab.screenshot(path=str(artifacts / "notebook-lab.png"))
    lab.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    lab.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty")
    yield Fronts(lab, server.root / "lab.ipynb", notebook7)
    for context in contexts:
        context.close()


def test_jupyterlab_views_draw_open_heads_and_hover_each_on_their_own(
    fronts: Fronts, minilm: AttentionModel
) -> None:
    first, second = views(fronts.lab, 2)
    check_views(first, second, minilm)
    # A show() as a cell's last line is displayed once, not once more as the cell's value.
    notebook = json.loads(fronts.saved.read_text(encoding="utf-8"))
    outputs = [[o["output_type"] for o in cell["outputs"]] for cell in notebook["cells"][1:]]
    assert outputs == [["display_data"], ["display_data"]]
    assert set(notebook["cells"][1]["outputs"][0]["data"]) == {"text/html", "image/png", "text/plain"}


def test_the_saved_notebook_as_html_works_offline(
    fronts: Fronts, browser: Any, tmp_path: Path, minilm: AttentionModel
) -> None:
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_filename(
        str(fronts.saved)
    )  # `jupyter nbconvert --to html`, its lab template
    exported = tmp_path / "notebook.html"
    exported.write_text(body, encoding="utf-8")
    context = browser.new_context(viewport=VIEWPORT)
    # Offline: the file itself loads, every other request is refused (the template's own require.js and
    # MathJax come from a CDN: refused, and the views must not need them).
    context.route(
        "**/*", lambda route: route.continue_() if route.request.url == exported.as_uri() else route.abort()
    )
    page = context.new_page()
    requests: list[tuple[str, Any]] = []
    page.on("request", lambda request: requests.append((request.url, request.frame)))
    page.goto(exported.as_uri())
    first, second = views(page, 2)
    check_views(first, second, minilm)
    from_views = [url for url, frame in requests if frame in (first.frame, second.frame)]
    assert from_views == []  # the views asked for nothing at all
    context.close()


def test_a_notebook_changed_outside_jupyter_is_untrusted_and_shows_still_images(
    fronts: Fronts, artifacts: Path
) -> None:
    # Its signature no longer matches (the server signed what JupyterLab saved): JupyterLab sanitizes its
    # outputs, which drops the iframes and the <style> that hid the images behind them.
    notebook = json.loads(fronts.saved.read_text(encoding="utf-8"))
    notebook["cells"][0]["source"] += "\n# edited outside Jupyter"
    fronts.saved.write_text(json.dumps(notebook), encoding="utf-8")
    page = fronts.lab
    page.evaluate("async () => { await window.jupyterapp.shell.currentWidget.context.revert(); }")
    page.wait_for_function(
        "() => document.querySelectorAll('.jp-OutputArea-output iframe').length === 0"
        " && document.querySelectorAll('.jp-OutputArea-output img').length === 2"
    )
    images = page.locator(".jp-OutputArea-output img")
    for k in range(2):
        image = images.nth(k)
        image.scroll_into_view_if_needed()
        assert image.evaluate("img => img.complete && img.naturalWidth > 0")
        assert image.is_visible() and (image.bounding_box() or {}).get("width", 0) > 200
    assert page.locator(".jp-OutputArea-output", has_text="headscope view: ").count() == 2
    page.screenshot(path=str(artifacts / "notebook-untrusted.png"))


def test_notebook7_views_draw_open_heads_and_hover_each_on_their_own(
    fronts: Fronts, minilm: AttentionModel
) -> None:
    first, second = views(fronts.notebook7, 2)
    check_views(first, second, minilm)
