"""A checkpoint directory checked from its files alone: config.json, the weight files and their headers, the
tokenizer's vocabulary; no tensor read (milliseconds).

check_files is what loading (mha.loading.checkpoint, mha.loading.pretrained) runs first, and
check_gguf_cache what a GGUF's cache (mha.loading.gguf.cache, which checks the folder it writes) runs, so
this lives below both of them: each imports it, and it imports neither.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from mha.errors import (
    CheckpointError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    TokenizerNotFoundError,
)
from mha.loading import config_snapshot
from mha.loading.convert import Converter, check_shapes, families_of, for_model_type
from mha.loading.convert.base import NetworkConfig
from mha.loading.weight_headers import Shapes, weight_shapes

__all__ = [
    "PROVENANCE",
    "TOKENIZER_VOCABULARIES",
    "Checked",
    "check_directory",
    "check_files",
    "check_gguf_cache",
    "is_gguf_cache",
    "read_config",
    "weight_files",
]

# The files a tokenizer's vocabulary can come from, each alternative complete on its own. With none of them
# transformers still builds a tokenizer (of a few special tokens, every word [UNK]), so loading checks first.
TOKENIZER_VOCABULARIES = (
    ("tokenizer.json",),  # a `tokenizers` serialization: any fast tokenizer
    ("vocab.txt",),  # WordPiece (BERT, DistilBERT)
    ("vocab.json", "merges.txt"),  # byte-level BPE (GPT-2, RoBERTa)
    ("tokenizer.model",),  # SentencePiece, under its usual names
    ("spiece.model",),
    ("sentencepiece.bpe.model",),
    ("source.spm", "target.spm", "vocab.json"),  # Marian: SentencePiece models and its own id table
)

# In a GGUF file's cache folder: which file it was read from, and by what.
PROVENANCE = "gguf.json"


def is_gguf_cache(directory: Path) -> bool:
    """Whether `directory` is a GGUF file's cached config and tokenizer (mha.loading.gguf.cache writes
    PROVENANCE into it)."""
    return (directory / PROVENANCE).is_file()


def _read_config_json(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    if not path.is_file():
        raise CheckpointNotFoundError(f"no config.json in {directory}")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # unreadable, not UTF-8, not JSON
        raise CheckpointNotFoundError(f"{path} is unreadable: {exc}") from exc
    except RecursionError:  # JSON nested deeper than the parser recurses: not a real config
        raise CheckpointNotFoundError(f"{path} is JSON nested too deeply to be a config") from None
    if not isinstance(config, dict):
        raise CheckpointNotFoundError(f"{path} is not a JSON object")
    return config


def weight_files(directory: Path) -> list[Path]:
    """The weight files to read: one safetensors file, the shards its index names, or a PyTorch pickle."""
    single = directory / "model.safetensors"
    if single.is_file():
        return [single]
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            message = f"{index} is unreadable (no weight_map of shard names): {exc}"
            raise CheckpointNotFoundError(message) from exc
        # Shards sit next to their index; a name that leads elsewhere is not a shard of this checkpoint.
        odd = [s for s in shards if not isinstance(s, str) or Path(s).name != s]
        if odd or not shards:
            raise CheckpointNotFoundError(f"{index} names no shards, or shards outside {directory}: {odd}")
        missing = [s for s in shards if not (directory / s).is_file()]
        if missing:
            raise CheckpointNotFoundError(
                f"{index.name} in {directory} names {len(missing)} shard(s) that are not there: "
                + ", ".join(missing)
            )
        return [directory / s for s in shards]
    legacy = directory / "pytorch_model.bin"
    if legacy.is_file():
        return [legacy]
    raise CheckpointNotFoundError(
        f"no weights in {directory}: expected model.safetensors, model.safetensors.index.json "
        "or pytorch_model.bin"
    )


def _check_tokenizer_files(directory: Path) -> None:
    """The checkpoint must bring its tokenizer's vocabulary: one complete TOKENIZER_VOCABULARIES entry."""
    there = {name for files in TOKENIZER_VOCABULARIES for name in files if (directory / name).is_file()}
    if any(there.issuperset(files) for files in TOKENIZER_VOCABULARIES):
        return
    alternatives = ", ".join(" + ".join(files) for files in TOKENIZER_VOCABULARIES)
    partial = [
        f"{' + '.join(sorted(there & set(files)))} without {' + '.join(sorted(set(files) - there))}"
        for files in TOKENIZER_VOCABULARIES
        if there & set(files)
    ]
    found = sorted(p.name for p in directory.glob("*") if p.name.startswith(("tokenizer", "special_tokens")))
    raise TokenizerNotFoundError(
        f"no tokenizer vocabulary in {directory}: none of {alternatives} is there"
        + (f" ({'; '.join(partial)})" if partial else "")
        + (f"; found only {', '.join(found)}" if found else "; no tokenizer files at all")
        + ". Copy the model's tokenizer files into the directory."
    )


