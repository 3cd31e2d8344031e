"""The stores found by themselves, as the service lists and serves them (issue 34 item 3): stand-in ollama,
LM Studio and Hugging Face stores in tmp folders, every folder set explicitly so that the machine's own
stores are never looked at."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from gguf_files import write_gguf
from hostile_stores import FORGED, KINDS, NEWLINE, Hostile, lay_out
from store_files import OLLAMA_MODEL, hf_snapshot, lmstudio_model, ollama_manifest, ollama_model

from app.main import create_app
from app.settings import Settings
from mha.loading.gguf import folders as model_cache
from tests.app.started import serving

LIBRARY = ("registry.ollama.ai", "library")
TEXT = "The cat sat on the mat."


def store_folders(root: Path) -> dict[str, Path]:
    """The three store settings, each an (empty) tmp folder of its own under `root`."""
    folders = {key: root / key for key in ("ollama_models", "lmstudio_models", "hf_cache")}
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    return folders


@pytest.fixture(scope="module")
def stores_root(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoints: dict[str, Path]) -> Path:
    root = tmp_path_factory.mktemp("stores")
    folders = store_folders(root)
    tiny = write_gguf(tiny_checkpoints["llama"], root / "tiny.gguf", qtype="Q8_0")
    bert_arch = write_gguf(tiny_checkpoints["llama"], root / "other.gguf", architecture="bert")
    ollama = folders["ollama_models"]
    ollama_model(ollama, (*LIBRARY, "tiny", "q8"), tiny)
    ollama_model(ollama, (*LIBRARY, "other", "latest"), bert_arch)
    ollama_model(ollama, (*LIBRARY, "notgguf", "latest"), b"just some text, not a model")
    ollama_manifest(ollama, (*LIBRARY, "text", "latest"), "not json")
    ollama_manifest(
        ollama, (*LIBRARY, "gone", "latest"), [{"mediaType": OLLAMA_MODEL, "digest": "sha256:" + "0" * 64}]
    )
    ollama_manifest(
        ollama,
        (*LIBRARY, "escape", "latest"),
        [{"mediaType": OLLAMA_MODEL, "digest": "sha256:../../etc/passwd"}],
    )
    # the same name in a models folder: the folder's entry wins over the store's
    ollama_model(ollama, (*LIBRARY, "clash", "latest"), tiny)
    (root / "models").mkdir()
    (root / "models" / "clash:latest.gguf").write_bytes(b"GGUF" + bytes(4))
    lmstudio_model(folders["lmstudio_models"], "pub", "Tiny-GGUF", "tiny-Q8_0.gguf", tiny)
    hf_snapshot(folders["hf_cache"], "org/tiny-qwen2", tiny_checkpoints["qwen2"])
    return root


@pytest.fixture(scope="module")
def client(stores_root: Path, make_settings: Callable[..., Settings]) -> Iterator[TestClient]:
    settings = make_settings(discover=True, models_dir=stores_root / "models", **store_folders(stores_root))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(model_cache.CACHE_ENV, str(stores_root / "headscope-cache"))
        with serving(create_app(settings)) as test_client:
            yield test_client


def entries(client: TestClient) -> dict[str, Any]:
    response = client.get("/api/models")
    assert response.status_code == 200
    return {m["name"]: m for m in response.json()["models"]}


def test_every_store_is_listed_with_its_facts_before_loading(client: TestClient, stores_root: Path) -> None:
    models = entries(client)
    tiny = models["tiny:q8"]
    assert (tiny["source"], tiny["header_family"], tiny["quantization"], tiny["loaded"]) == (
        "ollama",
        "llama",
        "Q8_0",
        False,
    )
    assert tiny["size_bytes"] == (stores_root / "tiny.gguf").stat().st_size and tiny["parameters"] > 0
    assert tiny["architecture"] == "decoder" and tiny["error"] is None
    lms = models["pub/Tiny-GGUF/tiny-Q8_0"]
    assert (lms["source"], lms["parameters"]) == ("lmstudio", tiny["parameters"])
    hf = models["org/tiny-qwen2"]
    assert (hf["source"], hf["header_family"], hf["error"]) == ("huggingface", "qwen2", None)
    assert models["all-MiniLM-L6-v2"]["source"] == "bundled" and models["all-MiniLM-L6-v2"]["parameters"] > 0
    assert models["clash:latest"]["source"] == "models_dir"  # the models folder over the store


def test_the_models_list_and_the_page_name_every_source_by_its_label(client: TestClient) -> None:
    """/api/models sends the table of sources (mha.loading.sources.SOURCES), in the menu's order, each with
    the label the page titles its group with; the page's first data carries the same, so the page keeps no
    list of its own. Every model's source is one of them."""
    import json
    import re

    from mha.loading.sources import SOURCES

    answer = client.get("/api/models").json()
    assert answer["sources"] == [{"id": source.id, "label": source.label} for source in SOURCES]
    assert {m["source"] for m in answer["models"]} <= {source["id"] for source in answer["sources"]}
    page = client.get("/").text
    block = re.search(r'<script[^>]*id="initial-state"[^>]*>(.*?)</script>', page, re.DOTALL)
    assert block is not None and json.loads(block.group(1))["sources"] == answer["sources"]


