"""The API explorer at /docs works offline: Swagger UI from our own server, under the page's strict CSP."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

pytestmark = pytest.mark.browser


def test_docs_lists_every_operation_with_no_request_leaving_the_server(session: Any) -> None:
    with urllib.request.urlopen(f"{session.base}/openapi.json") as response:
        schema = json.load(response)
    operations = sum(len(methods) for methods in schema["paths"].values())
    page = session.open("docs")
    page.wait_for_selector(".opblock", timeout=30_000)
    assert page.locator(".opblock").count() == operations
    assert page.locator(".info .title").first.text_content().startswith("headscope")
    # The fixture's teardown also fails on any request off the server and on any CSP violation.
