"""The compact transport's sections (an encoder-decoder's three tensors in one HSA1 buffer), read back by
an independent reading of docs/design.md's layout as well as by app.compact.decode_sections."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch
from tolerances import quant8

from app import compact


def rows(layers: int, heads: int, m: int, n: int, seed: int) -> torch.Tensor:
    return torch.rand(layers, heads, m, n, generator=torch.Generator().manual_seed(seed)).softmax(-1)


# Shapes whose byte counts are not multiples of 4, so the zero padding between sections is exercised.
SECTIONS = [
    ("encoder", rows(2, 3, 5, 5, 1)),
    ("decoder", rows(3, 1, 3, 3, 2)),
    ("cross", rows(3, 1, 3, 5, 3)),
]


def read_sections(buffer: bytes) -> tuple[dict, dict[str, np.ndarray]]:
    """docs/design.md: each section's scales [L, H, rows] then q, starting 4-aligned, pads zero."""
    h = struct.unpack("<I", buffer[4:8])[0]
    header = json.loads(buffer[8 : 8 + h])
    offset = 8 + h
    values = {}
    key_major = header["quantization"]["order"] == "key-major"
    for section in header["sections"]:
        start = offset + (-offset % 4)
        assert set(buffer[offset:start]) <= {0}, "padding must be zero bytes"
        L, H, r, c = (section[k] for k in ("layers", "heads", "rows", "cols"))
        scales = np.frombuffer(buffer[start : start + 4 * L * H * r], dtype="<f4").reshape(L, H, r)
        q = np.frombuffer(
            buffer[start + 4 * L * H * r : start + 4 * L * H * r + L * H * r * c], dtype=np.uint8
        )
        q = q.reshape(L, H, c, r).swapaxes(-1, -2) if key_major else q.reshape(L, H, r, c)
        values[section["kind"]] = q.astype(np.float64) / 255 * scales[..., None]
        offset = start + 4 * L * H * r + L * H * r * c
    assert offset == len(buffer), "no trailing or missing bytes"
    return header, values


@pytest.mark.parametrize("scheme", compact.QUANTIZED_SCHEMES)
def test_sections_follow_the_documented_layout(scheme: str) -> None:
    buffer = compact.encode_sections({"n": 5, "layers": 2, "heads": 3}, SECTIONS, scheme=scheme)
    header, values = read_sections(buffer)
    assert header["sections"] == [
        {"kind": "encoder", "layers": 2, "heads": 3, "rows": 5, "cols": 5},
        {"kind": "decoder", "layers": 3, "heads": 1, "rows": 3, "cols": 3},
        {"kind": "cross", "layers": 3, "heads": 1, "rows": 3, "cols": 5},
    ]
    _, decoded = compact.decode_sections(buffer)
    assert list(decoded) == ["encoder", "decoder", "cross"]
    for kind, source in SECTIONS:
        # 8-bit rounding of each value (quant8); the two readers differ only by float32 vs float64 arithmetic
        np.testing.assert_allclose(values[kind], source.numpy(), rtol=0, atol=quant8())
        np.testing.assert_allclose(decoded[kind], source.numpy(), rtol=0, atol=quant8())
    header_only, first = compact.decode(buffer)
    assert header_only == header
    np.testing.assert_array_equal(first, decoded["encoder"])


def test_float32_sections_are_exact() -> None:
    buffer = compact.encode_sections({"n": 5}, SECTIONS, scheme="float32-shuffled")
    _, decoded = compact.decode_sections(buffer)
    for kind, source in SECTIONS:
        np.testing.assert_array_equal(decoded[kind], source.numpy())


def test_a_plain_buffer_decodes_as_one_self_section_and_has_no_sections_field() -> None:
    attentions = rows(2, 3, 4, 4, 4)
    buffer = compact.encode({"n": 4, "layers": 2, "heads": 3}, attentions)
    header, decoded = compact.decode_sections(buffer)
    assert "sections" not in header
    assert list(decoded) == ["self"]
    np.testing.assert_allclose(decoded["self"], attentions.numpy(), rtol=0, atol=quant8())


def test_a_short_or_long_sectioned_buffer_is_refused() -> None:
    buffer = compact.encode_sections({"n": 5}, SECTIONS)
    for bad in (buffer[:-1], buffer + b"\0\0\0\0"):
        with pytest.raises(ValueError):
            compact.decode_sections(bad)


def test_square_encode_still_refuses_a_rectangle() -> None:
    with pytest.raises(ValueError, match=r"\[L, H, n, n\]"):
        compact.encode({"n": 3}, rows(1, 1, 3, 5, 5))
