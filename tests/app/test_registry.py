"""The model registry: allowlist, lazy single load under concurrency, broken models reported, not fatal."""

from __future__ import annotations

import re
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient
from tolerances import FORWARD_JSON

import mha
from app.errors import ModelUnavailableError, UnknownModelError
from app.main import create_app
from app.registry import Registry
from app.settings import Settings
from tests.app.started import serving

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
    calls = {"bad": 0}

    def broken() -> str:
        calls["bad"] += 1
        raise OSError("disk on fire")

    registry = Registry({"good": lambda: "ok", "bad": broken}, default="good")
    with pytest.raises(ModelUnavailableError, match="disk on fire"):
        registry.get("bad")
    with pytest.raises(ModelUnavailableError):  # not retried on every request
        registry.get("bad")
    assert calls["bad"] == 1
    assert registry.get(None) == ("good", "ok")
    errors = {entry.name: entry.error for entry in registry}
    assert errors == {"good": None, "bad": "OSError: disk on fire"}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_failed_load_is_retried_after_an_exponential_capped_back_off() -> None:
    clock = Clock()
    attempts: list[float] = []
    fixed_at = {"time": float("inf")}

    def flaky() -> str:
        attempts.append(clock.now)
        if clock.now < fixed_at["time"]:
            raise OSError("checkpoint being copied")
        return "model"

    registry = Registry(
        {"a": lambda: "a", "flaky": flaky}, default="a", retry_seconds=2, retry_max_seconds=10, clock=clock
    )
    waits = []
    for _ in range(6):  # each failure doubles the wait (2, 4, 8), up to the cap (10)
        with pytest.raises(ModelUnavailableError, match="being copied"):
            registry.get("flaky")
        entry = next(e for e in registry if e.name == "flaky")
        waits.append(entry.retry_at - clock.now)
        clock.now = entry.retry_at - 0.001
        with pytest.raises(ModelUnavailableError):  # still backing off: no attempt
            registry.get("flaky")
        clock.now = entry.retry_at
    assert waits == [2, 4, 8, 10, 10, 10]
    assert len(attempts) == 6
    assert entry.error == "OSError: checkpoint being copied"  # /api/models shows it meanwhile
    fixed_at["time"] = clock.now  # the operator fixed it: the next request after the back-off loads it
    assert registry.get("flaky") == ("flaky", "model")
    assert entry.error is None and entry.failures == 0


def test_startup_checks_record_errors_at_once_and_are_retried_like_loads() -> None:
    clock = Clock()
    loads = {"good": 0, "bad": 0}
    broken = {"bad": True}

    def loader(name: str):  # type: ignore[no-untyped-def]
        def load() -> str:
            loads[name] += 1
            return name

        return load

    def check_bad() -> None:
        if broken["bad"]:
            raise ValueError("no tokenizer files (tokenizer.json, vocab.json, merges.txt) in /models/bad")

    checked: list[str] = []
    registry = Registry(
        {"good": loader("good"), "bad": loader("bad")},
        default="good",
        checks={"good": lambda: checked.append("good"), "bad": check_bad},
        retry_seconds=5,
        clock=clock,
    )
    registry.check_all()
    errors = {entry.name: entry.error for entry in registry}
    assert errors == {
        "good": None,
        "bad": "ValueError: no tokenizer files (tokenizer.json, vocab.json, merges.txt) in /models/bad",
    }
    assert loads == {"good": 0, "bad": 0}  # checks load nothing
    with pytest.raises(ModelUnavailableError, match="tokenizer files"):
        registry.get("bad")  # within the back-off: no new attempt
    clock.now += 5
    with pytest.raises(ModelUnavailableError, match="tokenizer files"):
        registry.get("bad")  # retried: the check runs again before the loader, and fails again
    assert loads["bad"] == 0
    broken["bad"] = False
    clock.now += 10
    assert registry.get("bad") == ("bad", "bad")
    assert registry.get("good") == ("good", "good")
    assert checked == ["good", "good"]  # at startup, and before the load


def test_registry_rejects_checks_for_unknown_names_and_bad_back_offs() -> None:
    with pytest.raises(ValueError, match="unregistered"):
        Registry({"a": lambda: 1}, default="a", checks={"b": lambda: None})
    with pytest.raises(ValueError, match="retry_seconds"):
        Registry({"a": lambda: 1}, default="a", retry_seconds=10, retry_max_seconds=5)


