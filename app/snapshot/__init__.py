"""One builder of a self-contained file from a result, and what shows it: the page's "Save as HTML", the
CLI and notebooks.

- ``bundle``: the page's ES modules linked into one classic script, at run time (no Node at install).

A `View` (notebook.py) shows a snapshot document in a notebook cell, interactive, with the still image
that `snapshot_png(result)` (png.py) draws behind it, for the front ends where scripts do not run.

May import: mha (the names it exports), torch, PIL, app.page; IPython only where a notebook runs it.
Never app.routes.
"""

from app.snapshot.bundle import Bundle, BundleError, bundle, link
from app.snapshot.notebook import View
from app.snapshot.png import snapshot_png

__all__ = ["Bundle", "BundleError", "View", "bundle", "link", "snapshot_png"]
