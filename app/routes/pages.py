"""The page: GET / renders the Jinja2 template; plotly.js is served from app/static/vendor/plotly/ (its
VERSION says which bundle, and why a partial one)."""

from __future__ import annotations

import gzip
import hashlib
from functools import lru_cache
from urllib.parse import urlencode

from fastapi import APIRouter, Request, Response
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse
from fastapi.templating import Jinja2Templates

from app import page
from app.deps import ServiceDep, SettingsDep
from app.page import PLOTLY_JS, PLOTLY_VERSION
from app.service import FLOW_MAX_TOKENS

router = APIRouter(include_in_schema=False)
templates = Jinja2Templates(env=page.environment())  # the snapshot renders with the same (app/page.py)

PLOTLY_PATH = "/static/vendor/plotly.min.js"
# The URL carries the bundle's version, so a browser may keep the file until it changes.
PLOTLY_URL = f"{PLOTLY_PATH}?v={PLOTLY_VERSION}"
PLOTLY_CACHE = "public, max-age=31536000, immutable"


@router.get("/", response_class=HTMLResponse, response_model=None)
def index(request: Request, service: ServiceDep, settings: SettingsDep) -> HTMLResponse | RedirectResponse:
    root = request.scope.get("root_path", "")
    if request.query_params.get("view") == "corpus":  # the Corpus view has a page of its own
        rest = [(key, value) for key, value in request.query_params.multi_items() if key != "view"]
        return RedirectResponse(f"{root}/corpus?{urlencode(rest)}", status_code=303)
    # Everything the page needs before its first request; rendered as a JSON data block by |tojson.
    data = page.page_data(
        service.model_list(),
        max_tokens=settings.max_tokens,
        max_new_tokens=settings.max_new_tokens,
        flow_max_tokens=settings.flow_max_tokens or FLOW_MAX_TOKENS,
    )
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