def test_entries_that_cannot_load_are_listed_with_their_reason(client: TestClient) -> None:
    models = entries(client)
    reasons = {
        "other:latest": "architecture 'bert'",
        "notgguf:latest": "is not a GGUF file",
        "text:latest": "not JSON",
        "gone:latest": "is missing",
        "escape:latest": "is not sha256:<64 hex digits>",
    }
    for name, reason in reasons.items():
        assert models[name]["error"] is not None and reason in models[name]["error"], (name, models[name])
        assert models[name]["source"] == "ollama"
        r = client.post("/api/attention", json={"text": TEXT, "model": name})
        assert r.status_code == 503 and reason in r.json()["detail"], (name, r.text)


def test_a_store_model_answers_by_its_name(client: TestClient) -> None:
    for name in ("tiny:q8", "org/tiny-qwen2"):
        r = client.post("/api/attention/compact", json={"text": TEXT, "model": name})
        assert r.status_code == 200, (name, r.text[:300])
    assert entries(client)["tiny:q8"]["loaded"] is True


def test_precedence_and_the_switch(stores_root: Path, make_settings: Callable[..., Settings]) -> None:
    from app.service.offers import find_models

    folders = store_folders(stores_root)
    mine = stores_root / "tiny.gguf"
    offers = find_models(make_settings(discover=True, models={"tiny:q8": mine}, **folders))
    assert offers["tiny:q8"].source == "operator" and offers["tiny:q8"].path == mine
    assert offers["org/tiny-qwen2"].source == "huggingface"
    off = find_models(make_settings(discover=False, **folders))
    assert {offer.source for offer in off.values()} == {"bundled"}


