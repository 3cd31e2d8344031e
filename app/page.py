"""The page as files: its template environment, its static folder, the vendored plotly.js, and the data the
page opens with. GET / (app/routes/pages.py) renders it from here, and so does a snapshot
(app/snapshot/), so the two cannot drift apart: one Jinja environment, one data block.

May import: app.package_data and app.schemas. Never mha, the service or a route.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

from app.package_data import PLOTLY_BUNDLE, STATIC, TEMPLATES, package_dir
from app.schemas.attention import ModelList
from app.schemas.common import MAX_TEXT_CHARS, TRACE_MAX_TEXT_CHARS

# The installed package's own files (app/package_data.py), wherever it lies.
TEMPLATES_DIR = package_dir(TEMPLATES)
STATIC_DIR = package_dir(STATIC)
JS_DIR = STATIC_DIR / "js"
CSS = STATIC_DIR / "css" / "headscope.css"
FAVICON = STATIC_DIR / "img" / "favicon.svg"
PLOTLY_JS = STATIC_DIR / PLOTLY_BUNDLE


def _bundle_version(path: Path) -> str:
    """The version the bundle's banner names ("plotly.js (cartesian - minified) v4.1.1")."""
    with path.open(encoding="utf-8") as bundle:
        banner = re.search(r"plotly\.js .*?v(\d+\.\d+\.\d+)", bundle.read(200))
    if banner is None:
        raise RuntimeError(f"{path} names no plotly.js version in its banner")
    return banner.group(1)


PLOTLY_VERSION = _bundle_version(PLOTLY_JS)


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The one Jinja environment of the page's templates, autoescaped as Starlette makes its own."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR), autoescape=jinja2.select_autoescape()
    )


def page_data(
    models: ModelList, *, max_tokens: int, max_new_tokens: int, flow_max_tokens: int
) -> dict[str, Any]:
    """Everything the page needs before its first request, rendered as its JSON data block (`|tojson`):
    the models list (GET /api/models's answer) and the limits the form and the views read."""
    return {
        "default": models.default,
        "models": [entry.model_dump() for entry in models.models],
        "sources": [source.model_dump() for source in models.sources],  # the menu's groups, in order
        "limits": {
            "max_chars": MAX_TEXT_CHARS,
            "trace_max_chars": TRACE_MAX_TEXT_CHARS,  # A's text and pair: a long input is traced
            "max_tokens": max_tokens,
            "max_new_tokens": max_new_tokens,
            "flow_max_tokens": flow_max_tokens,  # the flow button's limit
        },
    }
