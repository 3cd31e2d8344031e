"""The Hugging Face hub cache: every snapshot of a family we convert, and every GGUF file a snapshot holds.
It reads folder listings, refs/ files and config.json files, never a weight."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

from mha.loading.sources.links import file_kind, inside
from mha.loading.sources.listing import GGUF, Listing, folders, gguf_entry, small_json

__all__ = ["HF_SNAPSHOT_FILES", "SOURCE", "default_hf_cache", "scan_hf_cache"]

SOURCE = "huggingface"
HF_SNAPSHOT_FILES = 10_000  # files one snapshot may hold before it is refused unread (real ones: ~20)
_STORE = "Hugging Face's"


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


def scan_hf_cache(cache: Path, families: frozenset[str]) -> Listing:
    """Every snapshot (models--org--name/snapshots/<rev>/) whose config.json is of one of `families`: the
    one refs/main names (else the newest) under its repo id (`Qwen/Qwen2.5-0.5B-Instruct`), the others
    under repo@rev. And every GGUF file a snapshot holds (a GGUF repo has no config.json), as LM Studio's
    are named: repo id / its path less .gguf (`bartowski/Llama-3.2-1B-Instruct-GGUF/Llama-3.2-1B-Instruct-
    Q4_K_M`), a copy in an older snapshot under @rev. A snapshot's files are links into ../../blobs: one
    leading out of the cache refuses the snapshot (a GGUF: that file). Repos of other families, and
    folders holding neither (datasets), are not models we convert and are left out."""
    found = Listing(SOURCE)
    root = cache.resolve()
    for repo in folders(found, cache, "", root, _STORE, _repo_id):
        repo_id = _repo_id(repo)
        if repo_id is None:
            continue  # a dataset's or a space's
        main = _ref(repo / "refs" / "main", root)
        at = partial(_at_revision, repo_id)
        snapshots = repo / "snapshots"
        if snapshots.is_symlink() and (why := inside(snapshots, root)) is not None:
            found.refuse(repo_id, f"Hugging Face's {repo_id!r}: {why}")
            continue
        listed = folders(found, snapshots, repo_id, root, _STORE, at) if snapshots.is_dir() else []
        # refs/main's first, then the newest: the one a name without @rev means
        listed.sort(key=lambda s: (s.name == main, _mtime(s)), reverse=True)
        configured = [s for s in listed if os.path.lexists(s / "config.json")]
        newest = configured[0] if configured else None
        for snapshot in listed:
            name = repo_id if snapshot == newest else at(snapshot)
            try:
                files = _snapshot_files(snapshot)
                if snapshot in configured and _hf_family(snapshot, files, root) in families:
                    found.find(name, snapshot)
            except ValueError as exc:
                found.refuse(name, f"Hugging Face's {name!r}: {exc}")
                continue
            for file in files:
                if file.suffix.lower() == GGUF:
                    stem = f"{repo_id}/{file.relative_to(snapshot).with_suffix('').as_posix()}"
                    if stem in found:  # a newer snapshot's copy has the name
                        stem = f"{stem}@{snapshot.name}"
                    gguf_entry(found, stem, file, root, _STORE)
    return found


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
    if inside(file, root) is not None or file_kind(file) is not None:
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
        if path.is_symlink() and (why := inside(path, root)) is not None:
            raise ValueError(why)
    config = small_json(snapshot / "config.json", "config.json")
    family = config.get("model_type") if isinstance(config, dict) else None
    return family if isinstance(family, str) else None
