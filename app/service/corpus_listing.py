"""Which subfolders of HEADSCOPE_RUNS_DIR are finished corpus runs (`find`), and their list, kept
(`RunListing`). The answers that read a run's files are in app/service/corpus.py.

A run is a subfolder (its links followed, within the runs folder) holding the four files (none linked from
outside it) whose run.json says `"complete": true`. The fields of run.json the answers read are checked by
RunMeta (app/schemas/corpus.py) first, so a wrongly typed one is named (409) rather than read as absent.

The list looks at a folder again only when its stamp changes: the folder's own (inode and mtime: a file
added, removed or renamed into place, as the job writes) and run.json's (inode, size and mtime: rewritten in
place; its inode changes with every rename, so a run finished within one tick of a coarse file-system clock
after a listing still shows). With 2,000 runs that is a directory scan and two stat calls a folder: 14 ms
on a loaded 2-core machine where resolving and reading every folder, as each listing did before, took
498 ms (issue 26: 140 ms on its machine; benchmarks/corpus_listing.py).
"""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from app.cache import LRUCache
from app.schemas.corpus import RunMeta

logger = logging.getLogger(__name__)

FILES = ("run.json", "per_text.parquet", "per_head.parquet", "examples.parquet")
RUNS_DIR_HINT = (
    "set HEADSCOPE_RUNS_DIR to a folder holding finished runs of `headscope corpus` (one subfolder a run) "
    "and restart the server"
)

# (device, inode, mtime) of a folder and (inode, size, mtime) of its run.json (None: none there).
Stamp = tuple[int, int, int, tuple[int, int, int] | None]


@dataclass(frozen=True, slots=True)
class Found:
    """A finished run: its folder, run.json as written and as checked, or why run.json breaks the format."""

    folder: Path
    meta: dict[str, Any]
    run: RunMeta | None
    problem: str | None = None


def inside(path: Path, root: Path) -> bool:
    """Whether `path`, its links followed, lies within `root` (itself resolved)."""
    try:
        return path.resolve(strict=True).is_relative_to(root)
    except OSError:
        return False


def _entry_inside(path: Path, root: Path) -> bool:
    """`inside` for an entry of a folder that lies within `root`: one that is no link is where its folder
    is (one lstat, where resolving costs one a component); a link is followed."""
    try:
        if not stat.S_ISLNK(os.lstat(path).st_mode):
            return True
    except OSError:
        return False
    return inside(path, root)


def find(root: Path, name: str, cache: LRUCache | None = None) -> Found | None:
    """The finished run `name` of the runs folder `root` (resolved), else None. `name` is one folder name
    ("..", "a/b" or "" are none); run.json is read through `cache` when given, keyed by its stamp."""
    if name in ("", ".", "..") or "/" in name or "\0" in name or (os.altsep and os.altsep in name):
        return None
    folder = root / name
    if not folder.is_dir() or not _entry_inside(folder, root):
        return None
    if not all(_entry_inside(folder / file, root) for file in FILES):
        return None  # unfinished, or a file linked from outside the runs folder
    meta = _read_meta(folder / "run.json", cache)
    if meta is None or meta.get("complete") is not True:
        return None
    try:
        run = RunMeta.model_validate(meta)
    except ValidationError as error:
        return Found(folder, meta, None, problem=_problems(error))
    return Found(folder, meta, run)


def summary(name: str, run: RunMeta, served: Collection[str]) -> dict[str, Any]:
    """What the list says of a run (RunSummary)."""
    return {
        "name": name,
        "model": run.model.name,
        "layers": run.model.layers,
        "heads": run.model.heads,
        "kind": run.kind,
        "words": run.settings.words,
        "weighting": run.settings.weighting,
        "counts": run.counts.model_dump(),
        "finished": run.finished,
        "stats": run.stats,
        "served": run.model.name in served,
    }


