"""A GGUF header read in one bounded walk: every count and length held to the bytes the file has before it
is looped over, and what the header says (its metadata's numbers, the strings we use, its tensor table)
kept on the way.

A GGUF file is a download from anywhere. Its header states counts (tensors, keys, array entries) and
lengths (strings) that a reader loops over or allocates for as stated: a 256 MiB file of zeros that
claims 2^40 vocabulary entries kept transformers' reader and gguf's GGUFReader busy for minutes and grew
them by gigabytes. This walk copies nothing but the few values it keeps, checks each claim against what
the file has left and against the limits below, and raises a CheckpointNotFoundError (or, for a
dimension past a limit, UnsupportedCheckpointError) whose sentence says which claim and why. Since it
must step over every byte of the header anyway, it is also the one reader of the header
(mha.loading.gguf.header builds the Header from it): the vocabulary's strings are stepped over, never
decoded, and the type sizes are gguf's own (GGML_QUANT_SIZES). Its cost is one pass over the header: a few
milliseconds for a 50,000-token vocabulary, about half a second at the 2^20-entry limit.

The limits below are each far past any real model, and each is quoted in the sentence that refuses a file.
"""

from __future__ import annotations

import mmap
import stat
import struct
from pathlib import Path
from typing import Any, NamedTuple

from mha.errors import CheckpointNotFoundError, UnsupportedCheckpointError

__all__ = [
    "MAX_ARRAY",
    "MAX_KEYS",
    "MAX_LAYERS",
    "MAX_TENSORS",
    "MAX_VOCAB",
    "Layout",
    "TensorEntry",
    "check_bounds",
    "walk",
]

MAX_TENSORS = 65_536  # Llama 3 8B has 291 tensors, a 256-expert MoE a few thousand
MAX_KEYS = 65_536  # metadata keys: real files have 20-60
MAX_VOCAB = 2**20  # vocabulary entries (tokenizer.ggml.tokens): Gemma 3 has 262,144
MAX_ARRAY = 2**21  # any other array (merges, scores, token types): about one an entry of the vocabulary
MAX_LAYERS = 1_024  # {arch}.block_count: the deepest real models have ~130
MAX_NAME = 1_024  # a tensor's name (ggml keeps 64 bytes) or a key's
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
_VERSIONS = (2, 3)  # v1 counted in 32 bits; transformers' reader takes these two

