"""A newcomer's first minute: a first visit shows a result; each example chip fills the form and runs."""

from __future__ import annotations

import json
import urllib.request
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from gguf_files import bundled_gguf

pytestmark = pytest.mark.browser

# app/static/js/examples.js's EXAMPLES, read from the page so the test follows the module, not a copy of it.
EXAMPLES_JS = "async () => (await import('/static/js/examples.js')).EXAMPLES"

# Every key token of the head detail, from the hover text of its last row ("query → key"), which holds them
# all (the axes thin their labels on long inputs). Plotly's entities are undone to compare with the API.
KEYS_JS = """() => {
  const gd = document.querySelector('#head-detail');
  const row = gd.data.find((t) => t.type === 'heatmap').customdata.at(-1);
  const text = document.createElement('textarea');
  return row.map((cell) => { text.innerHTML = cell.split(' → ').at(-1); return text.value; });
}"""


def api_tokens(base: str, text: str, pair: str) -> list[str]:
    body = json.dumps({"text": text, "text_pair": pair or None}).encode()
    request = urllib.request.Request(
        f"{base}/api/attention", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 (local test server)
        return list(json.load(response)["tokens"])


def examples(page: Any) -> list[dict[str, str]]:
    return list(page.evaluate(EXAMPLES_JS))


def test_first_visit_runs_the_first_example_without_a_click(session: Any) -> None:
    page = session.open("")  # no URL state at all
    session.wait_ready()
    first = examples(page)[0]
    assert "it was too tired" in first["text"]
    assert page.input_value("#text") == first["text"]
    # Every thumbnail and the detail drawn, for the example's tokens.
    assert page.locator("#grid .thumb").count() > 0
    assert page.locator("#grid .thumb[data-drawn=true]").count() == page.locator("#grid .thumb").count()
    assert page.evaluate(KEYS_JS) == api_tokens(session.base, first["text"], "")
    # The example is state like any run: the URL holds it, so a reload or a shared link shows the same.
    assert parse_qs(urlparse(page.url).query)["text"] == [first["text"]]
    assert not page.locator("#error").is_visible()


def test_a_url_with_text_runs_that_text_not_the_example(session: Any) -> None:
    bodies: list[str] = []
    session.page.on("request", lambda request: bodies.append(request.post_data or ""))
    page = session.open("?text=Dogs+chase+cats.")
    session.wait_ready()
    assert page.input_value("#text") == "Dogs chase cats."
    assert page.evaluate(KEYS_JS) == api_tokens(session.base, "Dogs chase cats.", "")
    # The example was never sent: every request of the page asked about the URL's text.
    sent = [json.loads(body)["text"] for body in bodies if body]
    assert sent and set(sent) == {"Dogs chase cats."}


def test_each_example_chip_fills_the_form_and_runs_it(session: Any) -> None:
    page = session.open()  # an empty text: nothing runs until a chip is pressed
    chips = page.locator("#examples button.chip")
    # The examples on the page's own models; the chat example on the bundled LLM only where it is served.
    with urllib.request.urlopen(f"{session.base}/api/models", timeout=30) as response:  # noqa: S310 (local)
        served = {m["name"] for m in json.load(response)["models"]}
    offered = [e for e in examples(page) if e.get("model") in (None, *served)]
    assert chips.count() == len(offered)
    chat = [e for e in examples(page) if e["id"] == "chat"]
    assert (chat[0]["model"] in served) == (bundled_gguf() is not None)  # make run's server offers it
    assert (page.locator("#examples button.chip[data-example=chat]").count() == 1) == (
        chat[0]["model"] in served
    )
    listed = [e for e in offered if not e.get("model")]
    assert [example["pair"] != "" for example in listed] == [False, True, False]  # one sentence pair
    for index, example in enumerate(listed):
        page.evaluate("document.body.dataset.state = 'idle'")
        chip = chips.nth(index)
        if index == 1:
            # Keyboard reachable: a chip is a button, so focus and Enter press it.
            chip.focus()
            page.keyboard.press("Enter")
        else:
            chip.click()
        session.wait_ready()
        assert page.input_value("#text") == example["text"]
        assert page.input_value("#text-pair") == example["pair"]
        tokens = api_tokens(session.base, example["text"], example["pair"])
        assert page.evaluate(KEYS_JS) == tokens
        params = parse_qs(urlparse(page.url).query)
        assert params["text"] == [example["text"]] and params.get("pair", [""]) == [example["pair"]]
    # The long paragraph is long: about 120 tokens (tokenizers differ), well past the axis-label range.
    assert 100 <= len(tokens) <= 160


def test_placeholders_are_instructions_drawn_lighter_than_text(session: Any) -> None:
    page = session.open()
    placeholder = page.get_attribute("#text", "placeholder") or ""
    assert placeholder.startswith("Type")  # an instruction, not a sentence that looks typed
    colours = page.evaluate("""() => {
      const box = document.querySelector('#text');
      return [getComputedStyle(box).color, getComputedStyle(box, '::placeholder').color];
    }""")
    text, hint = ([int(c) for c in colour[colour.index("(") + 1 : -1].split(",")[:3]] for colour in colours)
    assert (
        sum(hint) > sum(text) + 150
    )  # lighter: ink and hint channel sums are 116 and 498; 150 rules out a dark hint


def test_the_pair_example_runs_where_the_chat_template_was_on(session: Any, grouped_model: str) -> None:
    # The tiny Llama has a chat template, which takes no pair: the pair chip turns it off to run.
    page = session.open(f"?text=&model={grouped_model}&chat=1")
    assert page.is_checked("#chat")
    pair = examples(page)[1]
    page.locator("#examples button.chip").nth(1).click()
    session.wait_ready()
    assert not page.is_checked("#chat")
    params = parse_qs(urlparse(page.url).query)
    assert params["pair"] == [pair["pair"]] and "chat" not in params