class RunListing:
    """The finished runs of one runs folder, kept between requests: each folder is looked at again only
    when its stamp changes, and the answer is encoded again only when a run or the served models do.
    Listings run in worker threads, so the memory is changed under a lock."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._resolved: Path | None = None
        # name -> (stamp, (its model, its summary as JSON but `served` and the closing brace), or None: no
        # finished run there). Encoded once a change: 2,000 summaries cost ~10 ms to encode again.
        self._folders: dict[str, tuple[Stamp | None, tuple[str, bytes] | None]] = {}
        self._body: tuple[frozenset[str], bytes] | None = None  # the last answer, and for which models

    def names(self) -> list[str]:
        """The finished runs' names, in order."""
        with self._lock:
            self._refresh()
            return [name for name, (_, kept) in sorted(self._folders.items()) if kept is not None]

    def body(self, served: Collection[str]) -> bytes:
        """The list as RunList JSON; `served`: the models this server runs."""
        models = frozenset(served)
        with self._lock:
            if self._refresh() or self._body is None or self._body[0] != models:
                listed = [kept for _, (_, kept) in sorted(self._folders.items()) if kept is not None]
                runs = b",".join(
                    head + (b',"served":true}' if model in models else b',"served":false}')
                    for model, head in listed
                )
                self._body = (models, b'{"configured":true,"hint":null,"runs":[' + runs + b"]}")
            return self._body[1]

    def _refresh(self) -> bool:
        """Look at the runs folder again (under the lock); True when a run appeared, changed or went."""
        try:
            root = self.root.resolve(strict=True)
            stamps = _scan(root)
        except OSError as error:
            logger.warning("corpus runs folder %r cannot be read: %r", str(self.root), str(error))
            root, stamps = None, {}
        changed = root != self._resolved
        if changed:  # another folder now (a link moved): nothing kept holds
            self._resolved, self._folders = root, {}
        for name in self._folders.keys() - stamps.keys():
            changed |= self._folders.pop(name)[1] is not None
        for name, stamp in stamps.items():
            kept = self._folders.get(name)
            if kept is not None and kept[0] == stamp:
                continue
            found = find(root, name) if root is not None and stamp is not None else None
            if found is not None and found.run is None:
                logger.warning("corpus run %r is not listed: run.json %r", str(found.folder), found.problem)
            now = None if found is None or found.run is None else _encoded(summary(name, found.run, ()))
            changed |= now != (kept[1] if kept is not None else None)
            self._folders[name] = (stamp, now)
        return changed


def _encoded(summary: dict[str, Any]) -> tuple[str, bytes]:
    """A run's model and its summary as JSON up to `served`, the last field (added per request)."""
    summary = dict(summary)
    del summary["served"]
    return summary["model"], json.dumps(summary, separators=(",", ":")).encode()[:-1]


def _scan(root: Path) -> dict[str, Stamp | None]:
    """Each entry of the runs folder and its stamp. The stat calls are the cost (~2 µs each, 10 µs on a
    loaded shared machine), so two a folder, none for a file, and each path looked up from the folder's
    descriptor rather than from /."""
    stamps: dict[str, Stamp | None] = {}
    descriptor = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with os.scandir(descriptor) as entries:
            for entry in entries:
                # A plain file's type is in its directory entry: no system call.
                folder = entry.is_dir() and _stat(entry.name, descriptor)
                if not folder:
                    stamps[entry.name] = None
                    continue
                meta = _stat(f"{entry.name}/run.json", descriptor)
                stamps[entry.name] = (
                    folder.st_dev,
                    folder.st_ino,
                    folder.st_mtime_ns,
                    (meta.st_ino, meta.st_size, meta.st_mtime_ns) if meta else None,
                )
    finally:
        os.close(descriptor)
    return stamps


def _stat(path: str, descriptor: int) -> os.stat_result | None:
    try:
        return os.stat(path, dir_fd=descriptor)
    except OSError:
        return None


def _read_meta(path: Path, cache: LRUCache | None) -> dict[str, Any] | None:
    """run.json as a dict (None: unreadable, or not an object), through `cache` keyed by its stamp."""
    try:
        status = path.stat()
        key = ("run.json", str(path), status.st_size, status.st_mtime_ns)
        meta = cache.get(key) if cache is not None else None
        if meta is None:
            meta = json.loads(path.read_text("utf-8"))
            if cache is not None:
                cache.put(key, meta, size=status.st_size)
    except (OSError, ValueError, RecursionError) as error:  # RecursionError: JSON nested too deeply
        logger.warning("corpus run %r: run.json cannot be read: %r", str(path.parent), str(error))
        return None
    return meta if isinstance(meta, dict) else None


def _problems(error: ValidationError) -> str:
    """Each wrong field of run.json by its name ("model.layers: Input should be ..."), never its value."""
    return "; ".join(
        f"{'.'.join(str(part) for part in item['loc']) or 'run.json'}: {item['msg']}"
        for item in error.errors(include_url=False)
    )
