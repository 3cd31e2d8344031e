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

May import: app.snapshot's builder and png, mha (the names it exports), IPython (only where it runs).
"""

from __future__ import annotations

import base64
import html
from collections.abc import Container
from pathlib import Path
from typing import Any

__all__ = ["View", "frame_height"]

# The iframe's height: a scroll inside it can never resize it from outside (its origin is opaque), so it is
# fixed when the view is made, from the model view's rows, and `height=` sets it outright.
FRAME_BASE_PX = 560  # the page's header, the head detail and the token lines, with no grid row
FRAME_ROW_PX = 46  # one layer's row of thumbnails
FRAME_MIN_PX = 640
FRAME_MAX_PX = 1400  # a taller model view scrolls inside the frame, as the page's grid box does
# Hides the still image wherever the iframe was kept: a sanitizer that drops <iframe> drops <style> too.
STILL_RULE = ".headscope-view > iframe ~ .headscope-still { display: none; }"
SANDBOX = "allow-scripts allow-downloads"  # scripts run; no same-origin, no popups, no top navigation


def frame_height(layers: int) -> int:
    """The iframe's height in CSS px for a model view of `layers` rows."""
    return max(FRAME_MIN_PX, min(FRAME_MAX_PX, FRAME_BASE_PX + FRAME_ROW_PX * layers))


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
