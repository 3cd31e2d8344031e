"""load_pretrained(), random_model() -> AttentionModel: a network loaded by mha.loading, behind the facade."""

from __future__ import annotations

from pathlib import Path

import torch

from mha.loading.load_progress import Progress
from mha.loading.pretrained import LoadedNetwork, load_network, random_network
from mha.model.attention_model import AttentionModel


def load_pretrained(
    path: str | Path | None = None,
    *,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype | None = None,
    name: str | None = None,
    dequant_cache_bytes: int | None = None,
    dequant_compile: bool = False,
    progress: Progress | None = None,
) -> AttentionModel:
    """The AttentionModel of a Hugging Face checkpoint folder or a GGUF file (or a folder holding one).
    path None or "all-MiniLM-L6-v2" is the embedded default. The options and failures are
    mha.loading.pretrained.load_network's: every failure a CheckpointError subclass (mha.errors)."""
    return _model(
        load_network(
            path,
            device=device,
            dtype=dtype,
            name=name,
            dequant_cache_bytes=dequant_cache_bytes,
            dequant_compile=dequant_compile,
            progress=progress,
        )
    )


def random_model(
    *,
    layers: int = 4,
    heads: int = 8,
    embed_dim: int = 256,
    causal: bool = False,
    seed: int = 0,
    device: str | torch.device = "cpu",
    name: str | None = None,
) -> AttentionModel:
    """Our layers with random weights (any size) and the default model's tokenizer: an untrained baseline."""
    return _model(
        random_network(
            layers=layers,
            heads=heads,
            embed_dim=embed_dim,
            causal=causal,
            seed=seed,
            device=device,
            name=name,
        )
    )


def _model(loaded: LoadedNetwork) -> AttentionModel:
    return AttentionModel(
        loaded.network,
        loaded.tokenizer,
        info=loaded.info,
        pair_template=loaded.pair_template,
        lm_head=loaded.lm_head,
        eos_ids=loaded.eos_ids,
        logits_bias=loaded.logits_bias,
    )