def check_directory(directory: Path) -> tuple[dict[str, Any], Converter, list[Path]]:
    """Config, converter and weight files of a checkpoint directory, or the error loading it would give. A
    GGUF file's cached config and tokenizer (is_gguf_cache) has no weight files: its tensors are read from
    the GGUF itself (mha.loading.gguf.weights)."""
    config = _read_config_json(directory)
    converter = for_model_type(config.get("model_type"), source=str(directory / "config.json"))
    weights = [] if is_gguf_cache(directory) else weight_files(directory)
    _check_tokenizer_files(directory)
    return config, converter, weights


class Checked(NamedTuple):
    """A checkpoint directory that passed check_files, and what checking it read."""

    converter: Converter
    weights: list[Path]  # its weight files (one, or the shards)
    hf_config: Any  # config.json as transformers' AutoConfig reads it
    config: NetworkConfig  # ours, from it


def check_files(directory: Path) -> Checked:
    """check_directory, then the weights' headers against config.json, reading no tensor: the weight files
    are whole and readable (weight_headers), the weights are of config.json's family (else a
    CheckpointMismatchError naming both), config.json reads as that family's config, and the weights'
    names and shapes are those its key map wants (the CheckpointMismatchError loading would raise)."""
    raw, converter, files = check_directory(directory)
    shapes = weight_shapes(files)  # None: a legacy pickle, whose names only loading reads
    if shapes is not None:
        _check_family(directory, raw.get("model_type"), converter, shapes, files)
    hf_config, config = read_config(directory, converter)
    if shapes is not None:
        check_shapes(shapes, converter.key_map(config), config, family=converter.family)
    return Checked(converter, files, hf_config, config)


def check_gguf_cache(directory: Path) -> Checked:
    """A GGUF file's cached config and tokenizer (mha.loading.gguf.cache: no weight files, the tensors
    are read from the GGUF itself): config.json of a family we convert, read as its config, and the
    tokenizer's vocabulary; `weights` is empty."""
    _, converter, weights = check_directory(directory)
    hf_config, config = read_config(directory, converter)
    return Checked(converter, weights, hf_config, config)


def _check_family(
    directory: Path, model_type: object, converter: Converter, shapes: Shapes, files: list[Path]
) -> None:
    """Weights without the family's signature that have another family's were saved by that one."""
    if converter.matches(shapes):
        return
    others = families_of(shapes)
    if others:
        weights = files[0].name if len(files) == 1 else f"{len(files)} shards"
        raise CheckpointMismatchError(
            f"config.json in {directory} says model_type {model_type!r}, but the weights ({weights}) are a "
            f"{' or '.join(others)} checkpoint's: config.json and the weights come from different models"
        )


def read_config(directory: Path, converter: Converter) -> tuple[Any, NetworkConfig]:
    """config.json as transformers reads it, and our config from it; one that either refuses is a
    CheckpointNotFoundError quoting why (a wrongly typed or missing field). A GGUF's cache folder is read
    from its config's snapshot where it has a usable one (mha.loading.config_snapshot: no model code
    imported)."""
    kept = _kept_config(directory, converter) if is_gguf_cache(directory) else None
    if kept is not None:
        return kept
    from transformers import AutoConfig

    try:
        hf_config = AutoConfig.from_pretrained(str(directory), local_files_only=True)
        return hf_config, converter.config_from_hf(hf_config)
    except CheckpointError:
        raise
    except Exception as exc:  # transformers and our configs raise ValueError, TypeError, AttributeError...
        why = " ".join(str(exc).split())  # transformers' validation errors span lines: one line here
        raise CheckpointNotFoundError(
            f"config.json in {directory} is not a usable {converter.family} config: "
            f"{type(exc).__name__}: {why}"
        ) from exc


def _kept_config(directory: Path, converter: Converter) -> tuple[Any, NetworkConfig] | None:
    snapshot = config_snapshot.read(directory)
    if snapshot is None:
        return None
    try:
        return snapshot, converter.config_from_hf(snapshot)
    except Exception:  # NotKept, or anything else: config.json, read as usual, decides
        return None
