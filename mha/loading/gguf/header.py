"""What a GGUF file's header says, read once a load: `Header` (its metadata's numbers, its architecture and
name, its tensor table), checked before anything is built or cached.

read_header walks the header once (mha.loading.gguf.bounds: every count and length held to the file's
bytes) and then checks what it says: an architecture we take, tensors, and a config its tensors bear out
(check_config). Everything after it in a load takes the Header, not the file: the cache is keyed by its
digest, the weights are read at its tensor table's offsets, the memory estimate counts its tensors.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from mha.errors import CheckpointMismatchError, CheckpointNotFoundError, UnsupportedCheckpointError
from mha.loading.convert import CONVERTERS
from mha.loading.gguf import bounds
from mha.loading.gguf.bounds import TensorEntry

__all__ = [
    "FILE_TYPE_KEY",
    "Header",
    "TensorEntry",
    "architecture",
    "check_config",
    "header_digest",
    "read_header",
    "supported_architectures",
]

FILE_TYPE_KEY = "general.file_type"  # llama.cpp's LlamaFileType: the file's quantization as a whole
_NOT_TAKEN = frozenset({"t5"})  # see supported_architectures
_HEADER_HASH = "sha256"


@dataclass(frozen=True)
class Header:
    """A GGUF file's header, as read_header read and checked it; no tensor data read."""

    file: Path
    architecture: str  # general.architecture, llama.cpp's name (llama, qwen2, gemma2, ...)
    name: str | None  # general.name
    fields: dict[str, Any]  # the metadata's numbers (and per-layer head counts), by key
    vocab: int  # tokenizer.ggml.tokens' entries
    tensors: tuple[TensorEntry, ...]
    data_start: int  # where the tensor data begins

    @property
    def tensor_types(self) -> dict[str, int]:
        """ggml type name (F16, Q4_1, ...) -> how many tensors are of it."""
        types: dict[str, int] = {}
        for entry in self.tensors:
            kind = _type_name(entry.ggml_type)
            types[kind] = types.get(kind, 0) + 1
        return types

    @property
    def weights(self) -> dict[str, int]:
        """ggml type name -> how many weights are stored in it."""
        weights: dict[str, int] = {}
        for entry in self.tensors:
            kind = _type_name(entry.ggml_type)
            weights[kind] = weights.get(kind, 0) + math.prod(entry.shape)
        return weights

    @property
    def parameters(self) -> int:
        """Weights in all, from the tensors' shapes."""
        return sum(math.prod(entry.shape) for entry in self.tensors)

    @property
    def quantization(self) -> str | None:
        """general.file_type as llama.cpp names it (Q4_K_M, F16, ...), else the type holding the most
        weights."""
        weights = self.weights
        return _file_type(self.fields.get(FILE_TYPE_KEY)) or max(weights, key=weights.__getitem__)

    @cached_property
    def digest(self) -> str:
        """The SHA-256 of every byte before the tensor data: what the cache is keyed by (milliseconds,
        where hashing a 5 GB file takes seconds)."""
        return _digest(self.file, self.data_start)


def read_header(file: Path) -> Header:
    """The header of a GGUF file, no tensor data read; CheckpointNotFoundError for a file that is not GGUF,
    is damaged or cut short (a tensor that would end past the file's end), UnsupportedCheckpointError for
    an architecture we do not take, naming it and those we do, CheckpointMismatchError for a config its
    tensors belie (check_config)."""
    layout = bounds.walk(file)
    arch = layout.fields.get("general.architecture")
    if arch is None:
        raise CheckpointNotFoundError(
            f"{file} ({file.stat().st_size:,} bytes) is not a readable GGUF file: "
            "no general.architecture in its metadata"
        )
    arch = str(arch)
    supported = supported_architectures()
    if arch not in supported:
        raise UnsupportedCheckpointError(
            f"{file.name} is a GGUF of architecture {arch!r}, which headscope does not read from GGUF; "
            f"it takes GGUF files of {', '.join(supported)}"
        )
    if not layout.tensors:
        raise CheckpointNotFoundError(f"{file} is a GGUF file without tensors")
    check_config(file, arch, layout.fields, [entry.name for entry in layout.tensors])
    name = layout.fields.get("general.name")
    return Header(
        file,
        arch,
        None if name is None else str(name),
        layout.fields,
        layout.vocab,
        layout.tensors,
        layout.data_start,
    )


