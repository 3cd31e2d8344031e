"""The first view in headless Chromium: what a click on Run fetches is what benchmarks/wire.py counts, byte
for byte, and the head statistics arrive gzipped yet show as before (table, labels, heads like this one)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from app import compact
from benchmarks.wire import ANALYSIS, COMPACT, EXACT_HEAD, first_view_answers, text_of

pytestmark = pytest.mark.browser

LABELS_JS = "[...document.querySelectorAll('#grid .thumb[data-label]')].map((t) => t.dataset.label)"
# Every API answer since the timings were cleared: its path, body bytes as received and as decoded.
ANSWERS_JS = """() => performance.getEntriesByType('resource')
  .filter((e) => new URL(e.name).pathname.startsWith('/api/'))
  .map((e) => ({path: new URL(e.name).pathname, encoded: e.encodedBodySize, decoded: e.decodedBodySize}))"""
# Asked only to learn whether a text of more bytes than the token limit is a long input (~0.4 KB).
MEASURE = "/api/trace/tokens"
# Asked only when the forward is still running after FORWARD_MS (work-progress.js: its layers and Cancel):
# a matter of the machine's load, not of what the first view needs.
PROGRESS = "/api/attention/progress"


def test_first_view_fetches_what_wire_counts_with_the_statistics_gzipped(session: Any) -> None:
    page = session.open()
    page.evaluate("performance.clearResourceTimings()")
    text = text_of(128, salt=7)
    session.run(text)
    page.wait_for_function("() => ['ready', 'error'].includes(document.body.dataset.insight)")
    assert page.evaluate("document.body.dataset.insight") == "ready"
    page.wait_for_selector("#head-detail[data-exact=true]")  # the detail's exact head came by itself
    received = {answer["path"]: answer for answer in page.evaluate(ANSWERS_JS)}
    assert set(received) - {MEASURE, PROGRESS} == {COMPACT, ANALYSIS, EXACT_HEAD}

    statistics = received[ANALYSIS]
    # Gzip on the wire: 6-decimal digits deflate ~2.5x, so under half is a wide bound.
    assert 0 < statistics["encoded"] < statistics["decoded"] / 2

    # The mirror asks the same questions of the same server: the same bodies, byte for byte.
    with httpx.Client(base_url=session.base, timeout=60) as client:
        wire = first_view_answers(client, {"text": text})
    assert wire.answers == {path: received[path]["encoded"] for path in wire.answers}

    # And the page reads the statistics as before: a table row per head, labels, similar heads.
    assert page.locator("#stats-table tbody tr").count() == wire.layers * wire.heads
    labels = page.evaluate(LABELS_JS)
    assert len(labels) == wire.layers * wire.heads and all(labels)
    assert page.locator("#similar button.chip").count() > 0


def test_below_128_tokens_the_heads_come_in_fewer_bits_and_the_page_says_so(session: Any) -> None:
    page = session.open()
    page.evaluate("performance.clearResourceTimings()")
    text = text_of(72, salt=8)  # 64..87 tokens: 6 bits (app/compact.py AUTO_BITS)
    session.run(text)
    page.wait_for_selector("#head-detail[data-exact=true]")
    # The statistics follow the drawn view (main.js show: insights.load): on a busy machine after the head.
    page.wait_for_function("() => ['ready', 'error'].includes(document.body.dataset.insight)")
    received = {answer["path"]: answer for answer in page.evaluate(ANSWERS_JS)}
    with httpx.Client(base_url=session.base, timeout=60) as client:
        wire = first_view_answers(client, {"text": text})
        header = compact.decode(
            client.post(f"{COMPACT}?scheme=abs-uint8-key-major&bits=auto", json={"text": text}).content
        )[0]
    assert header["quantization"]["bits"] == 6 and 64 <= wire.n < 88
    assert wire.answers == {path: received[path]["encoded"] for path in wire.answers}
    assert wire.ok, wire.per_value  # the budget the fewer bits are for
    # A layer's mean is computed in the page from the quantized heads: its caption gives their bits and bound.
    page.click('#grid .thumb[data-layer="1"][data-head="mean"]')
    caption = page.locator("#detail-caption")
    page.wait_for_function("() => document.querySelector('#detail-caption').textContent.includes('6-bit')")
    assert "6-bit values (within ±0.0079)" in caption.text_content()  # 1/126
