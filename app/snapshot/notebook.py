"""The interactive view in a notebook cell: `show(result)`, and the `View` it returns.

A View is one snapshot document (app.snapshot's builder: the page's own modules, its data inline, a CSP
of script hashes with connect-src 'none') shown in an `<iframe srcdoc sandbox="allow-scripts
allow-downloads">`: an opaque origin of its own, so views in one notebook never share ids, globals or
styles, and none can reach the notebook page. Nothing outside the iframe is a script. Beside it the same
HTML carries the still PNG of png.py, hidden by a `<style>` rule only while the iframe is there: a front
end that sanitizes untrusted HTML (JupyterLab's and Notebook 7's keep `<img>` with a data: source and
drop `<iframe>` and `<style>`) shows the image and its line of text instead. The mimebundle also carries
that PNG as image/png, for a front end that renders no HTML at all, and text/plain. docs/notebooks.md
says which front end picks what, citing their sources.

May import: app.snapshot.html and app.snapshot.png, mha (the names it exports), IPython (only where it runs).
"""

from __future__ import annotations

import base64
import html
from collections.abc import Container
from pathlib import Path
from typing import Any

from app.snapshot.html import DEFAULT_MAX_BYTES, build
from app.snapshot.png import draw, still_of
from mha import AttentionModel, AttentionResult

__all__ = ["View", "frame_height", "show"]

# The iframe's height: its document can never resize it from outside (its origin is opaque), so it is fixed
# when the view is made, to hold the framed layout's first part (headscope.css: the grid beside the head
# detail, its thumbnails 34 px below 1200 px wide, 42 above): the detail's ~840 px, or a taller grid's rows.
# Measured in Chromium at 1000 and 1300 px wide; `height=` sets it outright; what is below scrolls inside.
DETAIL_PX = 840  # the head detail's panel: its controls, a heatmap of 360-640 px, its labels and colour bar
GRID_TOP_PX = 110  # the model view's title, help line and head labels
ROW_PX = 45  # one layer's row of thumbnails in the framed layout, at its widest (42 px and the gap)
MARGIN_PX = 30
FRAME_MAX_PX = 1400  # a taller grid scrolls inside the frame, as the page's grid box does on a phone
# Hides the still image wherever the iframe was kept: a sanitizer that drops <iframe> drops <style> too.
STILL_RULE = ".headscope-view > iframe ~ .headscope-still { display: none; }"
SANDBOX = "allow-scripts allow-downloads"  # scripts run; no same-origin, no popups, no top navigation


def frame_height(layers: int) -> int:
    """The iframe's height in CSS px for a model view of `layers` rows."""
    return min(FRAME_MAX_PX, max(DETAIL_PX, GRID_TOP_PX + ROW_PX * layers) + MARGIN_PX)


class View:
    """One interactive view of a result, as a notebook shows it: `_repr_mimebundle_` gives text/html (the
    iframe, with the still image behind it), image/png (the still alone) and text/plain. `document` is
    the standalone HTML file of the same view, and `save(path)` writes it."""

    def __init__(self, document: str, *, png: bytes, height: int, label: str) -> None:
        if height <= 0:
            raise ValueError(f"height ({height}) must be a positive number of pixels")
        self.document = document
        self.png = png
        self.height = height
        self.label = label  # "all-MiniLM-L6-v2 · 12 tokens · 6 layers × 12 heads · layer 0, head 0"
        self._shown_at: int | None = None  # the execution count show() displayed it in

    def html(self) -> str:
        """The text/html output: the iframe, then the still image that a sanitizer leaves in its place."""
        title = html.escape(f"headscope view: {self.label}")
        still = base64.b64encode(self.png).decode("ascii")
        return (
            '<div class="headscope-view">'
            f"<style>{STILL_RULE}</style>"
            f'<iframe title="{title}" sandbox="{SANDBOX}" srcdoc="{html.escape(self.document, quote=True)}" '
            f'style="display: block; width: 100%; height: {self.height}px; border: 0;"></iframe>'
            '<div class="headscope-still">'
            f'<img src="data:image/png;base64,{still}" alt="{title}" style="max-width: 100%;">'
            f"<p>{html.escape(self.text())}</p>"
            "</div></div>"
        )

    def text(self) -> str:
        """The text/plain output, and the line under the still image."""
        return (
            f"headscope view: {self.label}. Interactive where the notebook's outputs may run scripts "
            "(a trusted notebook); a still image elsewhere. view.save('view.html') keeps it as a file."
        )

    def save(self, path: str | Path) -> Path:
        """Write the standalone HTML file of this view to `path`; returns the path."""
        out = Path(path)
        out.write_text(self.document, encoding="utf-8")
        return out

    def _repr_mimebundle_(
        self, include: Container[str] | None = None, exclude: Container[str] | None = None
    ) -> dict[str, str]:
        bundle = {
            "text/html": self.html(),
            "image/png": base64.b64encode(self.png).decode("ascii"),
            "text/plain": self.text(),
        }
        return {
            mime: data
            for mime, data in bundle.items()
            if (include is None or mime in include) and (exclude is None or mime not in exclude)
        }

    def _repr_html_(self) -> str:
        return self.html()

    def _repr_png_(self) -> bytes:
        return self.png

    def __repr__(self) -> str:
        return f"<View {self.label}>"

    def _ipython_display_(self) -> None:
        # show() has displayed this view already in this cell: as the cell's value it is not shown twice.
        shell = _shell()
        if shell is not None and self._shown_at == shell.execution_count:
            self._shown_at = None
            return
        _display(self)

    def shown(self) -> View:
        """Display this view now (where IPython runs) and return it: show()'s last step."""
        shell = _shell()
        if shell is not None:
            _display(self)
            self._shown_at = shell.execution_count
        return self


def show(
    result: AttentionResult,
    *,
    model: AttentionModel | None = None,
    name: str | None = None,
    selected: tuple[int, int] | None = None,
    height: int | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    text: str | None = None,
    chat: bool = False,
) -> View:
    """Show `result` (anything `attend` returns) in the notebook cell, interactive and offline, and
    return its View: as a cell's last line it shows once; in a loop, each call shows its own.

    `model`, `name`, `selected` (the (layer, head) it opens on, (0, 0) by default), `max_bytes`, `text`
    and `chat` are snapshot_html's; `height` is the output's height in CSS px (by default from the
    layer count: a frame cannot size itself to its content)."""
    opens = selected or (0, 0)
    snapshot = build(
        result, model=model, name=name, max_bytes=max_bytes, selected=opens, text=text, chat=chat
    )
    still = still_of(result, model=model, name=name)
    view = View(
        snapshot.html,
        png=draw(still, selected=opens),
        height=height or frame_height(int(still.maps.shape[0])),
        label=f"{still.title} · layer {opens[0]}, head {opens[1]}",
    )
    return view.shown()


def _shell() -> Any:
    """The running IPython shell, or None (plain Python, or IPython not installed)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def _display(view: View) -> None:
    from IPython.display import display

    display(view._repr_mimebundle_(), raw=True)
