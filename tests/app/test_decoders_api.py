"""Today's decoder families through the HTTP API: grouped heads reported, and continuations served."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from checkpoints import D_HEADS, D_KV_HEADS, DECODER_FAMILIES
from fastapi.testclient import TestClient
from tolerances import FORWARD_JSON

import mha
from app import compact
from app.main import create_app
from app.settings import Settings
from tests.app.started import serving

PROMPT = "The cat sat on the mat. The dog"


@pytest.fixture(scope="module")
def decoders(
    tiny_checkpoints: dict[str, Path], make_settings: Callable[..., Settings]
) -> Iterator[TestClient]:
    models = {family: tiny_checkpoints[family] for family in DECODER_FAMILIES}
    with serving(create_app(make_settings(models=models, max_new_tokens=6))) as client:
        yield client


def test_models_report_family_and_kv_heads(decoders: TestClient) -> None:
    for family in DECODER_FAMILIES:  # a request loads each
        assert decoders.post("/api/attention", json={"text": "Hi.", "model": family}).status_code == 200
    entries = {m["name"]: m for m in decoders.get("/api/models").json()["models"]}
    for family in DECODER_FAMILIES:
        assert entries[family]["family"] == family and entries[family]["causal"] is True
        assert (entries[family]["heads"], entries[family]["kv_heads"]) == (D_HEADS, D_KV_HEADS)
    minilm = entries["all-MiniLM-L6-v2"]
    assert minilm["kv_heads"] == minilm["heads"] == 12  # no grouping


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_a_continuation_is_served_as_mha_gives_it(
    decoders: TestClient, tiny_checkpoints: dict[str, Path], family: str
) -> None:
    body = decoders.post("/api/attention", json={"text": PROMPT, "model": family, "max_new_tokens": 5}).json()
    expected = mha.load_pretrained(tiny_checkpoints[family], device="cpu").attend(PROMPT, max_new_tokens=5)
    assert body["tokens"] == expected.tokens and body["generated"] == expected.generated >= 1
    assert body["kv_heads"] == D_KV_HEADS
    got = torch.tensor(body["attention"], dtype=torch.float64)
    # Two float32 forwards (the service's and this one) and the JSON's 6 decimals.
    torch.testing.assert_close(got, expected.attentions.double(), atol=FORWARD_JSON, rtol=0)
    # The page's binary route carries the same header, and the insight routes read the same view.
    raw = decoders.post(
        "/api/attention/compact", json={"text": PROMPT, "model": family, "max_new_tokens": 5}
    ).content
    header, _ = compact.decode(raw)
    assert header["generated"] == expected.generated and header["tokens"] == expected.tokens
    analysis = decoders.post("/api/analysis", json={"text": PROMPT, "model": family, "max_new_tokens": 5})
    assert analysis.status_code == 200 and analysis.json()["tokens"] == expected.tokens
    # Without max_new_tokens the prompt alone: another answer, not the cached continuation.
    alone = decoders.post("/api/attention", json={"text": PROMPT, "model": family}).json()
    assert alone["generated"] == 0 and alone["tokens"] == expected.tokens[: expected.prompt_n]


def test_continuations_refused_clearly(decoders: TestClient) -> None:
    encoder = decoders.post("/api/attention", json={"text": PROMPT, "max_new_tokens": 3})
    assert encoder.status_code == 422 and "encoder" in encoder.json()["detail"]
    over = decoders.post("/api/attention", json={"text": PROMPT, "model": "llama", "max_new_tokens": 7})
    assert over.status_code == 422 and "HEADSCOPE_MAX_NEW_TOKENS" in over.json()["detail"]
    for bad in (-1, 1.5, "3", 10**6):
        r = decoders.post("/api/attention", json={"text": PROMPT, "model": "llama", "max_new_tokens": bad})
        assert r.status_code == 422


def test_chat_template_is_asked_for_never_silent(
    decoders: TestClient, tiny_checkpoints: dict[str, Path]
) -> None:
    plain = decoders.post("/api/attention", json={"text": PROMPT, "model": "llama"}).json()
    chat = decoders.post("/api/attention", json={"text": PROMPT, "model": "llama", "chat": True}).json()
    expected = mha.load_pretrained(tiny_checkpoints["llama"], device="cpu").attend(PROMPT, chat=True)
    assert chat["tokens"] == expected.tokens and chat["n"] > plain["n"]  # the template's tokens, shown
    words = decoders.post(
        "/api/attention", json={"text": PROMPT, "model": "llama", "chat": True, "words": True}
    )
    # Words are sliced from the rendered template (offsets index into it), not from the bare prompt.
    labels = [label.strip() for label in words.json()["tokens"]]
    assert words.status_code == 200 and {"cat", "sat", "mat"} <= set(labels)
    entries = {m["name"]: m for m in decoders.get("/api/models").json()["models"]}
    assert entries["llama"]["chat_template"] is True and entries["mistral"]["chat_template"] is False
    no_template = decoders.post("/api/attention", json={"text": PROMPT, "model": "mistral", "chat": True})
    assert no_template.status_code == 422 and "no chat template" in no_template.json()["detail"]
    with_pair = decoders.post(
        "/api/attention", json={"text": PROMPT, "text_pair": "Hi.", "model": "llama", "chat": True}
    )
    assert with_pair.status_code == 422 and "one user turn" in with_pair.json()["detail"]
