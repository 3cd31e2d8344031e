"""Where models come from, found without anyone naming a file one by one: one table (`SOURCES`) of the
bundled models, the operator's names (HEADSCOPE_MODELS), the models folder, ollama, LM Studio and the
Hugging Face hub cache, each scanned into one entry type (`SourceEntry`: name, source, path, why refused).

- ``table``: `SOURCES` (id, menu label, precedence, scan, default place) and `scan_sources`.
- ``links``: the one rule for paths and links (`follow`: inside the source's folder, or refused).
- ``listing``: `SourceEntry`, `Listing` (one source's entries) and the folder walk the stores share.
- ``folder``, ``ollama``, ``lmstudio``, ``hf_cache``: one module per kind of folder.

A scan reads folder listings, ollama's small JSON manifests and config.json files, never a weight (the
caller's cheap check reads the headers). A name is never a path: it is what the source calls the model
(`ollama run`'s name, LM Studio's publisher/model/file, a repo id), and the path behind it comes from the
scan. One broken entry costs only itself, never the scan; a FIFO, device or socket is never opened.

May import: ``mha.loading`` (gguf, checkpoint, convert), nothing above it. Never web code.
"""

from mha.loading.sources.folder import scan_models_folder
from mha.loading.sources.hf_cache import HF_SNAPSHOT_FILES, default_hf_cache, scan_hf_cache
from mha.loading.sources.links import LinkRefused, file_kind, follow, resolve_link
from mha.loading.sources.listing import MANIFEST_MAX_BYTES, Listing, SourceEntry
from mha.loading.sources.lmstudio import default_lmstudio_models, scan_lmstudio
from mha.loading.sources.ollama import OLLAMA_MODEL_LAYER, default_ollama_models, scan_ollama
from mha.loading.sources.table import (
    BUNDLED,
    OPERATOR,
    RANDOM_MODEL_NAME,
    SOURCES,
    Bundled,
    Source,
    scan_sources,
    source_of,
)

__all__ = [
    "BUNDLED",
    "HF_SNAPSHOT_FILES",
    "MANIFEST_MAX_BYTES",
    "OLLAMA_MODEL_LAYER",
    "OPERATOR",
    "RANDOM_MODEL_NAME",
    "SOURCES",
    "Bundled",
    "LinkRefused",
    "Listing",
    "Source",
    "SourceEntry",
    "default_hf_cache",
    "default_lmstudio_models",
    "default_ollama_models",
    "file_kind",
    "follow",
    "resolve_link",
    "scan_hf_cache",
    "scan_lmstudio",
    "scan_models_folder",
    "scan_ollama",
    "scan_sources",
    "source_of",
]
