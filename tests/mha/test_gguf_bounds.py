"""A GGUF header's claims held to the file's bytes before any reader loops or allocates (issue 33 item 1).

Each hostile header is written here byte by byte (struct), most over a sparse file of zeros as the probe
wrote them; each must be refused by mha.loading.gguf_bounds with a sentence naming the claim, through
read_header and check_checkpoint too, and a real file must pass.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from mha import check_checkpoint
from mha.errors import CheckpointError, CheckpointNotFoundError, UnsupportedCheckpointError
from mha.loading.gguf_bounds import MAX_LAYERS, MAX_TENSORS, MAX_VOCAB, check_bounds
from mha.loading.gguf_checkpoint import read_header

SPARSE = 256 * 2**20  # the probe's file size: a sparse file, so no disk is used


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def _key(key: str, kind: int, payload: bytes) -> bytes:
    return _string(key) + struct.pack("<I", kind) + payload


def _header(keys: list[bytes], tensors: list[bytes] = (), *, tensor_count: int | None = None,
            key_count: int | None = None, version: int = 3) -> bytes:  # fmt: skip
    count = len(tensors) if tensor_count is None else tensor_count
    head = b"GGUF" + struct.pack("<IQQ", version, count, len(keys) if key_count is None else key_count)
    return head + b"".join(keys) + b"".join(tensors)


def _tensor(name: str, shape: list[int], kind: int = 0, offset: int = 0) -> bytes:
    return (
        _string(name)
        + struct.pack("<I", len(shape))
        + struct.pack(f"<{len(shape)}Q", *shape)
        + (struct.pack("<IQ", kind, offset))
    )


ARCH = _key("general.architecture", 8, _string("llama"))


def _write(path: Path, data: bytes, size: int | None = None) -> Path:
    path.write_bytes(data)
    if size is not None:
        with path.open("r+b") as handle:
            handle.truncate(size)  # the rest reads as zeros
    return path


def _good(tmp_path: Path) -> Path:
    """A well-formed header: two keys, one F32 tensor of 32 values, its data in place."""
    keys = [ARCH, _key("llama.block_count", 4, struct.pack("<I", 2))]
    body = _header(keys, [_tensor("token_embd.weight", [8, 4])])
    start = (len(body) + 31) // 32 * 32
    return _write(tmp_path / "good.gguf", body + bytes(start - len(body)) + bytes(4 * 32))


def test_a_well_formed_header_passes(tmp_path: Path) -> None:
    check_bounds(_good(tmp_path))


HOSTILE: dict[str, tuple[bytes, int | None, str]] = {
    # (header bytes, sparse size or None, what the sentence must say)
    "vocabulary 2^40 over zeros": (
        _header([ARCH, _string("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2**40)]),
        SPARSE,
        f"claims 1,099,511,627,776 vocabulary entries, past the limit of {MAX_VOCAB:,}",
    ),
    "tensors 2^40 over zeros": (
        _header([ARCH], tensor_count=2**40),
        SPARSE,
        "claims 1,099,511,627,776 tensors",
    ),
    "keys 2^40 over zeros": (
        _header([ARCH], key_count=2**40),
        SPARSE,
        "claims 1,099,511,627,776 metadata keys",
    ),
    "more tensors than bytes": (_header([ARCH], tensor_count=MAX_TENSORS), None, "more than its"),
    "vocabulary within the limit, over zeros that end": (
        _header([ARCH, _string("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, MAX_VOCAB)]),
        4 * 2**20,
        "the file has left",
    ),
    "a string past the end": (
        _header([_key("general.architecture", 8, struct.pack("<Q", 2**60))]),
        None,
        "past the",
    ),  # fmt: skip
    "an array of floats past the end": (
        _header([ARCH, _string("tokenizer.ggml.scores") + struct.pack("<IIQ", 9, 6, 2**20)]),
        None,
        "past the",
    ),
    "an array of arrays": (
        _header([ARCH, _string("x.nested") + struct.pack("<IIQ", 9, 9, 1)]),
        None,
        "an array of type 9",
    ),
    "an unknown value type": (_header([_key("x.odd", 77, b"")]), None, "value type 77"),
    "a tensor of 7 dimensions": (_header([ARCH], [_tensor("t", [1] * 7)]), None, "claims 7 dimensions"),
    "a tensor of a type gguf does not know": (
        _header([ARCH], [_tensor("t", [32], kind=999)]),
        None,
        "ggml type 999",
    ),  # fmt: skip
    "a tensor of a zero dimension": (_header([ARCH], [_tensor("t", [32, 0])]), None, "a dimension of 0"),
    "a tensor whose data lies past the end": (
        _header([ARCH], [_tensor("t", [4096, 4096])]),
        None,
        "it is cut short: tensor t's data",
    ),
    "an alignment that is no power of two": (
        _header([ARCH, _key("general.alignment", 4, struct.pack("<I", 3))]),
        None,
        "general.alignment is 3",
    ),
    "version 1": (_header([ARCH], version=1), None, "GGUF version 1"),
    "not GGUF": (b"GGML" + bytes(60), None, "magic bytes"),
    "cut inside the header": (_header([ARCH])[:60], None, "ends inside its header"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_header_is_refused_by_its_claim(name: str, tmp_path: Path) -> None:
    data, size, says = HOSTILE[name]
    path = _write(tmp_path / "hostile.gguf", data, size)
    with pytest.raises(CheckpointNotFoundError) as caught:
        check_bounds(path)
    assert says in str(caught.value) and str(path) in str(caught.value)
    # The same sentence through the paths the registry and load_pretrained take.
    with pytest.raises(CheckpointNotFoundError, match="not a readable GGUF file"):
        read_header(path)
    with pytest.raises(CheckpointError):
        check_checkpoint(path)


def test_too_many_layers_is_unsupported(tmp_path: Path) -> None:
    keys = [ARCH, _key("llama.block_count", 4, struct.pack("<I", 10**6))]
    path = _write(tmp_path / "deep.gguf", _header(keys))
    with pytest.raises(
        UnsupportedCheckpointError, match=f"llama.block_count = 1,000,000; .* 1 to {MAX_LAYERS:,}"
    ):
        check_bounds(path)


def test_a_short_file_is_named(tmp_path: Path) -> None:
    path = _write(tmp_path / "short.gguf", b"GGUF")
    with pytest.raises(CheckpointNotFoundError, match="not a readable GGUF file: too short"):
        check_bounds(path)


def test_written_files_pass(tmp_path: Path) -> None:
    """Files gguf's GGUFWriter writes (the tests' tiny Qwen3, quantized) and the bundled SmolLM2 pass."""
    from gguf_files import build_qwen3, bundled_gguf, write_gguf

    checkpoint = build_qwen3(tmp_path / "qwen3")
    for qtype in ("F16", "Q8_0", "Q4_0"):
        check_bounds(write_gguf(checkpoint, tmp_path / f"qwen3-{qtype}.gguf", qtype=qtype))
    bundled = bundled_gguf()
    if bundled is not None:
        check_bounds(bundled)
