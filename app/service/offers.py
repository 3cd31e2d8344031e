"""The models on offer: each entry of mha's table of sources (mha.loading.sources: every folder and store
scanned once) made a loader, a cheap startup check and its source, for the registry and /api/models."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

import mha
from app.settings import Settings
from mha.loading import Progress, sources

Loader = Callable[[], mha.AttentionModel]
Check = Callable[[], object]

# The size of the "random" model (our layers, untrained weights), in /api/models and docs/configuration.md.
RANDOM_MODEL = sources.RANDOM_MODEL_NAME
RANDOM_SIZE = {"layers": 4, "heads": 8, "embed_dim": 256}


@dataclass(frozen=True)
class Offer:
    """One model on offer: where it comes from, how to load it, its cheap check (None: none), the
    checkpoint it reads (None: built in, or refused) and, for a folder's or store's entry that is not a
    model, why (its loader and check raise it)."""

    source: str
    loader: Loader
    check: Check | None = None
    path: str | Path | None = None
    refused: str | None = None


def default_model(settings: Settings) -> str:
    """The model loaded at startup: the operator's choice, else the embedded one under mha's name."""
    return settings.default_model or mha.DEFAULT_MODEL_NAME


def places(settings: Settings) -> dict[str, object]:
    """Where each source is, as the settings say (mha.loading.sources.scan_sources's `places`): a source
    left out is off; None is a store's default folder."""
    found: dict[str, object] = {
        sources.BUNDLED: sources.Bundled(llm=settings.bundled_llm, random=settings.random_model),
    }
    for field, source in source_fields().items():
        # HEADSCOPE_DISCOVER=false: no store (a source with a default folder of its own) is looked at
        if settings.discover or sources.source_of(source).default is None:
            found[source] = getattr(settings, field)
    return found


def source_fields() -> dict[str, str]:
    """Settings field -> the source id it places: the fields marked json_schema_extra={"source": ID}."""
    marked = {name: field.json_schema_extra for name, field in Settings.model_fields.items()}
    return {name: str(extra["source"]) for name, extra in marked.items() if isinstance(extra, dict)}


def find_models(settings: Settings, *, progress: Callable[[str], Progress] | None = None) -> dict[str, Offer]:
    """name -> Offer, every source scanned once, in the table's precedence (mha.loading.sources.SOURCES).

    A check reads headers only (mha.describe_checkpoint: no tensor, no hash), so /api/models names a
    broken file, and each entry's family, size and quantization, before any request loads it.

    `progress(name)`: the callable a load of `name` reports its progress to (mha.load_pretrained's)."""
    dtype = None if settings.dtype == "auto" else getattr(torch, settings.dtype)
    load = partial(
        mha.load_pretrained,
        device=settings.device,
        dtype=dtype,
        dequant_cache_bytes=settings.dequant_cache_bytes,  # None: mha's default
        dequant_compile=settings.dequant_compile,
    )

    def offer(entry: sources.SourceEntry) -> Offer:
        if entry.refused is not None:
            refuse = partial(_refuse, entry.refused)
            return Offer(entry.source, refuse, refuse, refused=entry.refused)
        if entry.source == sources.BUNDLED and entry.name == RANDOM_MODEL:
            random = partial(
                mha.random_model,
                **RANDOM_SIZE,
                causal=False,
                seed=0,
                device=settings.device,
                name=RANDOM_MODEL,
            )
            return Offer(entry.source, random)
        path = None if entry.path is None else str(entry.path)  # None: the embedded model
        reports = None if progress is None else progress(entry.name)
        loader = partial(load, path, name=entry.name, progress=reports)
        return Offer(entry.source, loader, partial(mha.describe_checkpoint, path), entry.path)

    return {name: offer(entry) for name, entry in sources.scan_sources(places(settings)).items()}


def _refuse(why: str) -> mha.AttentionModel:
    """The loader and the check of a folder's or store's entry that is not a model: its reason, in
    /api/models."""
    raise mha.CheckpointNotFoundError(why)
