"""The app's JSON API as the tests call it: one POST, the answer parsed (tests/ is on the import path)."""

from __future__ import annotations

import json
import urllib.request
from typing import Any


def post_json(base: str, path: str, payload: dict[str, Any]) -> Any:
    """POST `payload` as JSON to `base` + `path` and return the parsed answer (raises on a 4xx/5xx)."""
    body = json.dumps(payload).encode()
    headers = {"Content-Type": "application/json"}
    request = urllib.request.Request(f"{base}{path}", data=body, headers=headers)
    with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 (local test server)
        return json.load(response)