def test_models_shows_a_failed_check_right_after_startup(make_settings) -> None:  # type: ignore[no-untyped-def]
    app = create_app(make_settings())
    service = app.state.service

    def check_random() -> None:
        raise ValueError("config.json: vocab_size (5) is smaller than the tokenizer's vocabulary (30522)")

    service.models.registry = Registry(
        {entry.name: entry.loader for entry in service.models.registry},
        default=service.models.registry.default,
        checks={"random": check_random},
    )
    with serving(app) as client:
        entry = next(m for m in client.get("/api/models").json()["models"] if m["name"] == "random")
        assert entry["loaded"] is False and "vocab_size (5)" in entry["error"]  # before any request named it
        r = client.post("/api/attention", json={"text": TEXT, "model": "random"})
        assert r.status_code == 503 and "vocab_size (5)" in r.json()["detail"]


@pytest.mark.parametrize("name", ["../good", "/etc/passwd", "good/", " good", "GOOD", ""])
def test_registry_resolves_exact_names_only(name: str) -> None:
    registry = Registry({"good": lambda: "ok"}, default="good")
    with pytest.raises(UnknownModelError, match="known models: good"):
        registry.resolve(name)


def test_registry_rejects_an_unregistered_default() -> None:
    with pytest.raises(ValueError, match="'missing' is not registered"):
        Registry({"a": lambda: 1}, default="missing")


# -- through the HTTP API with real (tiny) checkpoints -----------------------------------------------


@pytest.fixture(scope="module")
def zoo(tiny_checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A models_dir like compose's /models: two scanned checkpoints and one broken one."""
    root = tmp_path_factory.mktemp("models")
    shutil.copytree(tiny_checkpoints["roberta"], root / "roberta-tiny")
    shutil.copytree(tiny_checkpoints["distilbert"], root / "distilbert-tiny")
    broken = root / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "xlnet"}')
    return root


@pytest.fixture(scope="module")
def zoo_client(tiny_checkpoints: dict[str, Path], zoo: Path, make_settings):  # type: ignore[no-untyped-def]
    settings = make_settings(
        models={"bert-tiny": tiny_checkpoints["bert"], "gpt2-tiny": tiny_checkpoints["gpt2"]}, models_dir=zoo
    )
    with serving(create_app(settings)) as client:
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
    assert "broken" in r.json()["detail"] and "xlnet" in r.json()["detail"]
    entry = next(m for m in zoo_client.get("/api/models").json()["models"] if m["name"] == "broken")
    assert entry["loaded"] is False and "xlnet" in entry["error"]
    assert zoo_client.get("/api/health").json()["status"] == "ok"
    assert zoo_client.post("/api/attention", json={"text": TEXT}).status_code == 200


def test_a_model_directory_is_not_a_model_name(zoo_client: TestClient, zoo: Path) -> None:
    r = zoo_client.post("/api/attention", json={"text": TEXT, "model": str(zoo / "roberta-tiny")})
    assert r.status_code == 404
    assert "roberta-tiny" in r.json()["detail"]  # listed as a known name


