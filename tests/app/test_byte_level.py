"""`byte_level`: the model list and every attention header say whether tokens are a byte-level BPE's, read
from the tokenizer (its pre-tokenizer or decoder), not from the family's name."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app import compact
from app.main import create_app
from app.settings import Settings
from tests.app.started import serving

BYTE_LEVEL = {"gpt2": True, "roberta": True, "llama": True, "bert": False, "distilbert": False}
TEXT = "The cat sat.\nThe dog ran."


@pytest.fixture(scope="module")
def served(tiny_checkpoints: dict[str, Path], make_settings: Callable[..., Settings]) -> Iterator[TestClient]:
    models = {family: tiny_checkpoints[family] for family in BYTE_LEVEL}
    with serving(create_app(make_settings(models=models))) as client:
        yield client


def test_model_list_says_byte_level_once_loaded(served: TestClient) -> None:
    before = {m["name"]: m for m in served.get("/api/models").json()["models"]}
    assert before["gpt2"]["byte_level"] is None  # not loaded yet: unknown, not a guess
    assert before["all-MiniLM-L6-v2"]["byte_level"] is False  # WordPiece
    for family in BYTE_LEVEL:
        assert served.post("/api/attention", json={"text": TEXT, "model": family}).status_code == 200
    entries = {m["name"]: m for m in served.get("/api/models").json()["models"]}
    assert {family: entries[family]["byte_level"] for family in BYTE_LEVEL} == BYTE_LEVEL


@pytest.mark.parametrize("family", [*BYTE_LEVEL, "all-MiniLM-L6-v2"])
def test_attention_headers_carry_the_flag(served: TestClient, family: str) -> None:
    expected = BYTE_LEVEL.get(family, False)
    body = served.post("/api/attention", json={"text": TEXT, "model": family}).json()
    assert body["byte_level"] is expected
    if expected:  # the flag is what the tokens show: the space before "cat" spelled "Ġ"
        assert any(token.startswith("Ġ") for token in body["tokens"])
    query = {"text": TEXT, "model": family}
    header, _ = compact.decode(served.post("/api/attention/compact", json=query).content)
    assert header["byte_level"] is expected
    rollout, _ = compact.decode(served.post("/api/rollout/compact", json=query).content)
    assert rollout["byte_level"] is expected


def test_words_are_never_byte_level(served: TestClient) -> None:
    # Word labels are slices of the text: a literal "Ġ" typed in it is a letter, not a space byte.
    body = served.post("/api/attention", json={"text": "Ġx cat", "model": "gpt2", "words": True}).json()
    assert body["byte_level"] is False and body["tokens"][0] == "Ġx"
