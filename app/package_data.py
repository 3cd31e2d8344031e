"""The page's files as package data: app/static and app/templates (pyproject's
[tool.setuptools.package-data]), found through importlib.resources, so an installed wheel serves its own
copy wherever it lies, never a checkout's, and a zipped one serves a copy unpacked once per process.

May import: the standard library only (the server, the routes and the snapshot read their files here).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import cache
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

__all__ = ["PLOTLY_BUNDLE", "STATIC", "TEMPLATES", "package_dir"]

STATIC = "static"  # the page's JS, CSS, images and vendored libraries, served at /static
TEMPLATES = "templates"  # the Jinja2 templates
# The vendored plotly.js bundle within STATIC (its VERSION and LICENSE lie beside it).
PLOTLY_BUNDLE = "vendor/plotly/plotly-cartesian.min.js"


@cache
def package_dir(name: str) -> Path:
    """The folder app/`name` on disk. An installed or editable package is on disk already; from a zip
    (Traversables that are not Paths) the folder is copied out once, since StaticFiles and Jinja2's loader
    read real files (importlib.resources.as_file unpacks a folder only from Python 3.12)."""
    root = files("app") / name
    if not root.is_dir():
        raise FileNotFoundError(f"app/{name} is missing from the installed package (its package data)")
    if isinstance(root, Path):
        return root
    unpacked = Path(tempfile.mkdtemp(prefix=f"headscope-{name}-"))
    atexit.register(shutil.rmtree, unpacked, ignore_errors=True)
    _copy(root, unpacked)
    return unpacked


def _copy(source: Traversable, target: Path) -> None:
    for entry in source.iterdir():
        if entry.is_dir():
            (target / entry.name).mkdir()
            _copy(entry, target / entry.name)
        else:
            (target / entry.name).write_bytes(entry.read_bytes())
