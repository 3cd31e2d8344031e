"""The model stores people already have, found without anyone naming a file: ollama, LM Studio and the
Hugging Face hub cache. Each scan lists name -> the file or folder to load, and name -> why an entry that
looks like a model cannot be one; it reads folder listings, ollama's small JSON manifests and
config.json files, never a weight (the headers are read by the caller's cheap check).

Only what a store holds is read. A name is never a path: it is what the store calls the model
(`ollama run`'s name, LM Studio's publisher/model/file, a repo id), and the path behind it comes from the
scan. Every link, and every digest an ollama manifest names, is resolved and followed only where it stays
inside the store's folder; one leading out is listed as refused with its reason, as a models folder's
is (app.registry.scan_models_dir), and so is a folder link leading out, a link loop, a folder that cannot
be listed and a manifest or config.json that cannot be parsed: one broken entry costs only itself, never
the scan. A FIFO, device or socket is never opened. A name or path in a reason is quoted (repr), as a
folder name may hold a newline and the reason reaches the log.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

__all__ = [
    "HF_SNAPSHOT_FILES",
    "MANIFEST_MAX_BYTES",
    "OLLAMA_MODEL_LAYER",
    "StoreScan",
    "default_hf_cache",
    "default_lmstudio_models",
    "default_ollama_models",
    "file_kind",
    "huggingface",
    "lmstudio",
    "ollama",
    "resolve_link",
]

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
MANIFEST_MAX_BYTES = 1 << 20  # an ollama manifest is ~1 KB; a config.json tens of KB
HF_SNAPSHOT_FILES = 10_000  # files one snapshot may hold before it is refused unread (real ones: ~20)
_GGUF = ".gguf"
_GGUF_MAGIC = b"GGUF"
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)  # llama-gguf-split's part names


@dataclass
class StoreScan:
    """What a store scan found: `found` name -> the path to load, `refused` name -> why not, a sentence."""

    found: dict[str, Path] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)


def default_ollama_models(home: Path | None = None) -> Path | None:
    """ollama's models folder: $OLLAMA_MODELS, else ~/.ollama/models or the Linux service's
    /usr/share/ollama/.ollama/models, the first that exists; None where none does."""
    home = Path.home() if home is None else home
    candidates = [Path(os.environ["OLLAMA_MODELS"])] if os.environ.get("OLLAMA_MODELS") else []
    candidates += [home / ".ollama" / "models", Path("/usr/share/ollama/.ollama/models")]
    return next((c for c in candidates if c.is_dir()), None)


def default_lmstudio_models(home: Path | None = None) -> Path | None:
    """LM Studio's models folder, ~/.lmstudio/models, where it exists."""
    folder = (Path.home() if home is None else home) / ".lmstudio" / "models"
    return folder if folder.is_dir() else None


def default_hf_cache() -> Path | None:
    """The hub cache huggingface_hub uses (its own constant: HF_HUB_CACHE, else $HF_HOME/hub, else
    ~/.cache/huggingface/hub, read from the environment when huggingface_hub is imported), where it exists."""
    try:
        from huggingface_hub import constants

        folder = Path(constants.HF_HUB_CACHE)
    except ImportError:  # the same rule without it
        home = os.environ.get("HF_HOME") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
        )
        folder = Path(os.environ.get("HF_HUB_CACHE") or os.path.join(home, "hub"))
    return folder if folder.is_dir() else None