def architecture(file: Path) -> str:
    """What a GGUF file holds ("decoder": every architecture we take from GGUF is one), from its header
    (read_header's checks), without reading a tensor or the cache."""
    read_header(file)
    return "decoder"


def header_digest(file: Path) -> str:
    """Header.digest of any GGUF file whose header is within its bounds, of an architecture we take or not
    (a file's cache folder named, say, to show that none was written)."""
    return _digest(file, bounds.walk(file).data_start)


def _digest(file: Path, data_start: int) -> str:
    with file.open("rb") as f:
        return hashlib.new(_HEADER_HASH, f.read(data_start)).hexdigest()


def supported_architectures() -> list[str]:
    """The GGUF architectures we take: those transformers' GGUF loader maps (and gguf names: transformers
    maps a "mistral" that gguf does not know, so it cannot name its tensors) whose family we convert.
    llama.cpp writes Mistral models as "llama"; they load as Llama, as in transformers.

    Not T5: transformers reads a T5 GGUF as gated ReLU (it sets is_gated_act and leaves the activation at
    T5Config's "relu"), where the Flan-T5 llama.cpp converts is gated GELU, so from the second layer on its
    attention would not be the model's."""
    from gguf import MODEL_ARCH_NAMES
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    known = set(MODEL_ARCH_NAMES.values())
    return sorted(
        a for a in GGUF_SUPPORTED_ARCHITECTURES if a in CONVERTERS and a in known and a not in _NOT_TAKEN
    )


def _type_name(ggml_type: int) -> str:
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType(ggml_type).name


def _file_type(value: object) -> str | None:
    """llama.cpp's name for a general.file_type ("MOSTLY_Q4_K_M" -> "Q4_K_M"); None for none or unknown."""
    from gguf import LlamaFileType

    try:
        name = LlamaFileType(int(value)).name  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def check_config(file: Path, arch: str, fields: dict[str, Any], tensors: list[str]) -> None:
    """The header's config against its tensors, before anything is built: heads that exist and divide the
    width, and one set of tensors for each layer the file claims, each failure a sentence naming the file.
    (The tensors' shapes are checked against the config when its cache is written, from the same names.)"""

    def refuse(why: str) -> CheckpointMismatchError:
        return CheckpointMismatchError(f"{file.name} does not hold the model its header describes: {why}")

    def counts(key: str) -> list[int]:
        value = fields.get(f"{arch}.{key}")
        values = value if isinstance(value, list) else [] if value is None else [value]
        return [int(v) for v in values]

    heads, kv_heads, width = (
        counts("attention.head_count"),
        counts("attention.head_count_kv"),
        counts("embedding_length"),
    )
    if any(h < 1 for h in heads):
        shown = heads[0] if len(heads) == 1 else heads
        raise refuse(f"{arch}.attention.head_count is {shown}; a layer needs 1 or more")
    if any(h < 1 for h in kv_heads):
        raise refuse(f"{arch}.attention.head_count_kv is {kv_heads[0] if len(kv_heads) == 1 else kv_heads}")
    for h, kv in zip(heads, kv_heads or heads, strict=False):
        if h % kv:
            raise refuse(f"{h} query heads are not a whole number of groups of the {kv} key/value heads")
    if width and heads and width[0] % heads[0] and f"{arch}.attention.key_length" not in fields:
        raise refuse(f"{arch}.embedding_length ({width[0]}) is not divisible by head_count ({heads[0]})")
    if "token_embd.weight" not in tensors:
        raise refuse("it has no token_embd.weight (the token embeddings)")
    layers = counts("block_count")
    if layers:
        found = {
            int(name.split(".")[1])
            for name in tensors
            if name.startswith("blk.") and name.split(".")[1].isdigit()
        }
        missing = sorted(set(range(layers[0])) - found)
        extra = sorted(found - set(range(layers[0])))
        if missing:
            plural = "s" if len(missing) > 1 else ""
            raise refuse(
                f"{arch}.block_count is {layers[0]:,}, but no tensors of layer{plural} {_spans(missing)}"
            )
        if extra:
            raise refuse(
                f"{arch}.block_count is {layers[0]:,}, but it holds tensors of layers {_spans(extra)}"
            )


def _spans(numbers: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2, 5" (at most 4 spans, then "...")."""
    spans: list[str] = []
    start = previous = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == previous + 1:
            previous = n
            continue
        spans.append(str(start) if start == previous else f"{start}-{previous}")
        if n is not None:
            start = previous = n
    return ", ".join(spans[:4]) + (", ..." if len(spans) > 4 else "")