def test_startup_scans_every_folder_and_store_once(
    stores_root: Path, make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The models folder was scanned four times at startup (loaders and checks, found and refused): now
    find_models looks at each folder and store once, and the service shares what it found."""
    from dataclasses import replace

    from mha.loading.sources import table

    calls: list[str] = []

    def counted(name: str, scan: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return scan(*args, **kwargs)

        return wrapper

    rows = tuple(replace(source, scan=counted(source.id, source.scan)) for source in table.SOURCES)
    monkeypatch.setattr(table, "SOURCES", rows)
    settings = make_settings(discover=True, models_dir=stores_root / "models", **store_folders(stores_root))
    create_app(settings)
    assert sorted(calls) == ["bundled", "huggingface", "lmstudio", "models_dir", "ollama", "operator"]


def test_the_startup_imports_transformers_on_one_thread_before_its_check_and_load_threads() -> None:
    """Two threads importing transformers' lazy modules for the first time at once can each meet the
    other's half-initialised module (the default failed with "cannot import name 'AutoConfig'" while a
    store's check read its config): Loads runs `prepare` first, then the default's load and the checks."""
    import threading

    from app.registry import Registry
    from app.service.loads import Loads

    order: list[str] = []
    prepared = threading.Event()

    def load() -> str:
        order.append("load" if prepared.is_set() else "load before prepare")
        return "model"

    def check() -> str:
        order.append("check" if prepared.is_set() else "check before prepare")
        return "decoder"

    def prepare() -> None:
        order.append("prepare")
        prepared.set()

    registry: Registry[str] = Registry({"a": load}, default="a", checks={"a": check})
    loads = Loads(lambda: registry, prepare=prepare)
    loads.start()
    try:
        assert loads.started.wait(60)
    finally:
        loads.stop()
    assert order[0] == "prepare" and set(order[1:]) == {"check", "load"}, order  # a check, maybe two


class Records(logging.Handler):
    """Every log record at INFO and above while it is installed on the root logger."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def forged(self) -> list[str]:
        """Messages in which a name's newline would start a line of the log's own format."""
        return [m for m in (r.getMessage() for r in self.records) if f"\n{FORGED}" in m]


@contextmanager
def recorded() -> Iterator[Records]:
    records, root = Records(), logging.getLogger()
    level = root.level
    root.addHandler(records)
    root.setLevel(logging.INFO)
    try:
        yield records
    finally:
        root.removeHandler(records)
        root.setLevel(level)


# Each store's setting, and the models folder's
FOLDERS = {"ollama": "ollama_models", "lmstudio": "lmstudio_models", "huggingface": "hf_cache"}
FOLDERS["models_dir"] = "models_dir"


@pytest.fixture(scope="module")
def hostile(
    tmp_path_factory: pytest.TempPathFactory,
    tiny_checkpoints: dict[str, Path],
    make_settings: Callable[..., Settings],
) -> Iterator[tuple[TestClient, dict[str, Hostile]]]:
    """One service over a hostile store of each kind and a hostile models folder (tests/hostile_stores.py)."""
    root = tmp_path_factory.mktemp("hostile")
    gguf = write_gguf(tiny_checkpoints["llama"], root / "tiny.gguf", qtype="Q8_0")
    laid = {
        kind: lay_out(kind, root / kind, root / f"out-{kind}", gguf, tiny_checkpoints["llama"])
        for kind in KINDS
    }
    settings = make_settings(discover=True, **{FOLDERS[kind]: root / kind for kind in KINDS})
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(model_cache.CACHE_ENV, str(root / "headscope-cache"))
        with serving(create_app(settings)) as test_client:
            yield test_client, laid


@pytest.mark.parametrize("kind", KINDS)
def test_a_hostile_store_costs_neither_the_start_nor_another_model(
    kind: str, hostile: tuple[TestClient, dict[str, Hostile]]
) -> None:
    """Issue 48 (E2, E3): link loops, link chains, nested and huge JSON, a manifest that is a folder and
    folder links leading out stopped the start (a loop, nested JSON) or vanished (a folder link): now the
    service starts, lists each with its reason (the source it came from), answers a request for one with
    that reason, and serves the good models beside them."""
    client, laid = hostile
    models = entries(client)
    for name in laid[kind].found:
        assert (models[name]["source"], models[name]["error"]) == (kind, None), (name, models[name])
    for name, why in {**laid[kind].refused, **laid[kind].failing}.items():
        entry = models[name]
        assert entry["source"] == kind and why in (entry["error"] or ""), (name, entry)
        r = client.post("/api/attention", json={"text": TEXT, "model": name})
        assert r.status_code == 503 and why in r.json()["detail"], (name, r.text)
    good = laid[kind].found[0]
    r = client.post("/api/attention/compact", json={"text": TEXT, "model": good})
    assert r.status_code == 200, (good, r.text[:300])
    assert client.get("/api/health").json()["status"] == "ok"


def test_a_store_name_with_a_newline_forges_no_log_line(
    tmp_path: Path, tiny_checkpoints: dict[str, Path], make_settings: Callable[..., Settings]
) -> None:
    """Issue 48 E6: an ollama model folder, an LM Studio publisher and a models folder file named with a
    newline are served under that name, and no log line writes it raw: mha.loading.pretrained's "loaded
    %s" started a line of its own with what followed the newline, and so did a broken entry's reason."""
    gguf = write_gguf(tiny_checkpoints["llama"], tmp_path / "tiny.gguf", qtype="Q8_0")
    folders = store_folders(tmp_path)
    ollama_model(folders["ollama_models"], (*LIBRARY, NEWLINE, "latest"), gguf)
    missing = [{"mediaType": OLLAMA_MODEL, "digest": "sha256:" + "0" * 64}]
    ollama_manifest(folders["ollama_models"], (*LIBRARY, f"{NEWLINE}-gone", "latest"), missing)
    lmstudio_model(folders["lmstudio_models"], NEWLINE, "m", "f.gguf", gguf)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / f"{NEWLINE}.gguf").write_bytes(gguf.read_bytes())
    settings = make_settings(discover=True, models_dir=tmp_path / "models", **folders)
    with pytest.MonkeyPatch.context() as patch, recorded() as records:
        patch.setenv(model_cache.CACHE_ENV, str(tmp_path / "headscope-cache"))
        with serving(create_app(settings)) as client:
            for name in (f"{NEWLINE}:latest", f"{NEWLINE}/m/f", NEWLINE):
                r = client.post("/api/attention/compact", json={"text": TEXT, "model": name})
                assert r.status_code == 200, (name, r.text[:300])
            r = client.post("/api/attention", json={"text": TEXT, "model": f"{NEWLINE}-gone:latest"})
            assert r.status_code == 503 and "is missing" in r.json()["detail"]
    assert any("loaded" in r.getMessage() for r in records.records)  # the lines were written
    assert records.forged() == []
