"""load_pretrained() and random_model() -> AttentionModel: mha.loading's load_network() and random_network(),
each with the same parameters and failures, their LoadedNetwork behind the facade."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import fields
from typing import ParamSpec

from mha.loading.pretrained import LoadedNetwork, load_network, random_network
from mha.model.attention_model import AttentionModel

P = ParamSpec("P")


def _facade(load: Callable[P, LoadedNetwork], name: str, doc: str) -> Callable[P, AttentionModel]:
    """`load`, its LoadedNetwork made an AttentionModel: one signature, kept where the loading is."""

    @functools.wraps(load)
    def made(*args: P.args, **kwargs: P.kwargs) -> AttentionModel:
        loaded = load(*args, **kwargs)
        # LoadedNetwork's fields are AttentionModel's parameters, by name.
        return AttentionModel(**{field.name: getattr(loaded, field.name) for field in fields(loaded)})

    made.__name__ = made.__qualname__ = name
    made.__doc__ = f"{doc}\n\n{load.__name__} (mha.loading.pretrained):\n{inspect.getdoc(load)}"
    signature = inspect.signature(load)
    made.__signature__ = signature.replace(return_annotation="AttentionModel")  # type: ignore[attr-defined]
    return made


load_pretrained = _facade(
    load_network,
    "load_pretrained",
    "The AttentionModel of a Hugging Face checkpoint folder or a GGUF file (or a folder holding one); path "
    'None or "all-MiniLM-L6-v2" is the embedded default. Every failure is a CheckpointError subclass.',
)
random_model = _facade(
    random_network,
    "random_model",
    "An AttentionModel of our layers with random weights (any size) and the default model's tokenizer: an "
    "untrained baseline.",
)
