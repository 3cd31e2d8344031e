"""A GGUF header's claims held to the file's bytes before any reader loops or allocates (issue 33 item 1).

Each hostile header is written here byte by byte (struct), most over a sparse file of zeros as the probe
wrote them; each must be refused by mha.loading.gguf.bounds with a sentence naming the claim, through
read_header and check_checkpoint too, and a real file must pass.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hostile_gguf import ARCH, HOSTILE, header, key, tensor, write

from mha import check_checkpoint
from mha.errors import CheckpointError, CheckpointNotFoundError, UnsupportedCheckpointError
from mha.loading.gguf import MAX_LAYERS, check_bounds, read_header


def _good(tmp_path: Path) -> Path:
    """A well-formed header: two keys, one F32 tensor of 32 values, its data in place."""
    keys = [ARCH, key("llama.block_count", 4, struct.pack("<I", 2))]
    body = header(keys, [tensor("token_embd.weight", [8, 4])])
    start = (len(body) + 31) // 32 * 32
    return write(tmp_path / "good.gguf", body + bytes(start - len(body)) + bytes(4 * 32))


def test_a_well_formed_header_passes(tmp_path: Path) -> None:
    check_bounds(_good(tmp_path))


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_header_is_refused_by_its_claim(name: str, tmp_path: Path) -> None:
    data, size, says = HOSTILE[name]
    path = write(tmp_path / "hostile.gguf", data, size)
    with pytest.raises(CheckpointNotFoundError) as caught:
        check_bounds(path)
    assert says in str(caught.value) and str(path) in str(caught.value)
    # The same sentence through the paths the registry and load_pretrained take.
    with pytest.raises(CheckpointNotFoundError, match="not a readable GGUF file"):
        read_header(path)
    with pytest.raises(CheckpointError):
        check_checkpoint(path)


def test_too_many_layers_is_unsupported(tmp_path: Path) -> None:
    keys = [ARCH, key("llama.block_count", 4, struct.pack("<I", 10**6))]
    path = write(tmp_path / "deep.gguf", header(keys))
    with pytest.raises(
        UnsupportedCheckpointError, match=f"llama.block_count = 1,000,000; .* 1 to {MAX_LAYERS:,}"
    ):
        check_bounds(path)


def test_a_short_file_is_named(tmp_path: Path) -> None:
    path = write(tmp_path / "short.gguf", b"GGUF")
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


@pytest.mark.parametrize("qtype", ["F32", "F16", "Q8_0", "Q5_0", "Q4_0"])
def test_the_walk_reads_what_ggufs_own_reader_reads(qtype: str, tmp_path: Path) -> None:
    """The walk is the one reader of a header (issue 45): its Header against gguf's GGUFReader of the same
    file, a reference that shares no code with it. Every tensor's name, shape (torch's order), type, first
    byte and length, where the data begins, the vocabulary's length and the numbers the checks read. Q5_0
    is one transformers' header reader did not size."""
    from gguf import GGUFReader
    from gguf_files import build_qwen3, write_gguf

    file = write_gguf(build_qwen3(tmp_path / "qwen3"), tmp_path / f"qwen3-{qtype}.gguf", qtype=qtype)
    header = read_header(file)
    reader = GGUFReader(file)
    expected = [
        (t.name, tuple(map(int, reversed(t.shape))), int(t.tensor_type), int(t.data_offset), int(t.n_bytes))
        for t in reader.tensors
    ]
    assert [tuple(entry) for entry in header.tensors] == expected
    assert header.data_start == int(reader.data_offset)
    assert header.vocab == len(reader.fields["tokenizer.ggml.tokens"].data) > 0
    assert (header.architecture, header.name) == (
        reader.fields["general.architecture"].contents(),
        reader.fields["general.name"].contents(),
    )
    for name in ("qwen3.block_count", "qwen3.embedding_length", "qwen3.attention.head_count"):
        assert header.fields[name] == reader.fields[name].contents()
