"""Stand-in model stores laid out as ollama, LM Studio and the Hugging Face hub cache lay theirs out, for
tests and benchmarks/stores.py: a manifest and a blob per ollama model, publisher/model/file.gguf for LM
Studio, models--org--name with snapshots linking into ../../blobs for Hugging Face."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

OLLAMA_MODEL = "application/vnd.ollama.image.model"
REVISION = "0123456789abcdef0123456789abcdef01234567"


def ollama_manifest(
    store: Path, name: tuple[str, str, str, str], layers: list[dict[str, object]] | str
) -> Path:
    """Write store/manifests/<host>/<namespace>/<model>/<tag>: `layers` as ollama writes them, or a
    string written as it is (a manifest that is not JSON)."""
    manifest = store / "manifests" / Path(*name)
    manifest.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(layers, str):
        manifest.write_text(layers)
    else:
        document = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {
                "mediaType": "application/vnd.docker.container.image.v1+json",
                "digest": "",
                "size": 0,
            },
            "layers": layers,
        }
        manifest.write_text(json.dumps(document))
    return manifest


def ollama_model(store: Path, name: tuple[str, str, str, str], content: Path | bytes) -> Path:
    """An ollama model: `content` (a GGUF file, or bytes) as blobs/sha256-<its digest>, and its manifest
    naming it as the model layer. Returns the blob."""
    data = content.read_bytes() if isinstance(content, Path) else content
    digest = hashlib.sha256(data).hexdigest()
    blob = store / "blobs" / f"sha256-{digest}"
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    layer = {"mediaType": OLLAMA_MODEL, "digest": f"sha256:{digest}", "size": len(data)}
    ollama_manifest(store, name, [layer])
    return blob


def lmstudio_model(store: Path, publisher: str, model: str, file: str, content: Path | bytes) -> Path:
    """store/<publisher>/<model>/<file> holding `content`."""
    path = store / publisher / model / file
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, Path):
        shutil.copyfile(content, path)
    else:
        path.write_bytes(content)
    return path


def hf_snapshot(
    cache: Path, repo_id: str, checkpoint: Path, *, revision: str = REVISION, main: bool = True
) -> Path:
    """models--org--name/snapshots/<revision>/ as huggingface_hub writes it: each file of `checkpoint` a
    relative link to ../../blobs/<its digest>, and (main) refs/main naming the revision."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for file in sorted(checkpoint.iterdir()):
        if not file.is_file():
            continue
        digest = hashlib.sha256(file.read_bytes()).hexdigest()
        shutil.copyfile(file, repo / "blobs" / digest)
        (snapshot / file.name).symlink_to(Path("..", "..", "blobs", digest))
    if main:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(revision)
    return snapshot