def file_kind(path: Path) -> str | None:
    """None for a regular file (links followed), else what `path` is, for a sentence."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    if stat.S_ISREG(mode):
        return None
    kinds = {stat.S_ISDIR: "a folder", stat.S_ISFIFO: "a FIFO", stat.S_ISCHR: "a character device",
             stat.S_ISBLK: "a block device", stat.S_ISSOCK: "a socket"}  # fmt: skip
    return next((kind for test, kind in kinds.items() if test(mode)), "not a regular file")


def resolve_link(path: Path) -> Path:
    """`path` with every link on its way followed (Path.resolve; the target may not exist); ValueError with
    a sentence where the system cannot follow them: a link loop, or a chain longer than it follows (40
    links on Linux), which resolve itself walks to the end."""
    target: Path | None
    try:
        target = path.resolve()
    except RuntimeError:  # Python 3.11 and 3.12 say "Symlink loop from ..."; 3.13 raises OSError(ELOOP)
        target = None
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise ValueError(f"{path.name!r} cannot be followed ({exc.strerror})") from None
        target = None
    if target is None or _too_many_links(path):
        raise ValueError(f"{path.name!r} is a link loop, or a chain of links too long to follow")
    return target


def _too_many_links(path: Path) -> bool:
    try:
        os.stat(path)
    except OSError as exc:  # a dangling link, an unreadable folder: the callers' checks of the target say so
        return exc.errno == errno.ELOOP
    return False


def _inside(path: Path, root: Path) -> str | None:
    """None where `path`, its links followed, stays inside `root` (resolved) and exists; else why not."""
    try:
        target = resolve_link(path)
    except ValueError as exc:
        return str(exc)
    if not target.is_relative_to(root):
        return (
            f"{path.name!r} leads to {str(target)!r}, outside the store {str(root)!r}: links are followed "
            "only inside it"
        )
    if not target.exists():
        return f"{path.name!r} leads to {str(target)!r}, which does not exist"
    return None


def _listing(scan: StoreScan, folder: Path, name: str, store: str) -> list[Path]:
    """What `folder` holds (sorted); where it cannot be listed, nothing, and `name` refused with why. The
    store's own folder (name "") is the caller's to report: OSError."""
    try:
        return sorted(folder.iterdir())
    except OSError as exc:
        if not name:
            raise
        scan.refused[name] = f"{store} {name!r}: its folder {folder.name!r} cannot be read ({exc.strerror})"
        return []


def _folders(
    scan: StoreScan, folder: Path, name: str, root: Path, store: str, named: Callable[[Path], str | None]
) -> list[Path]:
    """The subfolders of `folder` (sorted) that stay inside `root`. A link among its entries that loops,
    dangles or leads out of the store is refused under named(link) with why (None: not an entry of the
    store's, such as a hub cache's datasets, and skipped), as a file link is: never silently dropped."""
    kept = []
    for child in _listing(scan, folder, name, store):
        if child.is_symlink() and (why := _inside(child, root)) is not None:
            if (child_name := named(child)) is not None:
                scan.refused[child_name] = f"{store} {child_name!r}: {why}"
        elif child.is_dir():
            kept.append(child)
    return kept


def _under(name: str) -> Callable[[Path], str]:
    """A folder's entries named by their path in the store: "pub", then "pub/model"."""
    return lambda child: f"{name}/{child.name}" if name else child.name


def _small_json(file: Path, what: str) -> Any:
    """`file` parsed as JSON, read only if it is a regular file of at most MANIFEST_MAX_BYTES; ValueError
    with a sentence otherwise."""
    if (kind := file_kind(file)) is not None:
        raise ValueError(f"its {what} is {kind}, not a file")
    try:
        with file.open("rb") as f:
            data = f.read(MANIFEST_MAX_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"its {what} cannot be read ({exc.strerror})") from None
    if len(data) > MANIFEST_MAX_BYTES:
        raise ValueError(f"its {what} is over {MANIFEST_MAX_BYTES:,} bytes: not a real one")
    try:
        return json.loads(data)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise ValueError(f"its {what} is not JSON ({exc})") from None
    except RecursionError:  # arrays nested ~100,000 deep fit in 1 MB; the parser recurses per level
        raise ValueError(f"its {what} is JSON nested too deeply to be a real one") from None


# -- ollama ------------------------------------------------------------------------------------------