def test_a_broken_default_model_leaves_the_service_up(make_settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')  # no weights, no tokenizer
    app = create_app(make_settings(models={"bad": tmp_path}, default_model="bad"))
    with serving(app) as client:
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
    with serving(create_app(make_settings(models={"one-type": single}))) as client:
        body = {"text": TEXT, "text_pair": "A second sentence.", "model": "one-type"}
        response = client.post("/api/attention", json=body)
        assert response.status_code == 422, response.text
        assert "cannot read a pair" in response.json()["detail"]
        assert client.post("/api/attention", json={"text": TEXT, "model": "one-type"}).status_code == 200


def test_a_checkpoint_without_vocabulary_is_named_at_startup(  # type: ignore[no-untyped-def]
    tiny_checkpoints: dict[str, Path], tmp_path: Path, make_settings
) -> None:
    # A GPT-2 directory with tokenizer_config.json but no vocabulary used to load and answer
    # every request with "text gives no tokens".
    broken = tmp_path / "gpt2-novocab"
    shutil.copytree(tiny_checkpoints["gpt2"], broken)
    for file in ("tokenizer.json", "vocab.json", "merges.txt"):
        (broken / file).unlink(missing_ok=True)
    assert (broken / "tokenizer_config.json").exists()
    with serving(create_app(make_settings(models={"gpt2-novocab": broken}))) as client:
        entry = next(m for m in client.get("/api/models").json()["models"] if m["name"] == "gpt2-novocab")
        assert entry["loaded"] is False and "tokenizer" in entry["error"]  # before any request named it
        r = client.post("/api/attention", json={"text": TEXT, "model": "gpt2-novocab"})
        assert r.status_code == 503 and "vocab.json" in r.json()["detail"]
        assert client.post("/api/attention", json={"text": TEXT}).status_code == 200


def test_broken_weights_are_named_by_models_right_after_startup(  # type: ignore[no-untyped-def]
    tiny_checkpoints: dict[str, Path], tmp_path: Path, make_settings
) -> None:
    from broken_checkpoints import BROKEN_WEIGHTS, break_checkpoint

    # One folder per way to break a checkpoint's weights (or its config against them), beside a good one.
    broken = {variant.replace(" ", "-"): variant for variant in BROKEN_WEIGHTS}
    for name, variant in broken.items():
        break_checkpoint(tiny_checkpoints["bert"], tmp_path / name, variant)
    shutil.copytree(tiny_checkpoints["bert"], tmp_path / "good")
    with serving(create_app(make_settings(models_dir=tmp_path))) as client:
        # Before any request named them: the startup check read each one's headers.
        entries = {m["name"]: m for m in client.get("/api/models").json()["models"]}
        for name, variant in broken.items():
            _breaks, error, match = BROKEN_WEIGHTS[variant]
            assert entries[name]["loaded"] is False, name
            assert re.search(f"^{error.__name__}: .*{match}", entries[name]["error"], re.DOTALL), name
        assert entries["good"]["error"] is None and entries["good"]["architecture"] == "encoder"
        for name, variant in broken.items():  # on use: 503 with the same reason, never a 500
            for route in ("/api/attention", "/api/attention/compact", "/api/trace/tokens"):
                r = client.post(route, json={"text": TEXT, "model": name})
                assert r.status_code == 503, (name, route, r.text)
                assert re.search(BROKEN_WEIGHTS[variant][2], r.json()["detail"], re.DOTALL), name
        assert client.post("/api/attention", json={"text": TEXT, "model": "good"}).status_code == 200
        assert client.get("/api/health").json()["status"] == "ok"


def test_refused_entries_are_listed_by_the_service(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    """/api/models names each refused entry with its reason from startup (a FIFO is never opened, so the
    start is not held), and a request for one is a 503 with the same sentence."""
    import os

    os.mkfifo(tmp_path / "pipe.gguf")
    (tmp_path / "zero.gguf").symlink_to("/dev/zero")
    (tmp_path / "tiny.gguf").write_bytes(b"GGUF" + bytes(4))  # a regular file, cut short: the header check
    with serving(create_app(make_settings(models_dir=tmp_path))) as client:
        entries = {entry["name"]: entry for entry in client.get("/api/models").json()["models"]}
        assert "is a FIFO, not a GGUF file" in entries["pipe"]["error"]
        assert "outside the models folder" in entries["zero"]["error"]
        assert "not a readable GGUF file" in entries["tiny"]["error"]
        answer = client.post("/api/attention", json={"text": "Hello.", "model": "pipe"})
        assert answer.status_code == 503 and "is a FIFO" in answer.json()["detail"]


def test_a_failed_load_logs_its_error_quoted(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 48 E6: a load's error often holds a path from the operator's disk (mha's messages name files
    unquoted), and a path may hold a newline: the failure's log line writes the error quoted, on one line."""

    def broken() -> object:
        raise OSError("cannot read /models/evil\n2026-01-01 INFO app: forged")

    registry: Registry[object] = Registry({"evil": broken}, default="evil")
    with caplog.at_level("ERROR", logger="app.registry"), pytest.raises(ModelUnavailableError):
        registry.get("evil")
    (message,) = [r.getMessage() for r in caplog.records if "failed its load" in r.getMessage()]
    assert "\n" not in message and "evil\\n2026" in message
