"""One builder of a self-contained file from a result, and what shows it: the page's "Save as HTML", the
CLI and notebooks (docs/snapshots.md).

- ``html``: ``snapshot_html(result)`` and ``save_html(result, path)``: any `attend` result as one offline
  `.html` file running the page's own modules, its template in snapshot mode, its CSP and byte budget
  (``build`` says what it holds; ``build_view`` makes the same of the service's cached view, for a route).
- ``bundle``: the page's ES modules linked into one classic script, at run time (no Node at install).
- ``answers``: the answers the page asks for, made by the service's own builders from one result.
- ``cli``: `headscope snapshot`, with no server.
- ``notebook``: ``show(result)``, the same view in a notebook cell (docs/notebooks.md): its `View` is the
  document in a sandboxed iframe, with the still image ``png`` draws (``snapshot_png(result)``) behind it
  for the front ends where scripts do not run.
- ``figure``: ``figure(result, layer, head)``, one head as a plotly Figure for Python users, drawn as the
  page's head detail draws it (``heatmap_figure``).
- ``looks``: the page's colour scale (read from colors.js itself), its LUT and token spelling, for what
  Python draws (the figure and the still image), so neither keeps a copy.

May import: mha (the names it exports), torch, PIL, app.page, app.package_data, app.compact, app.errors,
app.schemas, app.settings and app.service; IPython only where a notebook runs it, plotly only where a
figure is drawn. Never app.routes.
"""

from app.snapshot.bundle import Bundle, BundleError, bundle, link
from app.snapshot.figure import figure
from app.snapshot.html import (
    BYTES_PER_VALUE,
    DEFAULT_MAX_BYTES,
    Asked,
    Snapshot,
    asset_sizes,
    build,
    build_view,
    save_html,
    snapshot_html,
)
from app.snapshot.notebook import View, show
from app.snapshot.png import snapshot_png

__all__ = [
    "BYTES_PER_VALUE",
    "DEFAULT_MAX_BYTES",
    "Asked",
    "Bundle",
    "BundleError",
    "Snapshot",
    "View",
    "asset_sizes",
    "build",
    "build_view",
    "bundle",
    "figure",
    "link",
    "save_html",
    "snapshot_html",
    "show",
    "snapshot_png",
]