def ollama(store: Path) -> StoreScan:
    """Every manifest under store/manifests/<host>/<namespace>/<model>/<tag>, by the name `ollama run` takes
    (`qwen2.5:7b`; `hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M`), found: its model layer's blob.
    A host, namespace or model folder that cannot be used is refused by its path under manifests/
    (`registry.ollama.ai/someone`), the only name it has."""
    scan = StoreScan()
    root = store.resolve()
    manifests = store / "manifests"
    if manifests.is_symlink() and (why := _inside(manifests, root)) is not None:
        scan.refused["manifests"] = f"ollama's 'manifests': {why}"
        return scan
    if not manifests.is_dir():
        return scan
    for host in _folders(scan, manifests, "", root, "ollama's", _under("")):
        for namespace in _folders(scan, host, host.name, root, "ollama's", _under(host.name)):
            path = f"{host.name}/{namespace.name}"
            for model in _folders(scan, namespace, path, root, "ollama's", _under(path)):
                # every entry is a tag's manifest (ollama's layout has no deeper level): a folder is refused
                for tag in _listing(scan, model, f"{path}/{model.name}", "ollama's"):
                    name = _ollama_name(host.name, namespace.name, model.name, tag.name)
                    try:
                        scan.found[name] = _ollama_blob(tag, root)
                    except ValueError as exc:
                        scan.refused[name] = f"ollama's {name!r}: {exc}"
    return scan


def _ollama_name(host: str, namespace: str, model: str, tag: str) -> str:
    """types/model/name.go's DisplayShortest."""
    if host.lower() != _OLLAMA_HOST:
        return f"{host}/{namespace}/{model}:{tag}"
    if namespace.lower() != _OLLAMA_NAMESPACE:
        return f"{namespace}/{model}:{tag}"
    return f"{model}:{tag}"


def _ollama_blob(manifest: Path, root: Path) -> Path:
    """The blob a manifest's model layer names, inside the store; ValueError with a sentence otherwise."""
    if (outside := _inside(manifest, root)) is not None:
        raise ValueError(f"its manifest {outside}")
    document = _small_json(manifest, "manifest")
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
    if (outside := _inside(blob, root)) is not None:
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


# -- LM Studio ---------------------------------------------------------------------------------------


def lmstudio(store: Path) -> StoreScan:
    """Every store/<publisher>/<model>/<file>.gguf, as <publisher>/<model>/<file less .gguf>; a publisher
    or model folder that cannot be used is refused as `publisher` or `publisher/model`."""
    scan = StoreScan()
    root = store.resolve()
    for publisher in _folders(scan, store, "", root, "LM Studio's", _under("")):
        for model in _folders(scan, publisher, publisher.name, root, "LM Studio's", _under(publisher.name)):
            prefix = f"{publisher.name}/{model.name}"
            for file in _listing(scan, model, prefix, "LM Studio's"):
                if file.suffix.lower() == _GGUF:
                    _gguf_entry(scan, f"{prefix}/{file.stem}", file, root, "LM Studio's")
    return scan


def _gguf_entry(scan: StoreScan, name: str, file: Path, root: Path, store: str) -> None:
    """`file` found under `name`, or refused with why: a link leading out of the store, not a regular
    file, or one part of a split GGUF (listed once, by its first part)."""
    split = _SPLIT.search(file.name)
    if split is not None and int(split[1]) != 1:
        return
    why = _inside(file, root) or (
        f"{file.name!r} is {kind}, not a GGUF file" if (kind := file_kind(file)) else None
    )
    if why is None and split is not None:
        why = (
            f"{file.name!r} is the first of {int(split[2])} parts of a split GGUF; headscope reads a GGUF in "
            "one file (llama.cpp's `llama-gguf-split --merge` joins them)"
        )
    if why is None:
        scan.found[name] = file
    else:
        scan.refused[name] = f"{store} {name!r}: {why}"


# -- Hugging Face ------------------------------------------------------------------------------------


