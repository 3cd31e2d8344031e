"""The page: GET / renders the Jinja2 template; plotly.js is served from app/static/vendor/plotly/ (its
VERSION says which bundle, and why a partial one)."""

from __future__ import annotations

import gzip
import hashlib
import re
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request, Response
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse
from fastapi.templating import Jinja2Templates

from app.deps import ServiceDep, SettingsDep
from app.package_data import PLOTLY_BUNDLE, STATIC, TEMPLATES, package_dir
from app.schemas.common import MAX_TEXT_CHARS, TRACE_MAX_TEXT_CHARS
from app.service import FLOW_MAX_TOKENS

router = APIRouter(include_in_schema=False)
templates = Jinja2Templates(directory=package_dir(TEMPLATES))

PLOTLY_JS = package_dir(STATIC) / PLOTLY_BUNDLE
PLOTLY_PATH = "/static/vendor/plotly.min.js"


def _bundle_version(path: Path) -> str:
    """The version the bundle's banner names ("plotly.js (cartesian - minified) v4.1.1")."""
    with path.open(encoding="utf-8") as bundle:
        banner = re.search(r"plotly\.js .*?v(\d+\.\d+\.\d+)", bundle.read(200))
    if banner is None:
        raise RuntimeError(f"{path} names no plotly.js version in its banner")
    return banner.group(1)


# The URL carries the bundle's version, so a browser may keep the file until it changes.
PLOTLY_VERSION = _bundle_version(PLOTLY_JS)
PLOTLY_URL = f"{PLOTLY_PATH}?v={PLOTLY_VERSION}"
PLOTLY_CACHE = "public, max-age=31536000, immutable"


@router.get("/", response_class=HTMLResponse, response_model=None)
def index(request: Request, service: ServiceDep, settings: SettingsDep) -> HTMLResponse | RedirectResponse:
    root = request.scope.get("root_path", "")
    if request.query_params.get("view") == "corpus":  # the Corpus view has a page of its own
        rest = [(key, value) for key, value in request.query_params.multi_items() if key != "view"]
        return RedirectResponse(f"{root}/corpus?{urlencode(rest)}", status_code=303)
    models = service.model_list()
    # Everything the page needs before its first request; rendered as a JSON data block by |tojson.
    data: dict[str, Any] = {
        "default": models.default,
        "models": [entry.model_dump() for entry in models.models],
        "sources": [source.model_dump() for source in models.sources],  # the menu's groups, in order
        "limits": {
            "max_chars": MAX_TEXT_CHARS,
            "trace_max_chars": TRACE_MAX_TEXT_CHARS,  # A's text and pair: a long input is traced
            "max_tokens": settings.max_tokens,
            "max_new_tokens": settings.max_new_tokens,
            "flow_max_tokens": settings.flow_max_tokens or FLOW_MAX_TOKENS,  # the flow button's limit
        },
    }
    context = {
        "data": data,
        "static_prefix": f"{root}/static",
        "plotly_url": f"{root}{PLOTLY_URL}",
    }
    return templates.TemplateResponse(request, "index.html", context)


@router.get("/corpus", response_class=HTMLResponse)
def corpus(request: Request) -> HTMLResponse:
    """The Corpus view: finished corpus runs (HEADSCOPE_RUNS_DIR), which it fetches itself."""
    root = request.scope.get("root_path", "")
    context = {"static_prefix": f"{root}/static", "plotly_url": f"{root}{PLOTLY_URL}"}
    return templates.TemplateResponse(request, "corpus.html", context)


@router.get("/docs", response_class=HTMLResponse)
def docs(request: Request) -> HTMLResponse:
    """The API explorer: Swagger UI served by us (FastAPI's default loads it from a CDN), so it works
    offline and under the same Content-Security-Policy as the page."""
    root = request.scope.get("root_path", "")
    context = {"static_prefix": f"{root}/static", "openapi_url": f"{root}{request.app.openapi_url}"}
    return templates.TemplateResponse(request, "docs.html", context)


@lru_cache(maxsize=1)
def _plotly_gzip() -> tuple[bytes, str]:
    # 1.5 MB of JavaScript is 0.5 MB gzipped: compress once per process, not per request.
    body = gzip.compress(PLOTLY_JS.read_bytes(), compresslevel=6, mtime=0)
    return body, '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


@router.get(PLOTLY_PATH, response_model=None)
def plotly_js(request: Request) -> Response:
    if "gzip" not in request.headers.get("accept-encoding", "").lower():
        return FileResponse(PLOTLY_JS, media_type="text/javascript", headers={"Cache-Control": PLOTLY_CACHE})
    body, etag = _plotly_gzip()
    headers = {"Cache-Control": PLOTLY_CACHE, "ETag": etag, "Vary": "Accept-Encoding"}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    return Response(body, media_type="text/javascript", headers={**headers, "Content-Encoding": "gzip"})
