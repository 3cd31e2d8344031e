"""Hostile model stores, as issue 48's probe laid them out: in each store (ollama, LM Studio, the Hugging
Face hub cache) and in the models folder, one entry for each way an entry can be broken (a link loop, a
chain of links longer than the system follows, JSON nested 200,000 deep or over the size cap, a manifest
that is a folder, a folder link leading out, a name holding a newline) beside good models that must still
be found. Shared by tests/mha/test_sources.py and tests/mha/test_sources_folder.py (the scans) and
tests/app/test_stores_api.py (the service).

`lay_out(kind, folder, outside, gguf, checkpoint)` writes one into `folder` (`outside`: a folder beside it,
where links lead out to) and returns a `Hostile`: what must be found, and what must be refused and why.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from store_files import OLLAMA_MODEL, REVISION, hf_snapshot, lmstudio_model, ollama_manifest, ollama_model

from mha.loading.sources import MANIFEST_MAX_BYTES

KINDS = ("ollama", "lmstudio", "huggingface", "models_dir")
# A log line of the service's own format; a folder name can hold a newline but no slash.
FORGED = "2026-12-02 00:00:00,000 INFO app.access: GET admin 200 1.0 ms from 10.0.0.1:1 HTTP1.1"
NEWLINE = f"x\n{FORGED}"  # a name that would start a log line of its own, were it written raw
NESTED = "[" * 200_000 + "]" * 200_000  # 400 KB, under the 1 MB cap: json.loads recurses once a level
HUGE = " " * (MANIFEST_MAX_BYTES + 1)  # over the cap: refused unparsed
CHAIN = 50  # links in a chain: more than Linux follows (40)
LOOP = "is a link loop"
CHAINED = "a chain of links too long to follow"
NESTED_WHY = "nested too deeply"
LIBRARY = ("registry.ollama.ai", "library")


@dataclass
class Hostile:
    """What a hostile store's scan must give: `found` names; `refused` name -> what its reason says;
    `failing`: found by the scan but refused by its check (the service's /api/models)."""

    found: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    failing: dict[str, str] = field(default_factory=dict)


def chain(first: Path, last: Path, links: Path) -> None:
    """first -> links/1 -> links/2 -> ... -> links/CHAIN -> last, each link relative."""
    links.mkdir(parents=True, exist_ok=True)
    for k in range(1, CHAIN):
        (links / str(k)).symlink_to(str(k + 1))
    (links / str(CHAIN)).symlink_to(last)
    first.symlink_to(links / "1")


def lay_out(kind: str, folder: Path, outside: Path, gguf: Path, checkpoint: Path) -> Hostile:
    """A hostile `kind` store (KINDS) in `folder`: `gguf` a good GGUF file, `checkpoint` a good checkpoint
    folder of a family we convert."""
    folder.mkdir(parents=True, exist_ok=True)
    outside.mkdir(parents=True, exist_ok=True)
    layouts = {
        "ollama": _ollama,
        "lmstudio": _lmstudio,
        "huggingface": _huggingface,
        "models_dir": _models_dir,
    }
    return layouts[kind](folder, outside, gguf, checkpoint)


def _ollama(store: Path, outside: Path, gguf: Path, checkpoint: Path) -> Hostile:
    library = store / "manifests" / Path(*LIBRARY)
    good = ollama_model(store, (*LIBRARY, "good", "latest"), gguf)
    ollama_model(store, (*LIBRARY, NEWLINE, "latest"), gguf)
    missing = [{"mediaType": OLLAMA_MODEL, "digest": "sha256:" + "0" * 64}]
    ollama_manifest(store, (*LIBRARY, f"{NEWLINE}-gone", "latest"), missing)
    (library / "loop").mkdir()
    (library / "loop" / "latest").symlink_to("latest")
    (library / "chain").mkdir()
    chain(library / "chain" / "latest", library / "good" / "latest", store / "links")
    (good.parent / f"sha256-{'e' * 64}").symlink_to(f"sha256-{'e' * 64}")
    ollama_manifest(
        store, (*LIBRARY, "blobloop", "latest"), [{"mediaType": OLLAMA_MODEL, "digest": "sha256:" + "e" * 64}]
    )
    ollama_manifest(store, (*LIBRARY, "nested", "latest"), NESTED)
    ollama_manifest(store, (*LIBRARY, "huge", "latest"), HUGE)
    (library / "folder" / "latest").mkdir(parents=True)
    ollama_model(outside, ("h", "ns", "m", "latest"), gguf)  # a store of its own, linked into this one
    (library.parent / "someone").symlink_to(outside / "manifests" / "h" / "ns")
    (library / "outmodel").symlink_to(outside / "manifests" / "h" / "ns" / "m")
    (store / "manifests" / "loophost").symlink_to("loophost")
    return Hostile(
        found=["good:latest", f"{NEWLINE}:latest"],
        refused={
            f"{NEWLINE}-gone:latest": "is missing",
            "loop:latest": LOOP,
            "chain:latest": CHAINED,
            "blobloop:latest": LOOP,
            "nested:latest": NESTED_WHY,
            "huge:latest": "bytes: not a real one",
            "folder:latest": "its manifest is a folder",
            "registry.ollama.ai/someone": "outside the store",
            "registry.ollama.ai/library/outmodel": "outside the store",
            "loophost": LOOP,
        },
    )


def _lmstudio(store: Path, outside: Path, gguf: Path, checkpoint: Path) -> Hostile:
    good = lmstudio_model(store, "pub", "good", "good.gguf", gguf)
    lmstudio_model(store, NEWLINE, "m", "f.gguf", gguf)
    (store / "pub" / "m").mkdir()
    (store / "pub" / "m" / "loop.gguf").symlink_to("loop.gguf")
    chain(store / "pub" / "m" / "chain.gguf", good, store / "pub" / "links")  # no *.gguf among the links
    lmstudio_model(outside, "p", "m", "x.gguf", gguf)
    (store / "outpub").symlink_to(outside / "p")
    (store / "pub" / "outmodel").symlink_to(outside / "p" / "m")
    (store / "looppub").symlink_to("looppub")
    (store / "gonepub").symlink_to(store / "nothing")
    return Hostile(
        found=["pub/good/good", f"{NEWLINE}/m/f"],
        refused={
            "pub/m/loop": LOOP,
            "pub/m/chain": CHAINED,
            "outpub": "outside the store",
            "pub/outmodel": "outside the store",
            "looppub": LOOP,
            "gonepub": "does not exist",
        },
    )


def _huggingface(cache: Path, outside: Path, gguf: Path, checkpoint: Path) -> Hostile:
    hf_snapshot(cache, "org/good", checkpoint)
    hf_snapshot(cache, f"org/{NEWLINE}", checkpoint)
    loop = hf_snapshot(cache, "org/loop", checkpoint)
    (loop / "model.safetensors").unlink()
    (loop / "model.safetensors").symlink_to("model.safetensors")
    chained = hf_snapshot(cache, "org/chain", checkpoint)
    weights = (chained / "model.safetensors").resolve()
    (chained / "model.safetensors").unlink()
    chain(chained / "model.safetensors", weights, chained.parent.parent / "links")
    config = json.loads((checkpoint / "config.json").read_text())
    for repo, text in {"org/nested": NESTED, "org/huge": json.dumps(HUGE)}.items():
        snapshot = hf_snapshot(cache, repo, checkpoint)
        (snapshot / "config.json").unlink()
        (snapshot / "config.json").write_text(f'{{"model_type": "{config["model_type"]}", "x": {text}}}')
    hf_snapshot(outside, "org/out", checkpoint)
    (cache / "models--org--out").symlink_to(outside / "models--org--out")
    (cache / "models--org--snapout" / "snapshots").mkdir(parents=True)
    (cache / "models--org--snapout" / "snapshots" / REVISION).symlink_to(
        outside / "models--org--out" / "snapshots" / REVISION
    )
    ggufs = cache / "models--org--ggufs" / "snapshots" / REVISION
    ggufs.mkdir(parents=True)
    (ggufs / "loop.gguf").symlink_to("loop.gguf")
    return Hostile(
        found=["org/good", f"org/{NEWLINE}"],
        refused={
            "org/loop": LOOP,
            "org/chain": CHAINED,
            "org/nested": NESTED_WHY,
            "org/huge": "bytes: not a real one",
            "org/out": "outside the store",
            f"org/snapout@{REVISION}": "outside the store",
            "org/ggufs/loop": LOOP,
        },
    )


def _models_dir(folder: Path, outside: Path, gguf: Path, checkpoint: Path) -> Hostile:
    shutil.copyfile(gguf, folder / "good.gguf")
    shutil.copyfile(gguf, folder / f"{NEWLINE}.gguf")
    (folder / "loop.gguf").symlink_to("loop.gguf")
    chain(folder / "chain.gguf", folder / "good.gguf", folder / "links")  # a folder without config.json
    (folder / "loopdir").symlink_to("loopdir")
    (outside / "dir").mkdir()
    (folder / "outdir").symlink_to(outside / "dir")
    (folder / "nested").mkdir()
    (folder / "nested" / "config.json").write_text(NESTED)
    return Hostile(
        found=["good", NEWLINE],
        refused={
            "loop": LOOP,
            "chain": CHAINED,
            "loopdir": LOOP,
            "outdir": "outside the models folder",
        },
        failing={"nested": NESTED_WHY},
    )
