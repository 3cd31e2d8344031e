"""Checkpoint converters: one module per family, Hugging Face names -> ours.

Each family module declares a `Converter`: a `config_from_hf` and a `KeyMap` (our key -> their keys,
GPT-2's transposed Conv1D keys, the keys we knowingly skip); the shared machinery is in `base`.
`for_model_type(config.json's model_type)` picks the family; `families_of(weight names)` says which
families' checkpoints name their weights so, from each family's `signature`.

May import: ``mha.networks`` (the configs it fills), ``mha.core`` and ``mha.errors``. Nothing else of ``mha``.
"""

from __future__ import annotations

from collections.abc import Collection

from mha.errors import UnsupportedCheckpointError
from mha.loading.convert.bart import BART
from mha.loading.convert.base import (
    Converter,
    KeyMap,
    activation_from_hf,
    check_shapes,
    convert_state_dict,
    expected_shapes,
)
from mha.loading.convert.bert import BERT, ROBERTA
from mha.loading.convert.distilbert import DISTILBERT
from mha.loading.convert.gemma2 import GEMMA2
from mha.loading.convert.gemma3 import GEMMA3
from mha.loading.convert.gemma3 import MODEL_TYPES as GEMMA3_MODEL_TYPES
from mha.loading.convert.gpt2 import GPT2
from mha.loading.convert.llama import LLAMA
from mha.loading.convert.marian import MARIAN
from mha.loading.convert.mistral import MISTRAL
from mha.loading.convert.phi3 import PHI3
from mha.loading.convert.qwen2 import QWEN2
from mha.loading.convert.qwen3 import QWEN3
from mha.loading.convert.t5 import MT5, T5

__all__ = [
    "CONVERTERS",
    "Converter",
    "KeyMap",
    "activation_from_hf",
    "check_shapes",
    "convert_state_dict",
    "expected_shapes",
    "families_of",
    "for_model_type",
]

# model_type in a checkpoint's config.json -> its converter
CONVERTERS: dict[str, Converter] = {
    c.family: c
    for c in (
        BERT,
        ROBERTA,
        DISTILBERT,
        GPT2,
        LLAMA,
        MISTRAL,
        QWEN2,
        QWEN3,
        GEMMA2,
        GEMMA3,
        PHI3,
        T5,
        MT5,
        BART,
        MARIAN,
    )
}

# model_types one family's converter reads besides its own name (Gemma 3's text model)
_FAMILY_OF = {model_type: GEMMA3.family for model_type in GEMMA3_MODEL_TYPES}


def for_model_type(model_type: object, *, source: str = "config.json") -> Converter:
    """The converter of a config.json's `model_type`; any other raises UnsupportedCheckpointError naming
    it (and `source`, where it was read) and listing the supported ones."""
    converter = CONVERTERS.get(_FAMILY_OF.get(str(model_type), str(model_type)))
    if converter is None:
        supported = ", ".join(sorted({*CONVERTERS, *_FAMILY_OF}))
        raise UnsupportedCheckpointError(
            f"model_type {model_type!r} in {source} is not supported; supported: {supported}"
        )
    return converter


def families_of(keys: Collection[str]) -> list[str]:
    """The families whose checkpoints have weights of these names (sorted; several where they name their
    weights alike: BERT and RoBERTa, the Llama-like decoders, T5 and mT5, BART and Marian)."""
    return sorted(family for family, converter in CONVERTERS.items() if converter.matches(keys))