# GGUF metadata value types: the fixed-width ones and their struct formats; 8 is a string, 9 an array
_FIXED = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?"}
_FIXED |= {10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_UINT = frozenset({0, 2, 4, 10})  # the unsigned types a count or alignment is stored as
# The string values kept (any other is stepped over, never copied: a chat template, a hostile megabyte)
_KEPT_STRINGS = frozenset({"general.architecture", "general.name"})
# The arrays of numbers kept: per-layer head counts (OpenELM's, Gemma 3n's), which the config checks read
_KEPT_ARRAYS = (".attention.head_count", ".attention.head_count_kv")
VOCAB_KEY = "tokenizer.ggml.tokens"


class TensorEntry(NamedTuple):
    name: str  # llama.cpp's name (blk.0.attn_q.weight)
    shape: tuple[int, ...]  # in torch's order (rows first): ggml's dimensions reversed
    ggml_type: int
    start: int  # its first byte in the file
    nbytes: int


class Layout(NamedTuple):
    """What the walk read: the metadata it kept, the vocabulary's length, the tensor table."""

    fields: dict[str, Any]  # every number of the metadata, and the _KEPT_STRINGS and _KEPT_ARRAYS
    vocab: int  # entries of tokenizer.ggml.tokens (0 where there is none)
    tensors: tuple[TensorEntry, ...]
    data_start: int  # where the tensor data begins: every byte before it is the header


class _Header:
    """A cursor over the mapped header that refuses to step past the file's end."""

    def __init__(self, view: memoryview, file: Path) -> None:
        self.view, self.size, self.pos, self.file = view, len(view), 0, file

    def fail(self, claim: str) -> CheckpointNotFoundError:
        return CheckpointNotFoundError(
            f"{self.file} ({self.size:,} bytes) is not a readable GGUF file: {claim}"
        )

    def take(self, fmt: str, what: str) -> int:
        return int(self.value(fmt, what))

    def value(self, fmt: str, what: str) -> Any:
        width = struct.calcsize(fmt)
        if self.pos + width > self.size:
            raise self.fail(f"it ends inside its header, at {what} (byte {self.pos:,})")
        (value,) = struct.unpack_from(fmt, self.view, self.pos)
        self.pos += width
        return value

    def skip(self, count: int, width: int, what: str) -> None:
        """Step over `count` items of `width` bytes, which must lie inside the file."""
        if count * width > self.size - self.pos:
            raise self.fail(
                f"{what} claims {count:,} entries of {width} bytes, {count * width:,} bytes in all, "
                f"past the {self.size - self.pos:,} bytes the file has left"
            )
        self.pos += count * width

    def string(self, what: str, limit: int | None = None) -> bytes:
        length = self.take("<Q", what)
        if limit is not None and length > limit:
            raise self.fail(f"{what} is {length:,} bytes long, past the limit of {limit:,}")
        start = self.pos
        self.skip(length, 1, what)
        return bytes(self.view[start : self.pos])

    def skip_strings(self, count: int, what: str) -> None:
        # Each string is at least its 8-byte length: a count the file cannot hold fails before the walk.
        if count * 8 > self.size - self.pos:
            self.skip(count, 8, what)
        view, size, pos = self.view, self.size, self.pos
        for index in range(count):
            if pos + 8 > size:
                raise self.fail(f"{what} claims {count:,} strings; the file ends after {index:,}")
            (length,) = struct.unpack_from("<Q", view, pos)
            pos += 8 + length
            if pos > size:
                raise self.fail(f"string {index:,} of {what} is {length:,} bytes long, past the file's end")
        self.pos = pos


def check_bounds(file: Path) -> None:
    """Refuse `file` when its header claims more than its bytes hold or than the module's limits allow
    (module docstring); return when every count, length and tensor extent fits. Reads the header only."""
    walk(file)


def walk(file: Path) -> Layout:
    """`file`'s header, read once within its bounds (check_bounds' refusals); no tensor data is read."""
    status = file.stat()
    if not stat.S_ISREG(status.st_mode):  # never opened: a FIFO would wait forever, a device never ends
        raise CheckpointNotFoundError(f"{file} is not a readable GGUF file: not a regular file")
    size = status.st_size
    if size < 24:
        raise CheckpointNotFoundError(f"{file} ({size:,} bytes) is not a readable GGUF file: too short")
    with file.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        view = memoryview(mapped)
        try:
            return _walk(_Header(view, file))
        finally:
            view.release()


def _walk(h: _Header) -> Layout:
    if bytes(h.view[:4]) != b"GGUF":
        raise h.fail("it does not start with GGUF's magic bytes")
    h.pos = 4
    version = h.take("<I", "the version")
    if version not in _VERSIONS:
        raise h.fail(f"GGUF version {version}; headscope reads versions {' and '.join(map(str, _VERSIONS))}")
    tensors = h.take("<Q", "the tensor count")
    keys = h.take("<Q", "the key count")
    if tensors > MAX_TENSORS:
        raise h.fail(f"it claims {tensors:,} tensors, past the limit of {MAX_TENSORS:,}")
    if keys > MAX_KEYS:
        raise h.fail(f"it claims {keys:,} metadata keys, past the limit of {MAX_KEYS:,}")
    # The smallest key is 8 + 4 + 1 bytes, the smallest tensor entry 8 + 4 + 8 + 4 + 8: what must fit.
    if keys * 13 + tensors * 32 > h.size - h.pos:
        raise h.fail(
            f"it claims {keys:,} keys and {tensors:,} tensors, more than its {h.size - h.pos:,} bytes "
            "after the header can hold"
        )
    alignment, layers, vocab = 32, None, 0  # llama.cpp's default alignment
    fields: dict[str, Any] = {}
    for _ in range(keys):
        key = h.string("a metadata key", MAX_NAME).decode("utf-8", "replace")
        kind = h.take("<I", f"the type of {key}")
        if kind in _FIXED:
            fields[key] = h.value(_FIXED[kind], key)
            if kind in _UINT and key == "general.alignment":
                alignment = int(fields[key])
            elif kind in _UINT and key.endswith(".block_count"):
                layers = (key, int(fields[key]))
        elif kind == _STRING:
            if key in _KEPT_STRINGS:
                fields[key] = h.string(key).decode("utf-8", "replace")
            else:  # a value: stepped over, never copied
                h.skip(h.take("<Q", f"the length of {key}"), 1, key)
        elif kind == _ARRAY:
            element = h.take("<I", f"the element type of {key}")
            count = h.take("<Q", f"the length of {key}")
            limit = MAX_VOCAB if key == VOCAB_KEY else MAX_ARRAY
            if count > limit:
                what = "vocabulary entries" if limit == MAX_VOCAB else "entries"
                raise h.fail(f"{key} claims {count:,} {what}, past the limit of {limit:,}")
            if key == VOCAB_KEY:
                vocab = count
            if element in _FIXED:
                fmt = _FIXED[element]
                start = h.pos
                h.skip(count, struct.calcsize(fmt), key)
                if key.endswith(_KEPT_ARRAYS):
                    fields[key] = list(struct.unpack_from(f"<{count}{fmt[1]}", h.view, start))
            elif element == _STRING:
                h.skip_strings(count, key)
            else:
                raise h.fail(f"{key} is an array of type {element}, which no GGUF reader we use reads")
        else:
            raise h.fail(f"{key} has value type {kind}, which GGUF does not define")
    if alignment <= 0 or alignment & (alignment - 1) or alignment > 2**16:
        raise h.fail(f"general.alignment is {alignment}, not a power of two up to 65,536")
    if layers is not None and not 1 <= layers[1] <= MAX_LAYERS:
        raise UnsupportedCheckpointError(
            f"{h.file.name} claims {layers[0]} = {layers[1]:,}; headscope takes 1 to {MAX_LAYERS:,} layers"
        )
    entries, data_start = _tensor_table(h, tensors, alignment)
    return Layout(fields, vocab, entries, data_start)


def _tensor_table(h: _Header, tensors: int, alignment: int) -> tuple[tuple[TensorEntry, ...], int]:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    extents: list[tuple[str, tuple[int, ...], int, int, int]] = []
    for _ in range(tensors):
        name = h.string("a tensor's name", MAX_NAME).decode("utf-8", "replace")
        dims = h.take("<I", f"the dimension count of {name}")
        if not 1 <= dims <= MAX_DIMS:
            raise h.fail(f"tensor {name} claims {dims} dimensions; ggml has 1 to {MAX_DIMS}")
        shape = [h.take("<Q", f"a dimension of {name}") for _ in range(dims)]
        kind = h.take("<I", f"the type of {name}")
        offset = h.take("<Q", f"the offset of {name}")
        try:
            block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        except (ValueError, KeyError):
            raise h.fail(f"tensor {name} is of ggml type {kind}, which gguf does not know") from None
        elements = 1
        for dim in shape:
            if dim < 1:
                raise h.fail(f"tensor {name} has a dimension of {dim}")
            elements *= dim
        if shape[0] % block:
            raise h.fail(f"tensor {name}'s rows of {shape[0]:,} are not whole blocks of {block}")
        extents.append((name, tuple(reversed(shape)), kind, offset, elements // block * block_bytes))
    data_start = (h.pos + alignment - 1) // alignment * alignment
    room = h.size - data_start
    for name, _, _, offset, nbytes in extents:
        if offset + nbytes > room:
            raise h.fail(
                f"it is cut short: tensor {name}'s data ({nbytes:,} bytes at {offset:,}) ends past the "
                f"file's end ({room:,} bytes of data)"
            )
    entries = tuple(
        TensorEntry(name, shape, kind, data_start + offset, nbytes)
        for name, shape, kind, offset, nbytes in extents
    )
    return entries, data_start
