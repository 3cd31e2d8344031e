"""A GGUF header's counts and lengths held to the bytes the file has, before any reader allocates.

A GGUF file is a download from anywhere. Its header states counts (tensors, keys, array entries) and
lengths (strings) that the readers we use, transformers' and gguf's GGUFReader, loop over or allocate
for as stated: a 256 MiB file of zeros that claims 2^40 vocabulary entries keeps either busy for minutes
and grows it by gigabytes. This walk reads nothing into memory but the few numbers it checks, each
against what the file has left and against the limits below, and raises a CheckpointNotFoundError (or,
for a dimension past a limit, UnsupportedCheckpointError) whose sentence says which claim and why. The
readers then read a file whose every count and length is known to fit.

It is a bounds check, not a reader: it keeps no value but the few it checks, and the type sizes are
gguf's own (GGML_QUANT_SIZES). Its cost is one pass over the header: a few milliseconds for a
50,000-token vocabulary, about half a second at the 2^20-entry limit.

The limits below are each far past any real model, and each is quoted in the sentence that refuses a file.
"""

from __future__ import annotations

import mmap
import stat
import struct
from pathlib import Path
from typing import Any

from mha.errors import CheckpointMismatchError, CheckpointNotFoundError, UnsupportedCheckpointError

__all__ = [
    "MAX_ARRAY",
    "MAX_KEYS",
    "MAX_LAYERS",
    "MAX_TENSORS",
    "MAX_VOCAB",
    "check_bounds",
    "check_config",
    "config_keys",
]

MAX_TENSORS = 65_536  # Llama 3 8B has 291 tensors, a 256-expert MoE a few thousand
MAX_KEYS = 65_536  # metadata keys: real files have 20-60
MAX_VOCAB = 2**20  # vocabulary entries (tokenizer.ggml.tokens): Gemma 3 has 262,144
MAX_ARRAY = 2**21  # any other array (merges, scores, token types): about one an entry of the vocabulary
MAX_LAYERS = 1_024  # {arch}.block_count: the deepest real models have ~130
MAX_NAME = 1_024  # a tensor's name (ggml keeps 64 bytes) or a key's
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
_VERSIONS = (2, 3)  # v1 counted in 32 bits; transformers' reader takes these two

# GGUF metadata value types: the fixed-width ones and their sizes; 8 is a string, 9 an array
_FIXED = {0: 1, 1: 1, 7: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_UINT = {0: "<B", 2: "<H", 4: "<I", 10: "<Q"}  # the unsigned types a count or alignment is stored as


class _Header:
    """A cursor over the mapped header that refuses to step past the file's end."""

    def __init__(self, view: memoryview, file: Path) -> None:
        self.view, self.size, self.pos, self.file = view, len(view), 0, file

    def fail(self, claim: str) -> CheckpointNotFoundError:
        return CheckpointNotFoundError(
            f"{self.file} ({self.size:,} bytes) is not a readable GGUF file: {claim}"
        )

    def take(self, fmt: str, what: str) -> int:
        width = struct.calcsize(fmt)
        if self.pos + width > self.size:
            raise self.fail(f"it ends inside its header, at {what} (byte {self.pos:,})")
        (value,) = struct.unpack_from(fmt, self.view, self.pos)
        self.pos += width
        return int(value)

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
    status = file.stat()
    if not stat.S_ISREG(status.st_mode):  # never opened: a FIFO would wait forever, a device never ends
        raise CheckpointNotFoundError(f"{file} is not a readable GGUF file: not a regular file")
    size = status.st_size
    if size < 24:
        raise CheckpointNotFoundError(f"{file} ({size:,} bytes) is not a readable GGUF file: too short")
    with file.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        view = memoryview(mapped)
        try:
            _check(_Header(view, file))
        finally:
            view.release()


def _check(h: _Header) -> None:
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
    alignment, layers = 32, None  # llama.cpp's default alignment
    for _ in range(keys):
        key = h.string("a metadata key", MAX_NAME).decode("utf-8", "replace")
        kind = h.take("<I", f"the type of {key}")
        if kind in _UINT and key == "general.alignment":
            alignment = h.take(_UINT[kind], key)
        elif kind in _UINT and key.endswith(".block_count"):
            layers = (key, h.take(_UINT[kind], key))
        elif kind in _FIXED:
            h.skip(1, _FIXED[kind], key)
        elif kind == _STRING:
            h.skip(h.take("<Q", f"the length of {key}"), 1, key)  # a value: stepped over, never copied
        elif kind == _ARRAY:
            element = h.take("<I", f"the element type of {key}")
            count = h.take("<Q", f"the length of {key}")
            limit = MAX_VOCAB if key == "tokenizer.ggml.tokens" else MAX_ARRAY
            if count > limit:
                what = "vocabulary entries" if limit == MAX_VOCAB else "entries"
                raise h.fail(f"{key} claims {count:,} {what}, past the limit of {limit:,}")
            if element in _FIXED:
                h.skip(count, _FIXED[element], key)
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
    _check_tensors(h, tensors, alignment)


def _check_tensors(h: _Header, tensors: int, alignment: int) -> None:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    extents: list[tuple[str, int, int]] = []
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
        extents.append((name, offset, elements // block * block_bytes))
    data_start = (h.pos + alignment - 1) // alignment * alignment
    room = h.size - data_start
    for name, offset, nbytes in extents:
        if offset + nbytes > room:
            raise h.fail(
                f"it is cut short: tensor {name}'s data ({nbytes:,} bytes at {offset:,}) ends past the "
                f"file's end ({room:,} bytes of data)"
            )


def config_keys(arch: str) -> tuple[str, ...]:
    return tuple(
        f"{arch}.{key}"
        for key in ("block_count", "embedding_length", "attention.head_count", "attention.head_count_kv")
    )


def check_config(file: Path, arch: str, fields: dict[str, Any], tensors: list[str]) -> None:
    """The header's config against its tensors, before anything is built: heads that exist and divide the
    width, and one set of tensors for each layer the file claims, each failure a sentence naming the file.
    (The tensors' shapes are checked against the config when the file is converted, from the same names.)"""

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
