"""JSON answers built a piece at a time, so no encoding holds the GIL (and with it the event loop) for long.

`pieces(body)` yields the bytes of ``json.dumps(body, ensure_ascii=False, separators=(",", ":"))``, where
each `Floats` in the body stands for the nested list of its values, a bounded piece at a time. The caller
can encode a small answer whole in a worker thread, stream a large one chunk by chunk, and stop between
any two pieces when nobody wants the answer any more.

Values rounded to 6 decimals that lie in [0, 1] (attention, rollout) take a vectorised path: the text of
``repr(round(x, 6))`` is fully determined by the integer k = rint(x·10⁶) (k / 10⁶ is the nearest double,
and the shortest decimal that reads back as it is k·10⁻⁶ with trailing zeros dropped), so numpy writes
the digits, brackets and commas of a whole block at once, about ten times faster than `float.__repr__`
and mostly with the GIL released. Anything else (unrounded values, values outside [0, 1]) goes through
`json.dumps` in pieces of at most `PIECE_VALUES` values. tests/app/test_encoders.py checks both paths
byte for byte against `json.dumps`, for every k.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import torch

# One json.dumps call encodes at most this many values: ~3 ms holding the GIL (~400 ns per value).
PIECE_VALUES = 8192
# The vectorised path formats this many values per piece (~1.2 MB of scratch, a few ms).
FAST_PIECE_VALUES = 65536
_VALUE_WIDTH = 8  # the longest text of a 6-decimal value in [0, 1]: "0.123456"
_SCALE = 10**6


@dataclass(frozen=True)
class Floats:
    """An array of floats inside a JSON body: written as nested lists, rounded to `decimals` (None: exact,
    float32 values written as the Python floats they equal, as `tensor.tolist()` does)."""

    values: torch.Tensor | np.ndarray
    decimals: int | None = 6

    def array(self) -> np.ndarray:
        values = self.values.numpy() if isinstance(self.values, torch.Tensor) else self.values
        return np.asarray(values)


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def encode(body: Any) -> bytes:
    """The whole answer at once (still built piecewise: the GIL is free between pieces)."""
    return b"".join(pieces(body))


def pieces(body: Any) -> Iterator[bytes]:
    """The JSON of `body` (dicts, lists and scalars as json.dumps writes them, `Floats` as nested lists)."""
    if isinstance(body, Floats):
        yield from _float_pieces(body)
    elif isinstance(body, dict) and _has_floats(body):
        yield b"{"
        for i, (key, value) in enumerate(body.items()):
            yield (("," if i else "") + dumps(str(key)) + ":").encode("utf-8")
            yield from pieces(value)
        yield b"}"
    elif isinstance(body, list | tuple) and _has_floats(body):
        yield b"["
        for i, value in enumerate(body):
            if i:
                yield b","
            yield from pieces(value)
        yield b"]"
    else:
        yield dumps(body).encode("utf-8")


def _has_floats(body: Any) -> bool:
    if isinstance(body, Floats):
        return True
    if isinstance(body, dict):
        return any(_has_floats(v) for v in body.values())
    if isinstance(body, list | tuple):
        return any(_has_floats(v) for v in body)
    return False


def _float_pieces(floats: Floats) -> Iterator[bytes]:
    array = floats.array()
    if array.ndim == 0 or array.size == 0:
        yield dumps(_as_list(array, floats.decimals)).encode("utf-8")
        return
    if floats.decimals == 6 and array.ndim < 8:  # the bracket words hold at most 7 "]" and a comma
        flat = np.ascontiguousarray(array).reshape(-1)
        # The check costs one pass; the fast path needs every k in [0, 10⁶] (NaN fails both bounds).
        low, high = float(flat.min()), float(flat.max())
        if 0.0 <= low and high <= 1.0 and (low > 0.0 or not np.signbit(flat).any()):  # -0.0 writes "-0.0"
            for start in range(0, flat.size, FAST_PIECE_VALUES):
                yield _fast_block(flat, array.shape, start, min(flat.size, start + FAST_PIECE_VALUES))
            return
    yield from _slow_pieces(array, floats.decimals)


def _as_list(array: np.ndarray, decimals: int | None) -> Any:
    values = array.astype(np.float64)
    values = np.round(values, decimals) if decimals is not None else values
    if np.isnan(values).any():  # an absent value (a statistic no row has): JSON's null, never NaN
        written = values.astype(object)
        written[np.isnan(values)] = None
        return written.tolist()
    return values.tolist()


def _slow_pieces(array: np.ndarray, decimals: int | None) -> Iterator[bytes]:
    """json.dumps of groups of sub-arrays, each group at most PIECE_VALUES values."""
    if array.size <= PIECE_VALUES:
        yield dumps(_as_list(array, decimals)).encode("utf-8")
        return
    yield b"["
    sub = array[0].size or 1
    step = max(1, PIECE_VALUES // sub)
    for start in range(0, array.shape[0], step):
        if start:
            yield b","
        group = array[start : start + step]
        if group.size <= PIECE_VALUES:
            yield dumps(_as_list(group, decimals))[1:-1].encode("utf-8")  # the rows, without outer [ ]
        else:  # one sub-array alone is too large: go one level down
            yield from _slow_pieces(group[0], decimals)
    yield b"]"


def _word(text: str, *, at: int = 0) -> int:
    """The little-endian uint64 whose bytes at..at+len hold the ASCII `text` (the rest 0)."""
    return int.from_bytes(b"\0" * at + text.encode("ascii"), "little")


@lru_cache(maxsize=1)
def _tables() -> dict[str, np.ndarray]:
    """uint64 words of 8 bytes (0 = nothing) that a gather turns into text: "0." + six digits as two
    groups of three (trailing zeros as 0 bytes), the other texts (k < 100 is "1.2e-05", k = 10⁶ is "1.0"),
    and the brackets and comma around a value."""

    def group(i: int, at: int, strip: bool) -> int:
        text = f"{i:03d}".rstrip("0") if strip else f"{i:03d}"
        return _word(text, at=at)

    return {
        "high": np.array([group(i, 2, strip=False) for i in range(1000)], dtype=np.uint64),
        "high_stripped": np.array([group(i, 2, strip=True) for i in range(1000)], dtype=np.uint64),
        "low": np.array([group(i, 5, strip=True) for i in range(1000)], dtype=np.uint64),
        "short": np.array([_word(repr(k / _SCALE)) for k in range(100)] + [_word(repr(1.0))], np.uint64),
        # opens: "[" right-aligned (the value follows); closes: "]"s, then the comma.
        "opens": np.array([_word("[" * i, at=8 - i) for i in range(9)], dtype=np.uint64),
        "closes": np.array([_word("]" * i + ",") for i in range(8)], dtype=np.uint64),
    }


def _fast_block(flat: np.ndarray, shape: tuple[int, ...], start: int, end: int) -> bytes:
    """Values flat[start:end] of an array of `shape`, each with the brackets that open before it and close
    after it and a comma unless it is the array's last: consecutive blocks concatenate to the JSON.

    Each value becomes three 8-byte words (opening brackets, the number, closing brackets and comma) by
    table gathers, unused bytes 0, which one `bytes.translate` then deletes: no per-value Python."""
    tables = _tables()
    k = np.rint(flat[start:end].astype(np.float64) * _SCALE).astype(np.int64)  # as np.round(x, 6) does
    m = k.size
    words = np.empty((m, 3), dtype=np.uint64)
    high, low = np.divmod(k, 1000)
    np.minimum(high, 999, out=high)  # k = 10⁶ would index past the table; it is replaced below
    number = np.where(low == 0, tables["high_stripped"][high], tables["high"][high])
    number |= tables["low"][low]
    number |= np.uint64(_word("0."))
    short = np.flatnonzero((k < 100) | (k >= _SCALE))
    if short.size:
        number[short] = tables["short"][np.minimum(k[short], 100)]
    words[:, 1] = number

    # Brackets: a value opens one list per axis at whose start it stands and closes one per axis it ends,
    # so only the first and last value of each innermost row carry any.
    opens = _brackets(shape, start, m, last=False)
    closes = _brackets(shape, start, m, last=True)
    words[:, 0] = tables["opens"][opens]
    words[:, 2] = tables["closes"][closes]
    if end == flat.size:
        words[-1, 2] &= ~np.uint64(0xFF << (8 * int(closes[-1])))  # no comma after the array's last value
    return words.tobytes().translate(None, b"\0")


def _brackets(shape: tuple[int, ...], start: int, m: int, *, last: bool) -> np.ndarray:
    """For values start..start+m: how many lists each opens (the first of its innermost row) or, `last`,
    closes (the last of its row): one per axis at whose start (end) it stands."""
    counts = np.zeros(m, dtype=np.int64)
    row = shape[-1]
    index = np.arange(((row - 1 if last else 0) - start) % row, m, row)  # only these carry any
    position = index + start + (1 if last else 0)
    span = 1
    for size in reversed(shape):
        span *= size
        counts[index] += position % span == 0
    return counts
