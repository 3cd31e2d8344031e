"""Copies of a tiny BERT checkpoint (tests/checkpoints.py) broken in each way its weights or config can be,
with the error and message check_checkpoint must give before any load (tests/mha/test_weight_headers.py)
and /api/models right after startup (tests/app/test_registry.py)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from mha import CheckpointError, CheckpointMismatchError, CheckpointNotFoundError

WEIGHTS = "model.safetensors"
QUERY = "encoder.layer.0.attention.self.query.weight"  # (HIDDEN, HIDDEN) = (32, 32) in the tiny BERT
GONE = ("encoder.layer.1.output.dense.weight", "encoder.layer.1.output.dense.bias")  # in key map order


def _truncate(directory: Path) -> None:
    data = (directory / WEIGHTS).read_bytes()
    (directory / WEIGHTS).write_bytes(data[:-100])  # as an interrupted download leaves it


def _garbage(directory: Path) -> None:
    (directory / WEIGHTS).write_bytes(b"<html>404 Not Found</html>\n" * 40)  # a saved error page


def _huge_header(directory: Path) -> None:
    # The first 8 bytes (the header's length, little-endian) say 10 GB: refused before any of it is read.
    (directory / WEIGHTS).write_bytes((10 * 10**9).to_bytes(8, "little") + b'{"a": 1}' * 100)


def _edit_weights(edit: Callable[[dict[str, torch.Tensor]], None]) -> Callable[[Path], None]:
    def apply(directory: Path) -> None:
        weights = load_file(directory / WEIGHTS)
        edit(weights)
        save_file(weights, directory / WEIGHTS, metadata={"format": "pt"})

    return apply


def _misshape(weights: dict[str, torch.Tensor]) -> None:
    weights[QUERY] = torch.zeros(16, 32)


def _drop(weights: dict[str, torch.Tensor]) -> None:
    for key in GONE:
        del weights[key]


def _config_says_t5(directory: Path) -> None:
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "model_type": "t5"}))


# variant -> (how it breaks a copy, the error, a regex its message matches)
BROKEN_WEIGHTS: dict[str, tuple[Callable[[Path], None], type[CheckpointError], str]] = {
    "truncated": (
        _truncate,
        CheckpointNotFoundError,
        r"model.safetensors is not a readable safetensors file: its header puts the tensors' data up to byte "
        r"[\d,]+ but the file has [\d,]+ bytes: cut short",
    ),
    "garbage": (
        _garbage,
        CheckpointNotFoundError,
        r"model.safetensors is not a readable safetensors file: its first 8 bytes give a header of [\d,]+ "
        r"bytes, past the file's 1,080 bytes: damaged, or not safetensors",
    ),
    "huge header": (
        _huge_header,
        CheckpointNotFoundError,
        r"its first 8 bytes give a header of 10,000,000,000 bytes, past the file's 808 bytes",
    ),
    "mis-shaped": (
        _edit_weights(_misshape),
        CheckpointMismatchError,
        rf"mis-shaped keys \(1\): {QUERY} \(16, 32\),.* \(expected \(96, 32\) for layers.0.attn.in_proj",
    ),
    "missing keys": (
        _edit_weights(_drop),
        CheckpointMismatchError,
        rf"missing keys \(2\): {GONE[0]}, {GONE[1]}",
    ),
    "config says t5": (
        _config_says_t5,
        CheckpointMismatchError,
        r"config.json in .* says model_type 't5', but the weights \(model.safetensors\) are a bert or "
        r"roberta checkpoint's",
    ),
}


def break_checkpoint(good: Path, directory: Path, variant: str) -> Path:
    """A copy of the checkpoint `good` at `directory`, broken as BROKEN_WEIGHTS[variant] says."""
    shutil.copytree(good, directory)
    BROKEN_WEIGHTS[variant][0](directory)
    return directory


def shard_checkpoint(directory: Path) -> list[str]:
    """Split `directory`'s model.safetensors into two shards and their index, as a sharded save lays them out;
    the shards' names, in order."""
    weights = load_file(directory / WEIGHTS)
    (directory / WEIGHTS).unlink()
    keys = sorted(weights)
    names = [f"model-0000{i}-of-00002.safetensors" for i in (1, 2)]
    save_file({k: weights[k] for k in keys[:10]}, directory / names[0])
    save_file({k: weights[k] for k in keys[10:]}, directory / names[1])
    index = {"weight_map": {k: names[i >= 10] for i, k in enumerate(keys)}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return names
