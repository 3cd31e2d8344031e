"""What the page's first view costs on the wire, per attention value: the figure benchmarks/browser.py prints
beside its goal, computed here from byte counts alone (no browser, no clock), so tests can check it.

The first view is what a click on Run fetches (docs/design.md, "What the page fetches"): every head
quantized (`/api/attention/compact` in the page's scheme and bits), the head statistics (`/api/analysis`,
gzipped) and, up to AUTO_EXACT_MAX_N tokens, the detail's exact head (`/api/attention/head/compact`).
Its cost is the bytes of all of them on the wire over the L·H·n² attention values they show.
benchmarks/browser.py counts what Chromium received (`transferSize`: response headers included, ~0.4 KB
an answer); `first_view_answers` asks the same questions of a client (an httpx or Starlette TestClient) and
counts the bodies as sent.

    from benchmarks.wire import Wire, first_view_answers   # tests (the repository root is on sys.path)
    from wire import Wire, text_of                        # a script in benchmarks/ (its own folder)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# docs/design.md: the first view moves at most this many bytes per attention value.
GOAL_BYTES_PER_VALUE = 0.3
# The page's first view, by the path of each answer it fetches (the /api/ paths the browser reports).
COMPACT = "/api/attention/compact"
ANALYSIS = "/api/analysis"
EXACT_HEAD = "/api/attention/head/compact"

WORDS = (
    "the committee said on tuesday that the new bridge across the river would open next spring after "
    "engineers finished testing the cables while residents who had waited years for it planned a party "
    "near the old ferry landing where boats once carried workers to the mills"
).split()


def text_of(tokens: int, salt: int) -> str:
    """Roughly `tokens` word-piece tokens (MiniLM splits these common words into one piece each)."""
    words = [WORDS[(i + salt) % len(WORDS)] for i in range(tokens - 2)]
    words[0] = f"run{salt}"  # a fresh first word: a text the server has not cached
    return " ".join(words)


@dataclass(frozen=True)
class Wire:
    """A first view's answers, {path: bytes on the wire}, against the L x H x n x n values it shows."""

    layers: int
    heads: int
    n: int
    answers: Mapping[str, int]

    @property
    def values(self) -> int:
        return self.layers * self.heads * self.n * self.n

    @property
    def total(self) -> int:
        return sum(self.answers.values())

    @property
    def per_value(self) -> float:
        return self.total / self.values

    @property
    def ok(self) -> bool:
        return self.per_value <= GOAL_BYTES_PER_VALUE

    def share(self, path: str) -> float:
        """One answer's bytes per attention value (0 for one the view did not fetch)."""
        return self.answers.get(path, 0) / self.values


@cache
def page_constant(module: str, name: str) -> str:
    """`export const NAME = value;` of app/static/js/`module`, as written (quotes stripped): what the page
    itself fetches, read from its source so this mirror cannot drift from it."""
    source = (REPO / "app" / "static" / "js" / module).read_text("utf-8")
    found = re.search(rf"^export const {name} = (.+?);$", source, re.MULTILINE)
    if found is None:
        raise LookupError(f"app/static/js/{module} has no `export const {name} = ...;`")
    return found.group(1).strip("\"'")


def first_view_answers(client: Any, body: dict[str, Any], *, layer: int = 0, head: int = 0) -> Wire:
    """Ask `client` (httpx-like: .post(url, json=, headers=)) what the page's first view asks for `body`
    (its default selection: layer 0, head 0) and count each answer's body as sent (gzip accepted)."""
    gzip = {"Accept-Encoding": "gzip"}
    scheme = page_constant("api.js", "COMPACT_SCHEME")
    bits = page_constant("api.js", "COMPACT_BITS")
    answers: dict[str, int] = {}

    def ask(path: str, payload: dict[str, Any], query: str = "") -> Any:
        response = client.post(path + query, json=payload, headers=gzip)
        response.raise_for_status()
        answers[path] = int(response.headers["content-length"])  # the body as sent, before decoding
        return response

    compact = ask(COMPACT, body, f"?scheme={scheme}&bits={bits}")
    header = _hsa1_header(compact.content)
    ask(ANALYSIS, body)
    n = int(header["n"])
    if n <= int(page_constant("detail.js", "AUTO_EXACT_MAX_N")):  # above it, on request only
        ask(EXACT_HEAD, {**body, "layer": layer, "head": head})
    return Wire(layers=int(header["layers"]), heads=int(header["heads"]), n=n, answers=answers)


def _hsa1_header(buffer: bytes) -> dict[str, Any]:
    from app.compact import decode_sections  # the app's own reader of the transport

    return decode_sections(buffer)[0]
