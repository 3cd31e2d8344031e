"""The piecewise JSON encoder writes exactly what json.dumps writes, in bounded pieces."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
import torch

from app import encoders
from app.encoders import Floats


def dumps(body: Any) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def rounded(values: torch.Tensor | np.ndarray) -> Any:
    array = values.numpy() if isinstance(values, torch.Tensor) else values
    return np.round(np.asarray(array).astype(np.float64), 6).tolist()


def test_every_six_decimal_value_in_0_1_is_written_as_repr_writes_it() -> None:
    # All 1,000,001 values k / 10⁶ (both texts' forms: "0.000123", "1.2e-05", "0.0", "1.0", ...).
    values = np.arange(0, 10**6 + 1) / 10**6
    assert encoders.encode(Floats(values)) == dumps(rounded(values))


@pytest.mark.parametrize("shape", [(1,), (3,), (1, 1), (2, 3, 4), (6, 12, 37, 37), (2, 3, 130, 130)])
def test_attention_tensors_are_written_byte_for_byte(shape: tuple[int, ...]) -> None:
    generator = torch.Generator().manual_seed(sum(shape))
    attention = torch.softmax(5 * torch.randn(shape, generator=generator), dim=-1)  # float32, as the model's
    assert encoders.encode(Floats(attention)) == dumps(rounded(attention))
    assert encoders.encode(Floats(attention, decimals=None)) == dumps(attention.tolist())


@pytest.mark.parametrize(
    "values",
    [
        [0.0, -0.0, 1.0],  # -0.0 writes "-0.0"
        [0.5, 1.0000001, 0.25],  # above 1
        [-1e-9, 0.5],  # below 0 (rounds to -0.0)
        [math.inf, 0.5],  # NaN: test_an_absent_value_is_written_null
        [0.1234565, 0.9999995, 0.0000005, 0.00000049],  # rounding boundaries
        [3.5, -2.25, 1e300],
    ],
)
def test_values_outside_the_fast_path_are_still_exact(values: list[float]) -> None:
    array = np.array(values, dtype=np.float64)
    assert encoders.encode(Floats(array)) == dumps(rounded(array))
    assert encoders.encode(Floats(array, decimals=None)) == dumps(array.tolist())


def test_a_body_with_floats_is_written_as_json_dumps_writes_it() -> None:
    attention = torch.softmax(torch.randn(2, 3, 5, 5), dim=-1)
    body = {"model": "m", "tokens": ["é", "\n", '"'], "n": 5, "nested": {"a": Floats(attention[0, 0])}}
    body["list"] = [Floats(attention[1]), 3, None]
    expected = {**body, "nested": {"a": rounded(attention[0, 0])}, "list": [rounded(attention[1]), 3, None]}
    assert encoders.encode(body) == dumps(expected)
    assert json.loads(encoders.encode(body))["tokens"] == ["é", "\n", '"']


def test_pieces_are_bounded() -> None:
    # Each piece holds the GIL for one C call: the json.dumps path writes at most PIECE_VALUES values a
    # piece, the vectorised one FAST_PIECE_VALUES (each value is at least 3 bytes plus a separator).
    exact = torch.rand(2, 300, 300)
    pieces = list(encoders.pieces(Floats(exact, decimals=None)))
    assert len(pieces) > 1
    assert max(piece.count(b",") for piece in pieces) < encoders.PIECE_VALUES
    attention = torch.softmax(torch.randn(4, 300, 300), dim=-1)
    pieces = list(encoders.pieces(Floats(attention)))
    assert len(pieces) == math.ceil(attention.numel() / encoders.FAST_PIECE_VALUES)
    assert max(piece.count(b",") for piece in pieces) <= encoders.FAST_PIECE_VALUES


@pytest.mark.parametrize("decimals", [6, None])
def test_an_absent_value_is_written_null(decimals: int | None) -> None:
    """NaN (a statistic no row has) is JSON's null, never the invalid NaN; the others as always."""
    values = torch.tensor([[0.25, math.nan], [1.5, -0.125]])
    written = encoders.encode({"stats": Floats(values, decimals)}).decode()
    assert json.loads(written) == {"stats": [[0.25, None], [1.5, -0.125]]}
    assert "NaN" not in written
