"""State that tells the truth, at 1440x900: a link's unknown model or out-of-range head is replaced and said
so; a failed run leaves the old result marked stale; compare's B menu offers only models it can pair with A;
attention flow is off above its limit, with the limit shown; byte-level spelling only for byte-level
tokenizers, and the JSON export carries the spelled tokens beside the raw ones."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from app.service import FLOW_MAX_TOKENS

pytestmark = pytest.mark.browser

DEFAULT = "all-MiniLM-L6-v2"  # 6 layers x 12 heads
SHORT = "The cat sat."
LONG = " ".join(["the cat sat on the mat"] * 6)  # 38 tokens with [CLS] and [SEP]: over the flow limit


@pytest.fixture
def page(session: Any) -> Any:
    session.page.set_viewport_size({"width": 1440, "height": 900})
    return session.page


def post(base: str, path: str, payload: dict[str, Any]) -> Any:
    body = json.dumps(payload).encode()
    request = urllib.request.Request(f"{base}{path}", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 (local test server)
        return json.load(response)


def notice(page: Any) -> list[str]:
    return page.locator("#state-notice p").all_text_contents()


def link_state(page: Any) -> dict[str, str]:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(page.url).query))


def wait_insight(page: Any) -> None:
    page.wait_for_function("() => ['ready', 'error'].includes(document.body.dataset.insight)")


def test_a_link_asking_for_what_is_not_here_says_what_is_shown(session: Any, page: Any) -> None:
    query = urllib.parse.urlencode(
        {"text": SHORT, "model": "gpt-5", "layer": "9", "head": "40", "view": "flow", "words": "yes"}
    )
    session.open(f"?{query}")
    session.wait_ready()
    assert page.locator("#state-notice").is_visible()
    assert notice(page) == [
        f"Model “gpt-5” is not served here; showing {DEFAULT}.",
        "Ignored in the link: view “flow”, words “yes”.",
        "layer 9 is beyond this model's 6 layers (0–5); showing layer 5; "
        "head 40 is beyond its 12 heads (0–11); showing head 11.",
    ]
    assert page.input_value("#model") == DEFAULT
    # What is shown is what the link now says, and the detail is that head.
    assert {k: link_state(page)[k] for k in ("model", "layer", "head", "view")} == {
        "model": DEFAULT,
        "layer": "5",
        "head": "11",
        "view": "heatmap",
    }
    assert "layer 5, head 11" in (page.locator("#detail-title").text_content() or "")
    # The next run is the person's own: the link's notices go.
    session.run("The dog ran.")
    assert not page.locator("#state-notice").is_visible() and notice(page) == []


def test_a_link_within_range_on_a_served_model_gets_no_notice(session: Any, page: Any) -> None:
    session.open(
        f"?{urllib.parse.urlencode({'text': SHORT, 'model': DEFAULT, 'layer': '5', 'head': 'mean'})}"
    )
    session.wait_ready()
    assert notice(page) == [] and not page.locator("#state-notice").is_visible()


def test_a_failed_run_leaves_the_old_result_marked_stale(session: Any, page: Any) -> None:
    session.open()
    session.run(SHORT)
    assert page.locator(".workspace.stale").count() == 0 and not page.locator("#stale-banner").is_visible()
    thumbnails = page.locator("#grid canvas").count()
    # The service refuses the next run (as it would a text over its limits): the old grid stays, marked.
    refusal = {"detail": "text: over this service's limit"}
    page.route("**/api/attention/compact**", lambda route: route.fulfill(status=422, json=refusal))
    page.fill("#text", "A sentence the service refuses.")
    page.evaluate("document.body.dataset.state = 'idle'")
    page.click("#run")
    page.wait_for_function("() => document.body.dataset.state === 'error'")
    assert page.locator("#error").text_content() == refusal["detail"]
    assert page.locator(".workspace.stale").count() == 1 and page.locator("#analysis.stale").count() == 1
    banner = page.locator("#stale-banner")
    assert banner.is_visible()
    assert banner.text_content() == (
        f"Showing the previous result, for “{SHORT}”: the last run failed (see the message above)."
    )
    assert page.locator("#grid canvas").count() == thumbnails  # still there
    assert link_state(page)["text"] == SHORT  # the link names what is shown, not what failed
    # The next success clears the mark.
    page.unroute("**/api/attention/compact**")
    session.run("The dog ran.")
    assert page.locator(".stale").count() == 0 and not banner.is_visible()


def b_options(page: Any) -> dict[str, dict[str, Any]]:
    return {
        o["value"]: o
        for o in page.evaluate(
            "[...document.querySelectorAll('#model-b option')]"
            ".map((o) => ({value: o.value, disabled: o.disabled, text: o.textContent, title: o.title}))"
        )
    }


def test_compare_offers_only_b_models_of_a_shape(session: Any, page: Any, causal_model: str) -> None:
    # Both tiny models loaded, so the page is rendered knowing their sizes.
    tiny = {}
    for name in (causal_model, "llama-tiny"):
        tiny[name] = post(session.base, "/api/attention", {"text": SHORT, "model": name})
    gpt2 = tiny[causal_model]
    assert (
        (gpt2["layers"], gpt2["heads"])
        != (6, 12)
        != (tiny["llama-tiny"]["layers"], tiny["llama-tiny"]["heads"])
    )
    session.open()
    page.check("#compare")
    options = b_options(page)
    assert options[DEFAULT]["disabled"] is False
    for name in tiny:
        layers, heads = tiny[name]["layers"], tiny[name]["heads"]
        assert options[name]["disabled"] is True, options[name]
        assert options[name]["text"].endswith("not comparable with A")
        assert options[name]["title"].startswith(
            f"Cannot be compared with A: {layers} layers × {heads} heads; "
        )
        assert f"A ({DEFAULT}) has 6 × 12" in options[name]["title"]
    # A's model changes: the menu follows, and B (not chosen yet) follows A.
    page.select_option("#model", causal_model)
    options = b_options(page)
    assert options[causal_model]["disabled"] is False and options[DEFAULT]["disabled"] is True
    assert page.input_value("#model-b") == causal_model
    # A link pairing A with a B of another shape: B takes A's model, and the notice says why.
    session.open(f"?{urllib.parse.urlencode({'text': SHORT, 'compare': '1', 'bmodel': causal_model})}")
    session.wait_ready()
    assert page.input_value("#model-b") == DEFAULT
    assert any(
        line.startswith(f"B model “{causal_model}” cannot be compared with {DEFAULT}")
        for line in notice(page)
    )
    wait_insight(page)
    assert not page.locator("#error").is_visible()  # the comparison that runs is one that can


def test_flow_is_offered_up_to_its_limit_and_says_it(session: Any, page: Any) -> None:
    session.open()
    button = page.locator("#flow-run")
    session.run(SHORT)
    wait_insight(page)
    assert button.is_enabled()
    assert button.text_content() == f"Compute attention flow (up to {FLOW_MAX_TOKENS} tokens)"
    n = len(post(session.base, "/api/attention", {"text": LONG})["tokens"])
    assert n > FLOW_MAX_TOKENS
    session.run(LONG)
    wait_insight(page)
    assert button.is_disabled()
    message = page.locator("#flow-message").text_content() or ""
    assert f"limited to {FLOW_MAX_TOKENS} tokens" in message and f"this input has {n}" in message
    assert "/api/" not in message and "/api/" not in (button.get_attribute("title") or "")
    assert not page.locator("#error").is_visible()  # a limit, said in words, not an error
    # Words mode counts words, and the button says so.
    page.check("#words")
    page.wait_for_function("() => document.body.dataset.state === 'ready'")
    wait_insight(page)
    assert button.text_content() == f"Compute attention flow (up to {FLOW_MAX_TOKENS} words)"
    assert button.is_disabled()  # 36 words


def test_byte_level_spelling_follows_the_tokenizer_and_travels_in_json(
    session: Any, page: Any, causal_model: str, tmp_path: Path
) -> None:
    session.open()
    session.run(SHORT, model=causal_model)
    raw = page.evaluate("document.querySelector('#head-detail').layout.xaxis.ticktext")
    assert "␣cat" in raw and not any("Ġ" in t for t in raw)
    with page.expect_download() as info:
        page.click("#export-json")
    path = tmp_path / "answer.json"
    info.value.save_as(path)
    answer = json.loads(path.read_text())
    assert answer["byte_level"] is True and "Ġcat" in answer["tokens"]
    assert answer["display_tokens"] == [t.replace("Ġ", "␣") for t in answer["tokens"]]
    # Words are slices of the text, not byte-level tokens: a "Ġ" someone typed is shown as typed.
    page.check("#words")
    page.fill("#text", "Ġx cat")
    page.evaluate("document.body.dataset.state = 'idle'")
    page.click("#run")
    session.wait_ready()
    ticks = page.evaluate("document.querySelector('#head-detail').layout.xaxis.ticktext")
    assert ticks[0] == "Ġx", ticks
