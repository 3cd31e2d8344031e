"""What a checkpoint is, from its headers alone: the few facts a model menu shows before anything loads.

describe_checkpoint runs the checks checkpoint_architecture runs (a broken file raises what loading would)
and adds the family, the parameter count, the quantization and the size on disk. It reads a GGUF's header
(mha.loading.gguf.read_header, read within the file's bounds) or a folder's config.json and weight headers
(checkpoint_files.check_files, weight_headers): no tensor is read and nothing is hashed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from mha.loading import checkpoint, gguf
from mha.loading.checkpoint_files import check_files
from mha.loading.weight_headers import weight_shapes
from mha.networks.seq2seq import Seq2SeqConfig

__all__ = ["CheckpointFacts", "describe_checkpoint"]


@dataclass(frozen=True)
class CheckpointFacts:
    architecture: str  # encoder, decoder or encoder-decoder
    family: str  # GGUF general.architecture (llama, qwen2, ...) or config.json's model_type
    parameters: int | None  # weights in all, from the tensors' shapes; None for a legacy pickle
    quantization: str | None  # Q4_K_M, Q8_0, F16, ... (GGUF), or the folder's float type (F32, BF16)
    size_bytes: int  # the weight files on disk


def describe_checkpoint(path: str | Path | None) -> CheckpointFacts | None:
    """The facts of a local checkpoint (a GGUF file or a checkpoint folder; None: the embedded default);
    None for a hub id not on disk.
    Raises what checkpoint_architecture raises for a broken one."""
    gguf_file = gguf.find_gguf(path)
    if gguf_file is not None:
        header = gguf.read_header(gguf_file)
        size = gguf_file.stat().st_size
        return CheckpointFacts("decoder", header.architecture, header.parameters, header.quantization, size)
    directory = checkpoint.local_directory(path)
    if directory is None:
        return None
    checked = check_files(directory)
    shapes = weight_shapes(checked.weights)  # headers only, as check_files read them
    parameters = None if shapes is None else sum(math.prod(shape) for shape in shapes.values())
    architecture = (
        "encoder-decoder" if isinstance(checked.config, Seq2SeqConfig) else checked.config.architecture
    )
    return CheckpointFacts(
        architecture,
        checked.converter.family,
        parameters,
        _stored_type(checked.weights),
        sum(file.stat().st_size for file in checked.weights),
    )


def _stored_type(files: list[Path]) -> str | None:
    """The type holding the most weights of safetensors files (F32, BF16, ...: safetensors' own names, as
    GGUF's), from their headers; None for .bin files, whose types only loading reads."""
    from safetensors import safe_open

    weights: dict[str, int] = {}
    for file in files:
        if file.suffix != ".safetensors":
            return None
        with safe_open(str(file), "pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is no mapping)
                tensor = f.get_slice(key)
                kind = str(tensor.get_dtype())
                weights[kind] = weights.get(kind, 0) + math.prod(tensor.get_shape())
    return max(weights, key=weights.__getitem__) if weights else None
