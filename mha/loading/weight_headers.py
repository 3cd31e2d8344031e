"""A checkpoint's weight names and shapes, read from the files' headers without reading their data.

safetensors: the library's own reader (`safe_open`) maps the file and parses only its header. It refuses a
header length past its limit before reading a byte of it, and a header whose tensors do not end exactly at
the file's end (cut short, or bytes added), so what passes here is what loading reads. When it refuses,
`_why` words the reason from the first 8 bytes, the header and the file's size.

pytorch_model.bin in torch's zip format (every torch.save since 1.6): torch.load with mmap unpickles the
names and shapes and maps the data without reading it. A legacy pickle (before 1.6) cannot be read without
loading it all: only its first byte is checked, and its names and shapes are left to loading.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Sequence
from pathlib import Path

import torch

from mha.errors import CheckpointNotFoundError

__all__ = ["SAFETENSORS_MAX_HEADER", "Shapes", "weight_shapes"]

Shapes = dict[str, tuple[int, ...]]  # their key -> shape

# safetensors' own MAX_HEADER_SIZE (100 MB): it refuses a longer header unread, and so does `_why`
SAFETENSORS_MAX_HEADER = 100_000_000
_NOT_SAFETENSORS = "damaged, or not safetensors"
_PICKLE_PROTO = b"\x80"  # the opcode every pickle of protocol 2 or later starts with (legacy torch.save)
_ZIP_MAGIC = b"PK"


def weight_shapes(files: Sequence[Path]) -> Shapes | None:
    """Every weight's shape by its name in the checkpoint, over all the files (shards); None when one is a
    legacy pickle, whose names only loading can read. A file that is cut short, damaged or not weights at
    all raises CheckpointNotFoundError naming it and saying what is wrong."""
    shapes: Shapes = {}
    for file in files:
        found = _pickle_shapes(file) if file.suffix == ".bin" else _safetensors_shapes(file)
        if found is None:
            return None
        shapes.update(found)
    return shapes


def _safetensors_shapes(file: Path) -> Shapes:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(file), framework="pt") as f:
            return {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}  # noqa: SIM118 (not a mapping)
    except (SafetensorError, OSError) as exc:
        raise CheckpointNotFoundError(
            f"{file} is not a readable safetensors file: {_why(file, exc)}"
        ) from exc


def _why(file: Path, exc: Exception) -> str:
    """What is wrong with a safetensors file the library refused, in words: its length field (the first 8
    bytes, little-endian) against the file's size and the limit, its header, where its data ends."""
    try:
        size = file.stat().st_size
        with file.open("rb") as f:
            length = int.from_bytes(f.read(8), "little")
            if size < 8:
                return f"it has {size} bytes, fewer than the 8 that give the header's length"
            if length > min(SAFETENSORS_MAX_HEADER, size - 8):
                past = f"the file's {size:,} bytes" if length > size - 8 else "safetensors' limit of 100 MB"
                return f"its first 8 bytes give a header of {length:,} bytes, past {past}: {_NOT_SAFETENSORS}"
            header = json.loads(f.read(length))  # no longer than the limit or the file: never a huge read
            ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except OSError as unreadable:
        return str(unreadable)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return f"its {length:,}-byte header is not a safetensors header: {_NOT_SAFETENSORS} ({exc})"
    data_end = 8 + length + max(ends, default=0)
    if data_end > size:
        return (
            f"its header puts the tensors' data up to byte {data_end:,} but the file has {size:,} bytes: "
            "cut short (an interrupted download or copy?)"
        )
    if data_end < size:
        return f"its header puts the tensors' data up to byte {data_end:,} but the file has {size:,} bytes"
    return str(exc)  # the library's own words for whatever else it refuses


def _pickle_shapes(file: Path) -> Shapes | None:
    if zipfile.is_zipfile(file):
        try:
            # mmap: the storages are mapped, not read; weights_only: a pickle from the internet runs no code.
            state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        except Exception as exc:  # torch raises RuntimeError, UnpicklingError, ... for a damaged archive
            raise CheckpointNotFoundError(f"{file} could not be read as PyTorch weights: {exc}") from exc
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise CheckpointNotFoundError(f"{file} does not hold a state dict (weight name -> tensor)")
        return {str(key): tuple(value.shape) for key, value in state.items()}
    with file.open("rb") as f:
        start = f.read(2)
    if start[:1] == _PICKLE_PROTO:
        return None  # a legacy torch.save: loading reads it
    if start == _ZIP_MAGIC:
        raise CheckpointNotFoundError(f"{file} is a zip archive cut short or damaged (no central directory)")
    raise CheckpointNotFoundError(
        f"{file} is neither a PyTorch zip checkpoint nor a pickle: damaged, or not weights"
    )
