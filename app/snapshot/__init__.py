"""One builder of a self-contained file from a result, and what shows it: the page's "Save as HTML", the
CLI and notebooks.

A `View` (notebook.py) shows a snapshot document in a notebook cell, interactive, with the still image
that `snapshot_png(result)` (png.py) draws behind it, for the front ends where scripts do not run.

May import: mha (the names it exports), torch, PIL; IPython only where a notebook runs it.
"""

from app.snapshot.notebook import View
from app.snapshot.png import snapshot_png

__all__ = ["View", "snapshot_png"]
