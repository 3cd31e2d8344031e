"""A models folder (the service's HEADSCOPE_MODELS_DIR): each subfolder holding a config.json, by folder
name, and each *.gguf file (an ollama or LM Studio download as it is), by file name less the suffix."""

from __future__ import annotations

from pathlib import Path

from mha.loading.sources.links import LinkRefused, file_kind, follow
from mha.loading.sources.listing import GGUF, Listing

__all__ = ["SOURCE", "scan_models_folder"]

SOURCE = "models_dir"
_FOLDER = "the models folder"
_NAME_IT = "; name the model in HEADSCOPE_MODELS to serve it"


def scan_models_folder(directory: Path) -> Listing:
    """Every model of `directory` (sorted, non-recursive), by the one rule for links (links.follow): a link
    is followed only where it resolves inside the folder. An entry named *.gguf that is not a regular file
    (a folder, a FIFO, a device such as a link to /dev/zero, a socket), a dangling link, a link loop and a
    link leading outside (to a file named *.gguf or to a folder, never looked into) are refused with the
    reason, and never opened (opening a FIFO would wait forever). Anything else is not a model and is left
    out: a plain file, a folder without a config.json, a link to either. ValueError where `directory` is
    not a folder: the operator named it."""
    if not directory.is_dir():
        raise ValueError(f"models_dir {str(directory)!r} is not a directory")
    root = directory.resolve()
    found = Listing(SOURCE)
    for child in sorted(directory.iterdir()):
        gguf = child.suffix.lower() == GGUF
        name = child.stem if gguf else child.name
        if child.is_symlink():
            try:
                follow(child, root, folder=_FOLDER)
            except LinkRefused as exc:
                # A link to a plain file, or a dangling one, is a model only when its name says *.gguf.
                if gguf or exc.target is None or (exc.outside and exc.target.is_dir()):
                    found.refuse(name, f"{exc}{_NAME_IT if exc.outside else ''}")
                continue
        if gguf:
            why = file_kind(child)
            if why is None:
                found.find(name, child)
            else:
                found.refuse(name, f"{child.name!r} is {why}, not a GGUF file")
        elif child.is_dir() and (child / "config.json").is_file():
            found.find(name, child)
    return found
