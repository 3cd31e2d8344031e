"""LM Studio's models folder: every <publisher>/<model>/<file>.gguf, by that path less .gguf."""

from __future__ import annotations

from pathlib import Path

from mha.loading.sources.listing import GGUF, Listing, folders, gguf_entry, listing, under

__all__ = ["SOURCE", "default_lmstudio_models", "scan_lmstudio"]

SOURCE = "lmstudio"
_STORE = "LM Studio's"


def default_lmstudio_models(home: Path | None = None) -> Path | None:
    """LM Studio's models folder, ~/.lmstudio/models, where it exists."""
    folder = (Path.home() if home is None else home) / ".lmstudio" / "models"
    return folder if folder.is_dir() else None


def scan_lmstudio(store: Path) -> Listing:
    """Every store/<publisher>/<model>/<file>.gguf, as <publisher>/<model>/<file less .gguf>; a publisher
    or model folder that cannot be used is refused as `publisher` or `publisher/model`."""
    found = Listing(SOURCE)
    root = store.resolve()
    for publisher in folders(found, store, "", root, _STORE, under("")):
        for model in folders(found, publisher, publisher.name, root, _STORE, under(publisher.name)):
            prefix = f"{publisher.name}/{model.name}"
            for file in listing(found, model, prefix, _STORE):
                if file.suffix.lower() == GGUF:
                    gguf_entry(found, f"{prefix}/{file.stem}", file, root, _STORE)
    return found
