"""app.snapshot.notebook's View: the rich display a notebook renders (IPython's protocol), its HTML (an
iframe of the snapshot document, sandboxed, with the still image behind it) and how IPython shows it.

A small stand-in document plays the snapshot here: what is checked is what the View does with any
document; tests/browser/test_notebook.py runs the real one in JupyterLab, Notebook 7 and nbconvert's HTML.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest
from PIL import Image

from app.snapshot import snapshot_html
from app.snapshot.notebook import SANDBOX, View, frame_height, show
from mha import AttentionModel

# Quotes, ampersands, angle brackets and a closing tag: all must survive the srcdoc attribute.
DOCUMENT = (
    '<!doctype html><html><head><meta charset="utf-8"><title>a & "b" \'c\'</title></head>'
    "<body><p id=\"x\">1 < 2 && 3 > 2</p><script>document.title = '</iframe>';</script></body></html>"
)
PNG = base64.b64decode(  # a 1 x 1 PNG: View carries whatever png.py drew
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg=="
)


class Elements(HTMLParser):
    """Every start tag with its attributes (entity references resolved, as a browser resolves them)."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parsed(markup: str) -> Elements:
    elements = Elements()
    elements.feed(markup)
    elements.close()
    return elements


def view(
    document: str = DOCUMENT, *, label: str = "m · 3 tokens · 1 layers × 2 heads · layer 0, head 0"
) -> View:
    return View(document, png=PNG, height=700, label=label)


def test_the_mimebundle_carries_html_png_and_text() -> None:
    shown = view()
    bundle = shown._repr_mimebundle_()
    assert set(bundle) == {"text/html", "image/png", "text/plain"}
    assert base64.b64decode(bundle["image/png"]) == PNG
    assert bundle["text/html"] == shown._repr_html_()
    assert shown._repr_png_() == PNG
    assert "m · 3 tokens" in bundle["text/plain"]
    # A front end may ask for some types only, or leave some out.
    assert set(shown._repr_mimebundle_(include={"image/png", "text/plain"})) == {"image/png", "text/plain"}
    assert set(shown._repr_mimebundle_(exclude={"text/html"})) == {"image/png", "text/plain"}


def test_the_html_is_one_sandboxed_iframe_of_the_document_and_no_script() -> None:
    elements = parsed(view()._repr_html_())
    tags = [tag for tag, _ in elements.tags]
    assert tags == ["div", "style", "iframe", "div", "img", "p"]  # no <script> outside the iframe
    frame = dict(elements.tags)["iframe"]
    assert frame["sandbox"] == SANDBOX == "allow-scripts allow-downloads"  # no allow-same-origin
    assert frame["srcdoc"] == DOCUMENT  # escaped in the attribute, the same document once parsed
    assert "height: 700px" in (frame["style"] or "")
    image = dict(elements.tags)["img"]
    assert image["src"] == "data:image/png;base64," + base64.b64encode(PNG).decode()
    # The still image says what it is: the same line as text/plain.
    assert view().text() in "".join(elements.text)


def test_the_height_follows_the_layers_within_bounds() -> None:
    assert frame_height(1) == frame_height(6)  # the head detail's height: a short grid fits beside it
    assert frame_height(6) < frame_height(24) < frame_height(30)  # a taller grid sets it
    assert frame_height(200) == frame_height(400)  # up to a bound: a tall grid scrolls inside the frame
    with pytest.raises(ValueError, match=r"height \(0\)"):
        View(DOCUMENT, png=PNG, height=0, label="x")


def test_save_writes_the_document(tmp_path: Path) -> None:
    path = view().save(tmp_path / "view.html")
    assert path.read_text(encoding="utf-8") == DOCUMENT


@pytest.fixture
def shell() -> Iterator[object]:
    """A real IPython shell (no kernel): its display publisher and displayhook are IPython's own."""
    from IPython.core.interactiveshell import InteractiveShell

    instance = InteractiveShell.instance()
    yield instance
    InteractiveShell.clear_instance()


def run(shell: object, code: str) -> list[dict[str, str]]:
    """The display data a cell of `code` produced, each output's mimebundle."""
    from IPython.utils.capture import capture_output

    with capture_output() as captured:
        shell.run_cell(code, store_history=True)  # type: ignore[attr-defined]
    return [output.data for output in captured.outputs]


def test_shown_displays_once_as_a_cells_last_line_and_again_later(shell: object) -> None:
    first, second = view(label="first"), view(label="second")
    shell.user_ns.update(first=first, second=second)  # type: ignore[attr-defined]
    outputs = run(shell, "first.shown()")  # displayed by shown(), not again as the cell's value
    assert [set(data) for data in outputs] == [{"text/html", "image/png", "text/plain"}]
    assert "first" in outputs[0]["text/plain"]
    assert len(run(shell, "first")) == 1  # a later cell shows it again
    assert len(run(shell, "v = first.shown()")) == 1
    loop = run(shell, "for v in (first, second):\n    v.shown()")
    assert ["first" in data["text/plain"] for data in loop] == [True, False]
    assert len(run(shell, "second.shown()\nfirst")) == 2  # two views, one cell


def test_show_displays_the_snapshot_of_a_result_once(shell: object, minilm: AttentionModel) -> None:
    result = minilm.attend("The cat sat on the mat.")
    shell.user_ns.update(show=show, result=result, model=minilm)  # type: ignore[attr-defined]
    outputs = run(shell, "view = show(result, model=model, selected=(2, 5))")
    assert len(outputs) == 1
    shown: View = shell.user_ns["view"]  # type: ignore[attr-defined]
    assert outputs[0] == shown._repr_mimebundle_()
    # The document is the snapshot file of the same run: its own CSP, no network.
    assert shown.document == snapshot_html(result, model=minilm, selected=(2, 5))
    assert "connect-src &#39;none&#39;" in shown.document  # in the CSP meta's attribute
    assert shown.height == frame_height(6)
    assert shown.label == f"all-MiniLM-L6-v2 · {result.n} tokens · 6 layers × 12 heads · layer 2, head 5"
    with Image.open(io.BytesIO(shown.png)) as still:
        assert still.format == "PNG" and still.width > 600
    with pytest.raises(ValueError, match=r"selected \(6, 0\) is outside"):
        show(result, selected=(6, 0))
