"""The model registry: allowlist, lazy single load under concurrency, broken models reported, not fatal."""

from __future__ import annotations

import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient
from tolerances import FORWARD_JSON

import mha
from app.errors import ModelUnavailableError, UnknownModelError
from app.main import create_app
from app.registry import Registry, scan_models_dir

TEXT = "Tiny models still attend somewhere."


def test_registry_loads_each_model_once_under_concurrent_first_use() -> None:
    calls = {"a": 0, "b": 0}
    gate = threading.Event()

    def loader(name: str):  # type: ignore[no-untyped-def]
        def load() -> str:
            calls[name] += 1
            gate.wait(5)  # hold every racing thread inside the first load
            return f"model-{name}"

        return load

    registry = Registry({"a": loader("a"), "b": loader("b")}, default="a")
    with ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(registry.get, "a" if i % 2 else "b") for i in range(32)]
        time.sleep(0.2)
        gate.set()
        results = [f.result() for f in futures]
    assert calls == {"a": 1, "b": 1}
    assert sorted(set(results)) == [("a", "model-a"), ("b", "model-b")]


def test_registry_reports_a_failed_load_and_keeps_the_others() -> None:
    def broken() -> str:
        raise OSError("disk on fire")

    registry = Registry({"good": lambda: "ok", "bad": broken}, default="good")
    with pytest.raises(ModelUnavailableError, match="disk on fire"):
        registry.get("bad")
    with pytest.raises(ModelUnavailableError):  # not retried on every request
        registry.get("bad")
    assert registry.get(None) == ("good", "ok")
    errors = {entry.name: entry.error for entry in registry}
    assert errors == {"good": None, "bad": "OSError: disk on fire"}


@pytest.mark.parametrize("name", ["../good", "/etc/passwd", "good/", " good", "GOOD", ""])
def test_registry_resolves_exact_names_only(name: str) -> None:
    registry = Registry({"good": lambda: "ok"}, default="good")
    with pytest.raises(UnknownModelError, match="known models: good"):
        registry.resolve(name)


def test_registry_rejects_an_unregistered_default() -> None:
    with pytest.raises(ValueError, match="'missing' is not registered"):
        Registry({"a": lambda: 1}, default="missing")


def test_scan_models_dir_registers_folders_with_config(tmp_path: Path) -> None:
    (tmp_path / "bert-tiny").mkdir()
    (tmp_path / "bert-tiny" / "config.json").write_text("{}")
    (tmp_path / "no-config").mkdir()
    (tmp_path / "file.json").write_text("{}")
    assert scan_models_dir(tmp_path) == {"bert-tiny": tmp_path / "bert-tiny"}
    with pytest.raises(ValueError, match="not a directory"):
        scan_models_dir(tmp_path / "file.json")


# -- through the HTTP API with real (tiny) checkpoints -----------------------------------------------


@pytest.fixture(scope="module")
def zoo(tiny_checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A models_dir like compose's /models: two scanned checkpoints and one broken one."""
    root = tmp_path_factory.mktemp("models")
    shutil.copytree(tiny_checkpoints["roberta"], root / "roberta-tiny")
    shutil.copytree(tiny_checkpoints["distilbert"], root / "distilbert-tiny")
    broken = root / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "t5"}')
    return root


@pytest.fixture(scope="module")
def zoo_client(tiny_checkpoints: dict[str, Path], zoo: Path, make_settings):  # type: ignore[no-untyped-def]
    settings = make_settings(
        models={"bert-tiny": tiny_checkpoints["bert"], "gpt2-tiny": tiny_checkpoints["gpt2"]}, models_dir=zoo
    )
    with TestClient(create_app(settings)) as client:
        yield client


def test_models_lists_allowlisted_and_scanned(zoo_client: TestClient) -> None:
    names = [m["name"] for m in zoo_client.get("/api/models").json()["models"]]
    assert set(names) == {
        "all-MiniLM-L6-v2",
        "random",
        "bert-tiny",
        "gpt2-tiny",
        "roberta-tiny",
        "distilbert-tiny",
        "broken",
    }