def huggingface(cache: Path, families: frozenset[str]) -> StoreScan:
    """Every snapshot (models--org--name/snapshots/<rev>/) whose config.json is of one of `families`: the
    one refs/main names (else the newest) under its repo id (`Qwen/Qwen2.5-0.5B-Instruct`), the others
    under repo@rev. And every GGUF file a snapshot holds (a GGUF repo has no config.json), as LM Studio's
    are named: repo id / its path less .gguf (`bartowski/Llama-3.2-1B-Instruct-GGUF/Llama-3.2-1B-Instruct-
    Q4_K_M`), a copy in an older snapshot under @rev. A snapshot's files are links into ../../blobs: one
    leading out of the cache refuses the snapshot (a GGUF: that file). Repos of other families, and
    folders holding neither (datasets), are not models we convert and are left out."""
    scan = StoreScan()
    root = cache.resolve()
    for repo in _folders(scan, cache, "", root, "Hugging Face's", _repo_id):
        repo_id = _repo_id(repo)
        if repo_id is None:
            continue  # a dataset's or a space's
        main = _ref(repo / "refs" / "main", root)
        at = partial(_at_revision, repo_id)
        snapshots = repo / "snapshots"
        if snapshots.is_symlink() and (why := _inside(snapshots, root)) is not None:
            scan.refused[repo_id] = f"Hugging Face's {repo_id!r}: {why}"
            continue
        listed = _folders(scan, snapshots, repo_id, root, "Hugging Face's", at) if snapshots.is_dir() else []
        # refs/main's first, then the newest: the one a name without @rev means
        listed.sort(key=lambda s: (s.name == main, _mtime(s)), reverse=True)
        configured = [s for s in listed if os.path.lexists(s / "config.json")]
        newest = configured[0] if configured else None
        for snapshot in listed:
            name = repo_id if snapshot == newest else at(snapshot)
            try:
                files = _snapshot_files(snapshot)
                if snapshot in configured and _hf_family(snapshot, files, root) in families:
                    scan.found[name] = snapshot
            except ValueError as exc:
                scan.refused[name] = f"Hugging Face's {name!r}: {exc}"
                continue
            for file in files:
                if file.suffix.lower() == _GGUF:
                    stem = f"{repo_id}/{file.relative_to(snapshot).with_suffix('').as_posix()}"
                    if stem in scan.found or stem in scan.refused:  # a newer snapshot's copy has the name
                        stem = f"{stem}@{snapshot.name}"
                    _gguf_entry(scan, stem, file, root, "Hugging Face's")
    return scan


def _repo_id(repo: Path) -> str | None:
    """A hub cache folder's repo id (models--org--name: org/name); None for a dataset's or a space's."""
    return repo.name.removeprefix("models--").replace("--", "/") if repo.name.startswith("models--") else None


def _at_revision(repo_id: str, snapshot: Path) -> str:
    return f"{repo_id}@{snapshot.name}"


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # gone since it was listed: oldest
        return 0.0


def _ref(file: Path, root: Path) -> str | None:
    """The revision a refs/ file names (a commit hash), or None."""
    if _inside(file, root) is not None or file_kind(file) is not None:
        return None
    try:
        with file.open("rb") as f:
            return f.read(100).decode("ascii", "replace").strip()
    except OSError:  # unreadable: no revision is preferred, the newest is used
        return None


def _snapshot_files(snapshot: Path) -> list[Path]:
    """Every file and link under `snapshot` (links not followed), at most HF_SNAPSHOT_FILES."""
    found: list[Path] = []
    for folder, dirs, files in os.walk(snapshot, followlinks=False):
        found += (Path(folder) / entry for entry in (*dirs, *files))
        if len(found) > HF_SNAPSHOT_FILES:
            raise ValueError(f"it holds over {HF_SNAPSHOT_FILES:,} files: not a model snapshot")
    return found


def _hf_family(snapshot: Path, files: list[Path], root: Path) -> str | None:
    """The snapshot's config.json model_type, once every file of it is known to stay inside the cache."""
    for path in files:
        if path.is_symlink() and (why := _inside(path, root)) is not None:
            raise ValueError(why)
    config = _small_json(snapshot / "config.json", "config.json")
    family = config.get("model_type") if isinstance(config, dict) else None
    return family if isinstance(family, str) else None
