"""The one rule for paths and links of every source: a link is followed only where it stays inside the
folder that holds it (a models folder, a store), and what an entry is (a file, a folder, a FIFO) is told
without opening it.

A source is read without anyone naming its files one by one, so it must not become a way to every file
of the machine: a file elsewhere is served when the operator names it (HEADSCOPE_MODELS). A link that
loops, dangles or leads out is refused with a sentence, names and paths quoted (repr), as a folder name
may hold a newline and the reason reaches the log.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

__all__ = ["LinkRefused", "file_kind", "follow", "inside", "resolve_link"]


class LinkRefused(ValueError):
    """A path its source cannot use, in a sentence. `target`: where its links lead (None: they cannot be
    followed, a loop); `outside`: that target is outside the source's folder."""

    def __init__(self, why: str, target: Path | None = None, *, outside: bool = False) -> None:
        super().__init__(why)
        self.target = target
        self.outside = outside


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
            raise LinkRefused(f"{path.name!r} cannot be followed ({exc.strerror})") from None
        target = None
    if target is None or _too_many_links(path):
        raise LinkRefused(f"{path.name!r} is a link loop, or a chain of links too long to follow")
    return target


def _too_many_links(path: Path) -> bool:
    try:
        os.stat(path)
    except OSError as exc:  # a dangling link, an unreadable folder: the callers' checks of the target say so
        return exc.errno == errno.ELOOP
    return False


def follow(path: Path, root: Path, *, folder: str = "the store") -> Path:
    """Where `path` leads, its links followed, where that stays inside `root` (resolved) and exists;
    LinkRefused otherwise, its sentence naming `root` as `folder` ("the models folder")."""
    target = resolve_link(path)
    if not target.is_relative_to(root):
        raise LinkRefused(
            f"{path.name!r} leads to {str(target)!r}, outside {folder} {str(root)!r}: links are followed "
            "only inside it",
            target,
            outside=True,
        )
    if not target.exists():
        raise LinkRefused(f"{path.name!r} leads to {str(target)!r}, which does not exist", target)
    return target


def inside(path: Path, root: Path) -> str | None:
    """None where a store's `path` may be followed (`follow`), else why not."""
    try:
        follow(path, root)
    except ValueError as exc:
        return str(exc)
    return None