@pytest.mark.parametrize("name", ["bert-tiny", "gpt2-tiny", "roberta-tiny", "distilbert-tiny"])
def test_each_family_answers_like_mha(zoo_client: TestClient, tiny_checkpoints, zoo, name: str) -> None:  # type: ignore[no-untyped-def]
    body = zoo_client.post("/api/attention", json={"text": TEXT, "model": name}).json()
    family = name.removesuffix("-tiny")
    path = tiny_checkpoints[family] if family in ("bert", "gpt2") else zoo / name
    expected = mha.load_pretrained(path, device="cpu").attend(TEXT)
    assert body["tokens"] == expected.tokens
    got = torch.tensor(body["attention"], dtype=torch.float64)
    # Two separate float32 forwards (the service's and this one), and the JSON's 6-decimal rounding.
    torch.testing.assert_close(got, expected.attentions.double(), atol=FORWARD_JSON, rtol=0)
    assert body["causal"] is (family == "gpt2")
    if family == "gpt2":
        assert torch.triu(got, diagonal=1).abs().max() == 0
    entry = next(m for m in zoo_client.get("/api/models").json()["models"] if m["name"] == name)
    assert entry["loaded"] is True and entry["family"] == family and entry["error"] is None


def test_broken_checkpoint_is_reported_not_fatal(zoo_client: TestClient) -> None:
    r = zoo_client.post("/api/attention", json={"text": TEXT, "model": "broken"})
    assert r.status_code == 503
    assert "broken" in r.json()["detail"] and "t5" in r.json()["detail"]
    entry = next(m for m in zoo_client.get("/api/models").json()["models"] if m["name"] == "broken")
    assert entry["loaded"] is False and "t5" in entry["error"]
    assert zoo_client.get("/api/health").json()["status"] == "ok"
    assert zoo_client.post("/api/attention", json={"text": TEXT}).status_code == 200


def test_a_model_directory_is_not_a_model_name(zoo_client: TestClient, zoo: Path) -> None:
    r = zoo_client.post("/api/attention", json={"text": TEXT, "model": str(zoo / "roberta-tiny")})
    assert r.status_code == 404
    assert "roberta-tiny" in r.json()["detail"]  # listed as a known name


def test_a_broken_default_model_leaves_the_service_up(make_settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')  # no weights, no tokenizer
    app = create_app(make_settings(models={"bad": tmp_path}, default_model="bad"))
    with TestClient(app) as client:
        health = client.get("/api/health")
        assert health.status_code == 503 and health.json()["status"] == "unavailable"
        entry = next(m for m in client.get("/api/models").json()["models"] if m["name"] == "bad")
        assert entry["loaded"] is False and entry["error"]
        assert client.post("/api/attention", json={"text": TEXT}).status_code == 503
        ok = client.post("/api/attention", json={"text": TEXT, "model": "all-MiniLM-L6-v2"})
        assert ok.status_code == 200


def test_input_the_model_cannot_read_is_422_not_500(tmp_path: Path, make_settings) -> None:  # type: ignore[no-untyped-def]
    from checkpoints import build_checkpoint

    # A BERT with one token type cannot read a pair: mha refuses it with an InputError, a client's mistake.
    single = build_checkpoint("bert", tmp_path / "bert-one-type", type_vocab_size=1)
    with TestClient(create_app(make_settings(models={"one-type": single}))) as client:
        body = {"text": TEXT, "text_pair": "A second sentence.", "model": "one-type"}
        response = client.post("/api/attention", json=body)
        assert response.status_code == 422, response.text
        assert "cannot read a pair" in response.json()["detail"]
        assert client.post("/api/attention", json={"text": TEXT, "model": "one-type"}).status_code == 200
