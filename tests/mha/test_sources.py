"""The table of model sources (mha.loading.sources): the ollama, LM Studio and Hugging Face stores, the models
folder, and what describe_checkpoint reads of their entries: stand-in stores in tmp folders, never the
machine's own."""

from __future__ import annotations

import json
import os
from functools import partial
from pathlib import Path

import pytest
from gguf_files import write_gguf
from hostile_stores import lay_out
from store_files import OLLAMA_MODEL, REVISION, hf_snapshot, lmstudio_model, ollama_manifest, ollama_model

from mha import describe_checkpoint
from mha.loading import sources
from mha.loading.convert import CONVERTERS

LIBRARY = ("registry.ollama.ai", "library")
HEX = "ab" * 32


@pytest.fixture(scope="module")
def tiny_gguf(tiny_checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama as a Q8_0 GGUF (its norms F32)."""
    return write_gguf(tiny_checkpoints["llama"], tmp_path_factory.mktemp("gguf") / "tiny.gguf", qtype="Q8_0")


def test_ollama_names_are_what_ollama_run_takes(tmp_path: Path, tiny_gguf: Path) -> None:
    blob = ollama_model(tmp_path, (*LIBRARY, "qwen2.5", "7b"), tiny_gguf)
    ollama_model(tmp_path, ("hf.co", "bartowski", "Llama-3.2-1B-Instruct-GGUF", "Q4_K_M"), b"GGUF other")
    ollama_model(tmp_path, ("registry.ollama.ai", "someone", "mine", "latest"), b"GGUF mine")
    scan = sources.scan_ollama(tmp_path)
    assert sorted(scan.found) == [
        "hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M",
        "qwen2.5:7b",
        "someone/mine:latest",
    ]
    assert scan.found["qwen2.5:7b"] == blob and scan.refused == {}
    facts = describe_checkpoint(scan.found["qwen2.5:7b"])  # a blob without .gguf: its magic says GGUF
    assert facts is not None and (facts.family, facts.architecture) == ("llama", "decoder")
    assert facts.size_bytes == tiny_gguf.stat().st_size and facts.quantization == "Q8_0"


def test_describe_counts_the_weights_of_a_gguf_and_a_folder(
    tiny_checkpoints: dict[str, Path], tiny_gguf: Path
) -> None:
    from safetensors.torch import load_file

    folder = tiny_checkpoints["llama"]
    weights = sum(t.numel() for t in load_file(folder / "model.safetensors").values())
    gguf_facts, folder_facts = describe_checkpoint(tiny_gguf), describe_checkpoint(folder)
    assert folder_facts is not None and folder_facts.parameters == weights
    assert (
        folder_facts.family == "llama"
        and folder_facts.size_bytes == (folder / "model.safetensors").stat().st_size
    )
    # the GGUF holds the same weights (its LM head tied, as the checkpoint's)
    assert gguf_facts is not None and gguf_facts.parameters == weights


def test_ollama_lists_every_broken_entry_with_its_reason(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A manifest that is not JSON, one without a model layer, a missing blob, a digest that would lead
    outside the store, a blob linking outside: each is refused with a sentence, none is opened."""
    outside = tmp_path_factory.mktemp("outside")
    (outside / "secret").write_bytes(b"GGUF secret")
    ollama_manifest(tmp_path, (*LIBRARY, "text", "latest"), "not json {")
    ollama_manifest(
        tmp_path,
        (*LIBRARY, "nolayer", "latest"),
        [{"mediaType": "application/vnd.ollama.image.license", "digest": f"sha256:{HEX}"}],
    )
    ollama_manifest(
        tmp_path, (*LIBRARY, "gone", "latest"), [{"mediaType": OLLAMA_MODEL, "digest": f"sha256:{HEX}"}]
    )
    for tag, digest in {
        "dots": "sha256:../../etc/passwd",
        "absolute": str(outside / "secret"),
        "number": 7,
    }.items():
        ollama_manifest(tmp_path, (*LIBRARY, "escape", tag), [{"mediaType": OLLAMA_MODEL, "digest": digest}])
    blobs = tmp_path / "blobs"
    blobs.mkdir(exist_ok=True)
    (blobs / f"sha256-{'cd' * 32}").symlink_to(outside / "secret")
    ollama_manifest(
        tmp_path,
        (*LIBRARY, "linked", "latest"),
        [{"mediaType": OLLAMA_MODEL, "digest": f"sha256:{'cd' * 32}"}],
    )
    os.mkfifo(blobs / f"sha256-{'ef' * 32}")
    ollama_manifest(
        tmp_path, (*LIBRARY, "fifo", "latest"), [{"mediaType": OLLAMA_MODEL, "digest": f"sha256-{'ef' * 32}"}]
    )
    (tmp_path / "manifests" / "registry.ollama.ai" / "library" / "link").mkdir()
    (tmp_path / "manifests" / "registry.ollama.ai" / "library" / "link" / "latest").symlink_to(
        outside / "secret"
    )
    scan = sources.scan_ollama(tmp_path)
    assert scan.found == {}
    why = scan.refused
    assert "not JSON" in why["text:latest"]
    assert "no application/vnd.ollama.image.model layer" in why["nolayer:latest"]
    assert "is missing" in why["gone:latest"]
    for tag in ("dots", "absolute", "number"):
        assert "is not sha256:<64 hex digits>" in why[f"escape:{tag}"], tag
    assert "outside the store" in why["linked:latest"] and "outside the store" in why["link:latest"]
    assert "is a FIFO" in why["fifo:latest"]


def test_lmstudio_registers_publisher_model_file(
    tmp_path: Path, tiny_gguf: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = lmstudio_model(
        tmp_path,
        "lmstudio-community",
        "Qwen2.5-7B-Instruct-GGUF",
        "Qwen2.5-7B-Instruct-Q4_K_M.gguf",
        tiny_gguf,
    )
    lmstudio_model(tmp_path, "pub", "model", "README.md", b"not a model")
    outside = tmp_path_factory.mktemp("far") / "far.gguf"
    outside.write_bytes(b"GGUF")
    (tmp_path / "pub" / "model" / "far.gguf").symlink_to(outside)
    scan = sources.scan_lmstudio(tmp_path)
    assert scan.found == {"lmstudio-community/Qwen2.5-7B-Instruct-GGUF/Qwen2.5-7B-Instruct-Q4_K_M": path}
    assert list(scan.refused) == ["pub/model/far"] and "outside the store" in scan.refused["pub/model/far"]


def test_huggingface_snapshots_by_repo_id_links_only_inside(
    tmp_path: Path, tiny_checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    families = frozenset(CONVERTERS)
    snapshot = hf_snapshot(tmp_path, "Qwen/Qwen2.5-0.5B-Instruct", tiny_checkpoints["qwen2"])
    older = hf_snapshot(
        tmp_path, "Qwen/Qwen2.5-0.5B-Instruct", tiny_checkpoints["qwen2"], revision="f" * 40, main=False
    )
    hf_snapshot(tmp_path, "gpt2", tiny_checkpoints["gpt2"])
    leaky = hf_snapshot(tmp_path, "evil/leak", tiny_checkpoints["bert"])
    secret = tmp_path_factory.mktemp("secret") / "weights"
    secret.write_bytes(b"x")
    (leaky / "extra.safetensors").symlink_to(secret)
    other = tmp_path / "models--org--vision" / "snapshots" / REVISION
    other.mkdir(parents=True)
    (other / "config.json").write_text(json.dumps({"model_type": "clip"}))  # a family we do not convert
    broken = tmp_path / "models--org--broken" / "snapshots" / REVISION
    broken.mkdir(parents=True)
    (broken / "config.json").write_text("{ nope")
    (tmp_path / "datasets--org--data" / "snapshots").mkdir(parents=True)
    scan = sources.scan_hf_cache(tmp_path, families)
    assert scan.found == {
        "Qwen/Qwen2.5-0.5B-Instruct": snapshot,
        f"Qwen/Qwen2.5-0.5B-Instruct@{older.name}": older,
        "gpt2": tmp_path / "models--gpt2" / "snapshots" / REVISION,
    }
    assert set(scan.refused) == {"evil/leak", "org/broken"}
    assert "outside the store" in scan.refused["evil/leak"] and "not JSON" in scan.refused["org/broken"]
    facts = describe_checkpoint(snapshot)
    assert facts is not None and facts.family == "qwen2" and facts.parameters


def test_default_folders_follow_each_tools_own_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OLLAMA_MODELS", raising=False)
    assert sources.default_ollama_models(tmp_path) in (None, Path("/usr/share/ollama/.ollama/models"))
    (tmp_path / ".ollama" / "models").mkdir(parents=True)
    assert sources.default_ollama_models(tmp_path) == tmp_path / ".ollama" / "models"
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "elsewhere"))
    (tmp_path / "elsewhere").mkdir()
    assert sources.default_ollama_models(tmp_path) == tmp_path / "elsewhere"
    assert sources.default_lmstudio_models(tmp_path) is None
    (tmp_path / ".lmstudio" / "models").mkdir(parents=True)
    assert sources.default_lmstudio_models(tmp_path) == tmp_path / ".lmstudio" / "models"


def test_huggingface_gguf_files_are_named_as_lm_studio_names_them(tmp_path: Path, tiny_gguf: Path) -> None:
    """A GGUF repo (no config.json): each file under repo id / its path less .gguf, subfolders kept; a
    split GGUF listed once, refused with why; a link leading out of the cache refused; an older
    snapshot's copy of a file under @rev."""
    repo = "bartowski/Llama-3.2-1B-Instruct-GGUF"
    checkpoint = tmp_path / "files"
    checkpoint.mkdir()
    for name in ("Llama-3.2-1B-Instruct-Q4_K_M.gguf", "big-00001-of-00002.gguf", "big-00002-of-00002.gguf"):
        (checkpoint / name).write_bytes(tiny_gguf.read_bytes())
    (checkpoint / "README.md").write_text("a model card")
    cache = tmp_path / "hub"
    snapshot = hf_snapshot(cache, repo, checkpoint)
    older = hf_snapshot(cache, repo, checkpoint, revision="f" * 40, main=False)
    (snapshot / "Q8_0").mkdir()
    (snapshot / "Q8_0" / "model-Q8_0.gguf").symlink_to(snapshot / "Llama-3.2-1B-Instruct-Q4_K_M.gguf")
    (snapshot / "leak.gguf").symlink_to(tiny_gguf)  # outside the cache
    scan = sources.scan_hf_cache(cache, frozenset(CONVERTERS))
    base = f"{repo}/Llama-3.2-1B-Instruct-Q4_K_M"
    assert scan.found == {
        base: snapshot / "Llama-3.2-1B-Instruct-Q4_K_M.gguf",
        f"{repo}/Q8_0/model-Q8_0": snapshot / "Q8_0" / "model-Q8_0.gguf",
        f"{base}@{older.name}": older / "Llama-3.2-1B-Instruct-Q4_K_M.gguf",
    }
    assert set(scan.refused) == {
        f"{repo}/big-00001-of-00002",
        f"{repo}/big-00001-of-00002@{older.name}",
        f"{repo}/leak",
    }
    assert "first of 2 parts of a split GGUF" in scan.refused[f"{repo}/big-00001-of-00002"]
    assert "outside the store" in scan.refused[f"{repo}/leak"]
    facts = describe_checkpoint(scan.found[base])
    assert facts is not None and facts.family == "llama"


SCANS = {
    "ollama": sources.scan_ollama,
    "lmstudio": sources.scan_lmstudio,
    "huggingface": partial(sources.scan_hf_cache, families=frozenset(CONVERTERS)),
}


@pytest.mark.parametrize("kind", sorted(SCANS))
def test_a_hostile_store_costs_only_its_broken_entries(
    kind: str, tmp_path: Path, tiny_checkpoints: dict[str, Path]
) -> None:
    """Issue 48 (E2, E3, E6, E7): link loops, link chains, JSON nested 200,000 deep or over the cap, a
    manifest that is a folder, folder links leading out and names with a newline (tests/hostile_stores.py)
    neither stop the scan nor hide a good model: each broken entry is refused with its reason, and a
    reason quotes names and paths, so no newline of a folder's name reaches a log line through it."""
    gguf = tmp_path / "any.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))  # the scans read a blob's magic only
    hostile = lay_out(kind, tmp_path / "store", tmp_path / "outside", gguf, tiny_checkpoints["llama"])
    scan = SCANS[kind](tmp_path / "store")
    assert sorted(scan.found) == sorted(hostile.found)
    assert sorted(scan.refused) == sorted(hostile.refused)
    for name, why in hostile.refused.items():
        assert why in scan.refused[name], (name, scan.refused[name])
    assert not [why for why in scan.refused.values() if "\n" in why]


def test_resolve_link_says_why_a_link_cannot_be_followed(tmp_path: Path) -> None:
    (tmp_path / "self").symlink_to("self")
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    for link in ("self", "a"):
        with pytest.raises(ValueError, match=f"'{link}' is a link loop"):
            sources.resolve_link(tmp_path / link)
    (tmp_path / "file").write_text("x")
    (tmp_path / "good").symlink_to("file")
    assert sources.resolve_link(tmp_path / "good") == (tmp_path / "file").resolve()


# (store, the folder link's path in the store, where it leads in `outside`, the name it is refused under)
FOLDER_LINKS = [
    ("lmstudio", "outpub", "p", "outpub"),
    ("lmstudio", "pub/outmodel", "p/m", "pub/outmodel"),
    ("ollama", "manifests/registry.ollama.ai/someone", "manifests/h/ns", "registry.ollama.ai/someone"),
    ("ollama", "manifests/h.example/ns/outmodel", "manifests/h/ns/m", "h.example/ns/outmodel"),
    ("huggingface", "models--org--out", "models--org--m", "org/out"),
]


@pytest.mark.parametrize(("kind", "link", "target", "name"), FOLDER_LINKS)
def test_a_folder_link_leading_out_is_refused_with_its_reason(
    kind: str, link: str, target: str, name: str, tmp_path: Path, tiny_checkpoints: dict[str, Path]
) -> None:
    """Issue 48 E7: a file link leading out of a store was refused, a folder link vanished without a word:
    now it is refused too, under its path in the store (the only name it has), and never looked into."""
    store, outside = tmp_path / "store", tmp_path / "outside"
    lmstudio_model(outside, "p", "m", "x.gguf", b"GGUF")
    ollama_model(outside, ("h", "ns", "m", "latest"), b"GGUF")
    hf_snapshot(outside, "org/m", tiny_checkpoints["llama"])
    (store / link).parent.mkdir(parents=True)
    (store / link).symlink_to(outside / target)
    scan = SCANS[kind](store)
    assert scan.found == {} and list(scan.refused) == [name]
    assert "outside the store" in scan.refused[name] and repr(str(outside / target)) in scan.refused[name]
