"""Hostile GGUF files, written byte by byte (struct), most over a sparse file of zeros, as issue 33's probe
wrote them: shared by tests/mha/test_gguf_bounds.py and benchmarks/hostile_gguf.py.

`HOSTILE` maps a case to (header bytes, sparse size or None, what the refusal's sentence must say);
`write(path, data, size)` writes one (`size`: truncated up to it, the rest reading as zeros, no disk used).
"""

from __future__ import annotations

import struct
from pathlib import Path

from mha.loading.gguf import MAX_TENSORS, MAX_VOCAB

SPARSE = 256 * 2**20  # the probe's file size: a sparse file, so no disk is used


def string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def key(key: str, kind: int, payload: bytes) -> bytes:
    return string(key) + struct.pack("<I", kind) + payload


def header(keys: list[bytes], tensors: list[bytes] = (), *, tensor_count: int | None = None,
            key_count: int | None = None, version: int = 3) -> bytes:  # fmt: skip
    count = len(tensors) if tensor_count is None else tensor_count
    head = b"GGUF" + struct.pack("<IQQ", version, count, len(keys) if key_count is None else key_count)
    return head + b"".join(keys) + b"".join(tensors)


def tensor(name: str, shape: list[int], kind: int = 0, offset: int = 0) -> bytes:
    return (
        string(name)
        + struct.pack("<I", len(shape))
        + struct.pack(f"<{len(shape)}Q", *shape)
        + (struct.pack("<IQ", kind, offset))
    )


ARCH = key("general.architecture", 8, string("llama"))


def write(path: Path, data: bytes, size: int | None = None) -> Path:
    path.write_bytes(data)
    if size is not None:
        with path.open("r+b") as handle:
            handle.truncate(size)  # the rest reads as zeros
    return path


HOSTILE: dict[str, tuple[bytes, int | None, str]] = {
    # (header bytes, sparse size or None, what the sentence must say)
    "vocabulary 2^40 over zeros": (
        header([ARCH, string("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2**40)]),
        SPARSE,
        f"claims 1,099,511,627,776 vocabulary entries, past the limit of {MAX_VOCAB:,}",
    ),
    "tensors 2^40 over zeros": (
        header([ARCH], tensor_count=2**40),
        SPARSE,
        "claims 1,099,511,627,776 tensors",
    ),
    "keys 2^40 over zeros": (
        header([ARCH], key_count=2**40),
        SPARSE,
        "claims 1,099,511,627,776 metadata keys",
    ),
    "more tensors than bytes": (header([ARCH], tensor_count=MAX_TENSORS), None, "more than its"),
    "vocabulary within the limit, over zeros that end": (
        header([ARCH, string("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, MAX_VOCAB)]),
        4 * 2**20,
        "the file has left",
    ),
    "a string past the end": (
        header([key("general.architecture", 8, struct.pack("<Q", 2**60))]),
        None,
        "past the",
    ),  # fmt: skip
    "an array of floats past the end": (
        header([ARCH, string("tokenizer.ggml.scores") + struct.pack("<IIQ", 9, 6, 2**20)]),
        None,
        "past the",
    ),
    "an array of arrays": (
        header([ARCH, string("x.nested") + struct.pack("<IIQ", 9, 9, 1)]),
        None,
        "an array of type 9",
    ),
    "an unknown value type": (header([key("x.odd", 77, b"")]), None, "value type 77"),
    "a tensor of 7 dimensions": (header([ARCH], [tensor("t", [1] * 7)]), None, "claims 7 dimensions"),
    "a tensor of a type gguf does not know": (
        header([ARCH], [tensor("t", [32], kind=999)]),
        None,
        "ggml type 999",
    ),  # fmt: skip
    "a tensor of a zero dimension": (header([ARCH], [tensor("t", [32, 0])]), None, "a dimension of 0"),
    "a tensor whose data lies past the end": (
        header([ARCH], [tensor("t", [4096, 4096])]),
        None,
        "it is cut short: tensor t's data",
    ),
    "an alignment that is no power of two": (
        header([ARCH, key("general.alignment", 4, struct.pack("<I", 3))]),
        None,
        "general.alignment is 3",
    ),
    "version 1": (header([ARCH], version=1), None, "GGUF version 1"),
    "not GGUF": (b"GGML" + bytes(60), None, "magic bytes"),
    "cut inside the header": (header([ARCH])[:60], None, "ends inside its header"),
}
