"""A new run aborts everything the old one still waits for, and nothing of the old run is drawn."""

from __future__ import annotations

import json
import urllib.request
from typing import Any
from urllib.parse import urlparse

import pytest

pytestmark = pytest.mark.browser

FIRST = "The cat sat on the mat because the cat was tired."
SECOND = "A dog waited by the river until night."
LABELS_JS = "(selector) => document.querySelector(selector).layout.xaxis.ticktext"
# The table's "previous" column, row by row in model order (the table's first sort).
PREVIOUS_JS = """() => {
  const table = document.querySelector('#stats-table');
  const column = [...table.tHead.querySelectorAll('th')].findIndex((th) => th.dataset.key === 'previous');
  return [...table.tBodies[0].rows].map((row) => row.cells[column].textContent);
}"""


def analysis(base: str, text: str) -> Any:
    body = json.dumps({"text": text}).encode()
    headers = {"Content-Type": "application/json"}
    request = urllib.request.Request(f"{base}/api/analysis", data=body, headers=headers)
    with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 (local test server)
        return json.load(response)


def test_a_new_run_aborts_the_old_runs_insight_fetches_and_draws_only_its_own(session: Any) -> None:
    page = session.open()
    page.set_viewport_size({"width": 1500, "height": 2400})  # the rollout panel on screen: it loads at once
    failed: list[tuple[str, str]] = []
    page.on("requestfailed", lambda request: failed.append((urlparse(request.url).path, request.failure)))

    def hold_first(route: Any) -> None:
        """FIRST's statistics and rollout never get an answer: only an abort can end them."""
        if FIRST not in (route.request.post_data or ""):
            route.continue_()

    page.route("**/api/analysis", hold_first)
    page.route("**/api/rollout/compact*", hold_first)
    with page.expect_request("**/api/analysis"), page.expect_request("**/api/rollout/compact*"):
        session.run(FIRST)
    assert page.evaluate("document.body.dataset.insight") == "loading"
    assert failed == []

    session.run(SECOND)
    page.wait_for_function("() => ['ready', 'error'].includes(document.body.dataset.insight)")
    assert page.evaluate("document.body.dataset.insight") == "ready"
    page.wait_for_selector("#rollout[data-state=ready]")
    # FIRST's two held requests were cancelled by the page (not answered, not left hanging); on a slow
    # machine its exact head may still have been on the way, and is cancelled with them.
    paths = [path for path, _ in failed]
    assert paths.count("/api/analysis") == 1 and paths.count("/api/rollout/compact") == 1, failed
    assert set(paths) <= {"/api/analysis", "/api/rollout/compact", "/api/attention/head/compact"}, failed
    assert all("ABORTED" in (reason or "") for _, reason in failed), failed
    # Everything drawn is SECOND's: the detail, the rollout, and one table row per head.
    detail = page.evaluate(LABELS_JS, "#head-detail")
    assert "river" in detail and "cat" not in detail
    assert page.evaluate(LABELS_JS, "#rollout") == detail
    previous = analysis(session.base, SECOND)["stats"]["previous"]
    shown = [float(text) for text in page.evaluate(PREVIOUS_JS)]
    want = [v for row in previous for v in row]
    # The table prints 3 decimals: each shown value is within half its last place, 5e-4, of the API's.
    assert len(shown) == len(want) and all(abs(a - b) <= 5e-4 for a, b in zip(shown, want, strict=True))
    assert analysis(session.base, FIRST)["stats"]["previous"] != previous  # a check that can tell them apart
    assert page.evaluate("document.body.dataset.state") == "ready"
