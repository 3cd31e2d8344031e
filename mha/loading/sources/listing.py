"""What a source lists: one `SourceEntry` a name (a model, or why an entry that looks like one cannot be),
gathered in a `Listing`; and the walk every store shares, folder by folder, each broken entry costing only
itself, never the scan."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mha.loading.sources.links import file_kind, inside

__all__ = [
    "MANIFEST_MAX_BYTES",
    "Listing",
    "SourceEntry",
    "folders",
    "gguf_entry",
    "listing",
    "small_json",
    "under",
]

MANIFEST_MAX_BYTES = 1 << 20  # an ollama manifest is ~1 KB; a config.json tens of KB
GGUF = ".gguf"
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)  # llama-gguf-split's part names


@dataclass(frozen=True)
class SourceEntry:
    """One name a source offers: `path` the file or folder to load (None: built in, or refused), `source`
    the id of the source (its row of mha.loading.sources.SOURCES), `refused` why it cannot be a model."""

    name: str
    source: str
    path: Path | None = None
    refused: str | None = None


class Listing(dict[str, SourceEntry]):
    """name -> SourceEntry, as one source's scan found them (a later entry of a name replaces it)."""

    def __init__(self, source: str) -> None:
        super().__init__()
        self.source = source

    def find(self, name: str, path: Path | None) -> None:
        self[name] = SourceEntry(name, self.source, path)

    def refuse(self, name: str, why: str) -> None:
        self[name] = SourceEntry(name, self.source, refused=why)

    @property
    def found(self) -> dict[str, Path | None]:
        """name -> the path to load, of every entry not refused."""
        return {name: entry.path for name, entry in self.items() if entry.refused is None}

    @property
    def refused(self) -> dict[str, str]:
        """name -> why not, a sentence."""
        return {name: entry.refused for name, entry in self.items() if entry.refused is not None}


def listing(found: Listing, folder: Path, name: str, store: str) -> list[Path]:
    """What `folder` holds (sorted); where it cannot be listed, nothing, and `name` refused with why. The
    store's own folder (name "") is the caller's to report: OSError."""
    try:
        return sorted(folder.iterdir())
    except OSError as exc:
        if not name:
            raise
        found.refuse(name, f"{store} {name!r}: its folder {folder.name!r} cannot be read ({exc.strerror})")
        return []


def folders(
    found: Listing, folder: Path, name: str, root: Path, store: str, named: Callable[[Path], str | None]
) -> list[Path]:
    """The subfolders of `folder` (sorted) that stay inside `root`. A link among its entries that loops,
    dangles or leads out of the store is refused under named(link) with why (None: not an entry of the
    store's, such as a hub cache's datasets, and skipped), as a file link is: never silently dropped."""
    kept = []
    for child in listing(found, folder, name, store):
        if child.is_symlink() and (why := inside(child, root)) is not None:
            if (child_name := named(child)) is not None:
                found.refuse(child_name, f"{store} {child_name!r}: {why}")
        elif child.is_dir():
            kept.append(child)
    return kept


def under(name: str) -> Callable[[Path], str]:
    """A folder's entries named by their path in the store: "pub", then "pub/model"."""
    return lambda child: f"{name}/{child.name}" if name else child.name


def small_json(file: Path, what: str) -> Any:
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


def gguf_entry(found: Listing, name: str, file: Path, root: Path, store: str) -> None:
    """`file` found under `name`, or refused with why: a link leading out of the store, not a regular
    file, or one part of a split GGUF (listed once, by its first part)."""
    split = _SPLIT.search(file.name)
    if split is not None and int(split[1]) != 1:
        return
    why = inside(file, root) or (
        f"{file.name!r} is {kind}, not a GGUF file" if (kind := file_kind(file)) else None
    )
    if why is None and split is not None:
        why = (
            f"{file.name!r} is the first of {int(split[2])} parts of a split GGUF; headscope reads a GGUF in "
            "one file (llama.cpp's `llama-gguf-split --merge` joins them)"
        )
    if why is None:
        found.find(name, file)
    else:
        found.refuse(name, f"{store} {name!r}: {why}")
