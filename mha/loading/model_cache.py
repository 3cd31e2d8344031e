"""The cache of what is slow to rebuild from a file: content-addressed folders under HEADSCOPE_CACHE_DIR.

What a GGUF's header gives (mha.loading.gguf_checkpoint: its config, tensor names and tokenizer) is kept as
a folder named by the SHA-256 of that header, so a renamed or copied file finds it and an edited header
does not; the tensors are never kept here (mha.loading.gguf_weights reads them from the file itself):

    $HEADSCOPE_CACHE_DIR/            (default ~/.cache/headscope)
      gguf-v2/<sha256>/              a published folder: config.json, tokenizer files, gguf*.json
      gguf-v2/.tmp-<sha256>-<pid>-*  one being written (or left by a killed writer): never read
      digests/<key>                  file_digest's memo: a whole file's SHA-256 by its (path, size,
                                     mtime, ctime, inode), so a second call hashes nothing

A folder is written under a temporary name and renamed into place only once whole (a rename is atomic on
one file system), so an interrupted write leaves nothing a later load trusts. Where the cache folder
cannot be written, the folder goes to a temporary one of this process instead (removed at exit), with one
warning.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "CACHE_ENV",
    "cache_root",
    "cached_folder",
    "discard",
    "file_digest",
    "known_digest",
    "publish_folder",
]

logger = logging.getLogger(__name__)

CACHE_ENV = "HEADSCOPE_CACHE_DIR"
_TEMPORARY = ".tmp-"
# A file's timestamps are the kernel's coarse clock, truncated to its file system's resolution (1 s on some,
# 2 s on FAT): a digest is remembered only for a file last changed longer ago than that before hashing
# began, so that a write after the hash cannot leave the stamp as it was (git's "racily clean" entries).
_SETTLED_NS = 3_000_000_000
# (path, size, mtime_ns, ctime_ns, inode) -> SHA-256, and digest -> this process's fallback folder
_Stamp = tuple[str, int, int, int, int]
_digests: dict[_Stamp, str] = {}
_fallbacks: dict[str, Path] = {}


def cache_root() -> Path:
    """$HEADSCOPE_CACHE_DIR, else ~/.cache/headscope (read at each call: tests and the service set it)."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "headscope").expanduser()


def file_digest(file: Path) -> str:
    """The SHA-256 of `file`'s bytes, hashed once per (path, size, mtime, ctime, inode) and remembered on
    disk: a file changed in place gets a new ctime (which, unlike mtime, nothing can set back), so a stale
    digest is never used. Not remembered for a file changed while it was hashed or just before."""
    digest = known_digest(file)
    if digest is not None:
        return digest
    began = time.time_ns()
    stamp = _stamp(file)
    with file.open("rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    if _stamp(file) != stamp or max(stamp[2], stamp[3]) > began - _SETTLED_NS:
        return digest  # it may change again without its stamp changing: hashed anew next time
    memo = _memo(stamp)
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(memo, digest)
    except OSError as exc:  # an unwritable cache: hashed again by the next process, nothing worse
        logger.debug("could not remember the digest of %s in %s: %s", file, memo, exc)
    _digests[stamp] = digest
    return digest


def known_digest(file: Path) -> str | None:
    """`file`'s SHA-256 if file_digest has remembered it for the file as it is now; hashes nothing."""
    stamp = _stamp(file)
    if stamp in _digests:
        return _digests[stamp]
    try:
        digest = _memo(stamp).read_text(encoding="ascii").strip()
    except (OSError, ValueError):
        return None
    if len(digest) != 64 or not all(c in "0123456789abcdef" for c in digest):
        return None
    _digests[stamp] = digest
    return digest


def _stamp(file: Path) -> _Stamp:
    stat = file.stat()
    return (str(file.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino)


def _memo(stamp: _Stamp) -> Path:
    return cache_root() / "digests" / hashlib.sha256(repr(stamp).encode()).hexdigest()


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
        return _fallback(kind, digest, write, f"{parent} is not writable ({exc})")
    try:
        write(temporary)
    except OSError as exc:  # the cache's disk (full, read-only): the same write elsewhere may succeed
        shutil.rmtree(temporary, ignore_errors=True)
        return _fallback(kind, digest, write, f"writing into {parent} failed ({exc})")
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
        "%s: converting into %s for this process only (set %s to a writable folder to keep it)",
        why,
        folder,
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


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f"{_TEMPORARY}{path.name}-{os.getpid()}")
    temporary.write_text(text, encoding="ascii")
    os.replace(temporary, path)
