"""ollama's models folder: every manifest, by the name `ollama run` takes, found as its model layer's blob.
It reads folder listings and the small JSON manifests, and of a blob only its first bytes (the GGUF magic).

Every digest a manifest names is followed only where it stays inside the store (links.follow), and only
in ollama's own form, so a digest never becomes a path of its own choosing.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from mha.loading.sources.links import file_kind, inside
from mha.loading.sources.listing import Listing, folders, listing, small_json, under

__all__ = ["OLLAMA_MODEL_LAYER", "SOURCE", "default_ollama_models", "scan_ollama"]

SOURCE = "ollama"
# ollama's own rules, from github.com/ollama/ollama (read at fb30760, 2026-08): manifest/paths.go
# (`BlobsPath`: a digest is "sha256:" or "sha256-" and 64 hex digits; the blob is blobs/sha256-<hex>),
# manifest/manifest.go (`Manifests`: manifests/<host>/<namespace>/<model>/<tag>, JSON of schemaVersion,
# config and layers of mediaType, digest, size), server/images.go (the GGUF is the layer of mediaType
# application/vnd.ollama.image.model), types/model/name.go (`DisplayShortest`: the name `ollama run` takes,
# host and namespace dropped where they are registry.ollama.ai and library) and envconfig/config.go
# (`Models`: $OLLAMA_MODELS, else ~/.ollama/models; the Linux service's user keeps /usr/share/ollama/...).
OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
_OLLAMA_DIGEST = re.compile(r"sha256[:-]([0-9a-fA-F]{64})")
_OLLAMA_HOST, _OLLAMA_NAMESPACE = "registry.ollama.ai", "library"
_GGUF_MAGIC = b"GGUF"
_STORE = "ollama's"


def default_ollama_models(home: Path | None = None) -> Path | None:
    """ollama's models folder: $OLLAMA_MODELS, else ~/.ollama/models or the Linux service's
    /usr/share/ollama/.ollama/models, the first that exists; None where none does."""
    home = Path.home() if home is None else home
    candidates = [Path(os.environ["OLLAMA_MODELS"])] if os.environ.get("OLLAMA_MODELS") else []
    candidates += [home / ".ollama" / "models", Path("/usr/share/ollama/.ollama/models")]
    return next((c for c in candidates if c.is_dir()), None)


def scan_ollama(store: Path) -> Listing:
    """Every manifest under store/manifests/<host>/<namespace>/<model>/<tag>, by the name `ollama run` takes
    (`qwen2.5:7b`; `hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M`), found: its model layer's blob.
    A host, namespace or model folder that cannot be used is refused by its path under manifests/
    (`registry.ollama.ai/someone`), the only name it has."""
    found = Listing(SOURCE)
    root = store.resolve()
    manifests = store / "manifests"
    if manifests.is_symlink() and (why := inside(manifests, root)) is not None:
        found.refuse("manifests", f"ollama's 'manifests': {why}")
        return found
    if not manifests.is_dir():
        return found
    for host in folders(found, manifests, "", root, _STORE, under("")):
        for namespace in folders(found, host, host.name, root, _STORE, under(host.name)):
            path = f"{host.name}/{namespace.name}"
            for model in folders(found, namespace, path, root, _STORE, under(path)):
                # every entry is a tag's manifest (ollama's layout has no deeper level): a folder is refused
                for tag in listing(found, model, f"{path}/{model.name}", _STORE):
                    name = _ollama_name(host.name, namespace.name, model.name, tag.name)
                    try:
                        found.find(name, _ollama_blob(tag, root))
                    except ValueError as exc:
                        found.refuse(name, f"ollama's {name!r}: {exc}")
    return found


def _ollama_name(host: str, namespace: str, model: str, tag: str) -> str:
    """types/model/name.go's DisplayShortest."""
    if host.lower() != _OLLAMA_HOST:
        return f"{host}/{namespace}/{model}:{tag}"
    if namespace.lower() != _OLLAMA_NAMESPACE:
        return f"{namespace}/{model}:{tag}"
    return f"{model}:{tag}"


def _ollama_blob(manifest: Path, root: Path) -> Path:
    """The blob a manifest's model layer names, inside the store; ValueError with a sentence otherwise."""
    if (outside := inside(manifest, root)) is not None:
        raise ValueError(f"its manifest {outside}")
    document = small_json(manifest, "manifest")
    layers = document.get("layers") if isinstance(document, dict) else None
    if not isinstance(layers, list):
        raise ValueError("its manifest has no list of layers")
    digests = [
        layer.get("digest")
        for layer in layers
        if isinstance(layer, dict) and layer.get("mediaType") == OLLAMA_MODEL_LAYER
    ]
    if not digests:
        raise ValueError(f"its manifest has no {OLLAMA_MODEL_LAYER} layer (no GGUF weights)")
    digest = digests[0]
    # The digest becomes a file name: only ollama's own form, so "sha256:../../etc/passwd" never does.
    match = _OLLAMA_DIGEST.fullmatch(digest) if isinstance(digest, str) else None
    if match is None:
        raise ValueError(f"its model layer's digest {str(digest)[:100]!r} is not sha256:<64 hex digits>")
    blob = root / "blobs" / f"sha256-{match.group(1)}"
    if not blob.exists() and not blob.is_symlink():
        raise ValueError(f"its model blob {blob.name} is missing (an interrupted pull?)")
    if (outside := inside(blob, root)) is not None:
        raise ValueError(f"its model blob {outside}")
    if (kind := file_kind(blob)) is not None:
        raise ValueError(f"its model blob {blob.name} is {kind}, not a GGUF file")
    try:
        with blob.open("rb") as f:  # a blob has no suffix: its first bytes say what it is
            magic = f.read(len(_GGUF_MAGIC))
    except OSError as exc:
        raise ValueError(f"its model blob {blob.name} cannot be read ({exc.strerror})") from None
    if magic != _GGUF_MAGIC:
        raise ValueError(f"its model blob {blob.name} is not a GGUF file (no GGUF magic)")
    return blob
