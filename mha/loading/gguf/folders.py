"""The cache of what is slow to rebuild from a file: content-addressed folders under HEADSCOPE_CACHE_DIR.

What a GGUF's header gives (mha.loading.gguf.cache: its config, tensor names and tokenizer) is kept as
a folder named by the SHA-256 of that header, so a renamed or copied file finds it and an edited header
does not; the tensors are never kept here (mha.loading.gguf.weights reads them from the file itself):

    $HEADSCOPE_CACHE_DIR/            (default ~/.cache/headscope)
      gguf-v2/<sha256>/              a published folder: config.json, tokenizer files, gguf*.json
      gguf-v2/.tmp-<sha256>-<pid>-*  one being written (or left by a killed writer): never read

A folder is written under a temporary name and renamed into place only once whole (a rename is atomic on
one file system), so an interrupted write leaves nothing a later load trusts. Where the cache folder
cannot be written, the folder goes to a temporary one of this process instead (removed at exit), with one
warning.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "CACHE_ENV",
    "cache_root",
    "cached_folder",
    "discard",
    "publish_folder",
]

logger = logging.getLogger(__name__)

CACHE_ENV = "HEADSCOPE_CACHE_DIR"
_TEMPORARY = ".tmp-"
# digest -> this process's fallback folder
_fallbacks: dict[str, Path] = {}


def cache_root() -> Path:
    """$HEADSCOPE_CACHE_DIR, else ~/.cache/headscope (read at each call: tests and the service set it)."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "headscope").expanduser()


def cached_folder(kind: str, digest: str) -> Path | None:
    """The published folder of `digest` (or this process's fallback one), if there is one."""
    folder = cache_root() / kind / digest
    if folder.is_dir():
        return folder
    fallback = _fallbacks.get(f"{kind}/{digest}")
    return fallback if fallback is not None and fallback.is_dir() else None


def discard(folder: Path) -> None:
    """Remove a published folder found unusable, so the next load writes it anew."""
    _fallbacks.pop(f"{folder.parent.name}/{folder.name}", None)
    shutil.rmtree(folder, ignore_errors=True)


def publish_folder(kind: str, digest: str, write: Callable[[Path], None]) -> Path:
    """`write(folder)` into a temporary folder of the cache, then rename it to kind/digest; the folder.

    An exception from `write` (or an interrupt) removes the temporary folder and propagates. Where the
    cache cannot be written (an OSError making or filling the folder), writes into a temporary folder of
    this process instead, logs one warning and returns that (removed when the process exits)."""
    parent = cache_root() / kind
    target = parent / digest
    try:
        parent.mkdir(parents=True, exist_ok=True)
        _remove_abandoned(parent, digest)
        temporary = Path(tempfile.mkdtemp(prefix=f"{_TEMPORARY}{digest}-{os.getpid()}-", dir=parent))
    except OSError as exc:
        return _fallback(kind, digest, write, f"{str(parent)!r} is not writable ({exc})")
    try:
        write(temporary)
    except OSError as exc:  # the cache's disk (full, read-only): the same write elsewhere may succeed
        shutil.rmtree(temporary, ignore_errors=True)
        return _fallback(kind, digest, write, f"writing into {str(parent)!r} failed ({exc})")
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    try:
        temporary.rename(target)
    except OSError:
        shutil.rmtree(temporary, ignore_errors=True)
        if not target.is_dir():  # not another process's publishing first: the rename itself failed
            raise
    return target


def _fallback(kind: str, digest: str, write: Callable[[Path], None], why: str) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="headscope-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    logger.warning(
        "%s: writing into %r for this process only (set %s to a writable folder to keep it)",
        why,
        str(folder),
        CACHE_ENV,
    )
    try:
        write(folder)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    _fallbacks[f"{kind}/{digest}"] = folder
    return folder


def _remove_abandoned(parent: Path, digest: str) -> None:
    """Temporary folders of `digest` whose writer process is gone (killed mid-write)."""
    for folder in parent.glob(f"{_TEMPORARY}{digest}-*"):
        pid = folder.name.removeprefix(f"{_TEMPORARY}{digest}-").split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except (ProcessLookupError, OverflowError):  # none, or a number no process can have
        return False
    except PermissionError:  # another user's
        return True
    return True
