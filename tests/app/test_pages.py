"""app/routes/pages.py without a browser: the rendered page and the locally served plotly.js."""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Callable
from html.parser import HTMLParser
from typing import Any

from fastapi.testclient import TestClient

from app.main import create_app
from app.routes.pages import PLOTLY_JS, PLOTLY_VERSION
from app.service import FLOW_MAX_TOKENS
from app.settings import Settings
from tests.app.started import serving


class Scripts(HTMLParser):
    """Every <script>: its attributes and its text."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[dict[str, str | None], str]] = []
        self._inside: dict[str, str | None] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "script":
            self._inside = dict(attrs)
            self.found.append((self._inside, ""))
        elif any(name.startswith("on") for name, _ in attrs):
            raise AssertionError(f"inline event handler on <{tag}>: {attrs}")

    def handle_data(self, data: str) -> None:
        if self._inside is not None:
            attrs, text = self.found[-1]
            self.found[-1] = (attrs, text + data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._inside = None


def scripts(page: str) -> list[tuple[dict[str, str | None], str]]:
    parser = Scripts()
    parser.feed(page)
    return parser.found


def test_page_carries_server_state_as_json_and_no_inline_script(client: TestClient) -> None:
    response = client.get("/")
    assert response.status_code == 200
    assert "script-src 'self'" in response.headers["content-security-policy"]
    found = scripts(response.text)
    data_blocks = [text for attrs, text in found if attrs.get("type") == "application/json"]
    code = [attrs for attrs, _ in found if attrs.get("type") != "application/json"]
    # Scripts are files from our own server; the only inline <script> is the JSON data block.
    assert all(attrs.get("src", "").startswith("/static/") for attrs in code), code
    assert [a.get("id") for a, t in found if a.get("type") == "application/json"] == ["initial-state"]
    state = json.loads(data_blocks[0])
    models = client.get("/api/models").json()
    assert state["default"] == models["default"] == "all-MiniLM-L6-v2"
    assert [m["name"] for m in state["models"]] == [m["name"] for m in models["models"]]
    assert state["limits"]["max_chars"] > 0 and state["limits"]["max_tokens"] > 0
    max_chars = state["limits"]["max_chars"]
    # A's text may be as long as a trace takes (the page traces what the attention routes would cut); B's not.
    trace_chars = state["limits"]["trace_max_chars"]
    assert trace_chars > max_chars
    assert re.search(rf'<textarea id="text"[^>]*maxlength="{trace_chars}"', response.text)
    assert re.search(rf'<textarea id="text-b"[^>]*maxlength="{max_chars}"', response.text)
    # The flow button's limit is the service's: its default here, the setting where one is set.
    assert state["limits"]["flow_max_tokens"] == FLOW_MAX_TOKENS


def initial_state(client: TestClient) -> dict[str, Any]:
    blocks = [text for attrs, text in scripts(client.get("/").text) if attrs.get("id") == "initial-state"]
    return dict(json.loads(blocks[0]))


def test_page_knows_a_lowered_flow_limit(make_settings: Callable[..., Settings]) -> None:
    with serving(create_app(make_settings(flow_max_tokens=4))) as lowered:
        assert initial_state(lowered)["limits"]["flow_max_tokens"] == 4


def test_plotly_is_served_locally_gzipped_and_cached(client: TestClient) -> None:
    page = client.get("/").text
    url = re.search(r'src="(/static/vendor/plotly\.min\.js\?v=[^"]+)"', page)
    assert url is not None and url.group(1).endswith(f"?v={PLOTLY_VERSION}")
    # the vendored bundle is the one its VERSION note names
    assert f" {PLOTLY_VERSION} (npm)" in (PLOTLY_JS.parent / "VERSION").read_text()
    with client.stream("GET", url.group(1), headers={"Accept-Encoding": "gzip"}) as response:
        wire = b"".join(response.iter_raw())  # the bytes as sent, before httpx undoes the gzip
    assert response.status_code == 200
    assert response.headers["content-encoding"] == "gzip"
    assert response.headers["content-type"].startswith("text/javascript")
    assert "immutable" in response.headers["cache-control"]
    javascript = PLOTLY_JS.read_bytes()
    assert gzip.decompress(wire) == javascript  # the vendored file, in fewer bytes on the wire
    assert int(response.headers["content-length"]) == len(wire) < len(javascript)
    revalidate = {"Accept-Encoding": "gzip", "If-None-Match": response.headers["etag"]}
    again = client.get(url.group(1), headers=revalidate)
    assert again.status_code == 304
    plain = client.get(url.group(1), headers={"Accept-Encoding": "identity"})
    assert plain.status_code == 200 and "content-encoding" not in plain.headers
    assert plain.content == javascript


def test_docs_page_is_ours_with_local_assets_and_the_strict_csp(client: TestClient) -> None:
    response = client.get("/docs")
    assert response.status_code == 200
    assert "script-src 'self';" in response.headers["content-security-policy"]
    found = scripts(response.text)
    sources = [attrs.get("src") for attrs, _ in found]
    assert sources == ["/static/vendor/swagger-ui/swagger-ui-bundle.js", "/static/js/docs.js"]
    assert all(text.strip() == "" for _, text in found), "no inline script"
    assert client.get("/static/vendor/swagger-ui/swagger-ui-bundle.js").status_code == 200
    assert client.get("/redoc").status_code == 404  # FastAPI's CDN-loaded pages are off
