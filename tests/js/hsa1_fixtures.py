"""HSA1 buffers made by app/compact.py for the Node tests of app/static/js/decode.js
(tests/js/decode.test.mjs).

The attention comes from integers (numpy's PCG64 stream, float64 division, one rounding to float32), so the
buffers are the same bytes on every machine; tests/js/test_js_fixtures.py checks the committed files still
equal what app/compact.py makes. After a change to the format:

    PYTHONPATH=. .venv/bin/python tests/js/hsa1_fixtures.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from tolerances import U32, quant, quant8  # noqa: E402

from app import compact  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SEQ2SEQ_SCHEMES = ("row-max-uint8", "abs-uint8-key-major", "float32-shuffled")


def attention(
    layers: int, heads: int, n: int, *, causal: bool, seed: int, cols: int | None = None
) -> np.ndarray:
    """Rows of non-negative integers (some peaked, some flat), normalised: float32 [L, H, n, cols or n]."""
    rng = np.random.default_rng(seed)
    cols = n if cols is None else cols
    weights = rng.integers(0, 40, size=(layers, heads, n, cols)).astype(np.float64)
    weights[..., 0, :] = rng.integers(0, 2, size=(layers, heads, cols))  # a sparse first row
    weights[..., 1, 1] += 400  # a peaked second row: its maximum near 1
    weights[..., 0] += 1  # every row has mass on key 0 (the [CLS] sink), so no row is all zero
    if causal:
        weights *= np.tril(np.ones((n, n)))
    return (weights / weights.sum(-1, keepdims=True)).astype(np.float32)


def header(n: int, *, layers: int, heads: int, causal: bool, pair: bool) -> dict[str, Any]:
    # Odd tokens on purpose: markup, accents, an astral-plane emoji, a quote, a backslash.
    tokens = ["[CLS]", "<b>", "é", '"', "\\", "😀", "[SEP]", "x"][:n]
    segments = [0] * n if not pair else [0] * (n - 2) + [1, 1]
    return {
        "model": "fixture",
        "tokens": tokens,
        "segments": segments,
        "special": [t in ("[CLS]", "[SEP]") for t in tokens],
        "layers": layers,
        "heads": heads,
        "n": n,
        "truncated": False,
        "causal": causal,
    }


def seq2seq() -> tuple[dict[str, Any], list[tuple[str, np.ndarray]]]:
    """An encoder-decoder's answer: 5 source tokens, 3 target tokens, a decoder with other layers and heads
    than the encoder, so that no section's byte count is a multiple of 4 (the padding between them)."""
    head = header(5, layers=2, heads=2, causal=False, pair=False)
    head.update(
        architecture="encoder-decoder",
        target_tokens=["<pad>", "▁é", "</s>"],
        target_special=[True, False, True],
        target_truncated=True,
        generated=2,
    )
    sections = [
        ("encoder", attention(2, 2, 5, causal=False, seed=3)),
        ("decoder", attention(3, 1, 3, causal=True, seed=4)),
        ("cross", attention(3, 1, 3, causal=False, seed=5, cols=5)),
    ]
    return head, sections


def build() -> tuple[dict[str, bytes], dict[str, Any]]:
    """{file name: HSA1 bytes}, and expected.json: the source values and the tolerances of the test."""
    pair = attention(2, 3, 6, causal=False, seed=1)
    causal = attention(2, 2, 5, causal=True, seed=2)
    pair_header = header(6, layers=2, heads=3, causal=False, pair=True)
    causal_header = header(5, layers=2, heads=2, causal=True, pair=False)
    head_header = {**pair_header, "layers": 1, "heads": 1, "layer": 1, "head": 2}
    s2s_header, s2s = seq2seq()
    s2s_tensors = [(kind, torch.from_numpy(values)) for kind, values in s2s]
    buffers = {
        "pair-row-max-uint8.hsa1": compact.encode(pair_header, torch.from_numpy(pair)),
        "pair-abs-uint8.hsa1": compact.encode(pair_header, torch.from_numpy(pair), scheme="abs-uint8"),
        "pair-abs-uint8-key-major.hsa1": compact.encode(
            pair_header, torch.from_numpy(pair), scheme="abs-uint8-key-major"
        ),
        # The page's first view below 128 tokens: fewer levels in the same byte (compact.AUTO_BITS).
        "pair-abs-uint8-key-major-6bit.hsa1": compact.encode(
            pair_header, torch.from_numpy(pair), scheme="abs-uint8-key-major", bits=6
        ),
        "causal-abs-uint8-key-major.hsa1": compact.encode(
            causal_header, torch.from_numpy(causal), scheme="abs-uint8-key-major"
        ),
        "head-float32-shuffled.hsa1": compact.encode(
            head_header, torch.from_numpy(pair[1:2, 2:3]), scheme="float32-shuffled"
        ),
        **{
            f"seq2seq-{scheme}.hsa1": compact.encode_sections(s2s_header, s2s_tensors, scheme=scheme)
            for scheme in SEQ2SEQ_SCHEMES
        },
        # One cross head, as /api/attention/head/compact sends an encoder-decoder's: one section.
        "seq2seq-head-cross.hsa1": compact.encode_sections(
            {**s2s_header, "layers": 1, "heads": 1, "layer": 2, "head": 0, "kind": "cross"},
            [("cross", s2s_tensors[2][1][2:3, 0:1])],
            scheme="float32-shuffled",
        ),
    }
    expected = {
        "sources": {
            "pair": pair.tolist(),
            "causal": causal.tolist(),
            "head": pair[1:2, 2:3].tolist(),
            "seq2seq": {kind: values.tolist() for kind, values in s2s},
        },
        "fixtures": {
            "pair-row-max-uint8.hsa1": "pair",
            "pair-abs-uint8.hsa1": "pair",
            "pair-abs-uint8-key-major.hsa1": "pair",
            "pair-abs-uint8-key-major-6bit.hsa1": "pair",
            "causal-abs-uint8-key-major.hsa1": "causal",
            "head-float32-shuffled.hsa1": "head",
            **{f"seq2seq-{scheme}.hsa1": "seq2seq" for scheme in SEQ2SEQ_SCHEMES},
            "seq2seq-head-cross.hsa1": "seq2seq",
        },
        # From tests/tolerances.py, so the Node tests use the bounds the Python tests use.
        "tolerances": {
            "quant8": quant8(),
            # The mean of H decoded heads against the mean of the sources, which the test sums in float64.
            "quant8_mean_of_3": quant8(heads=3),
            "quant6": quant(6),
            "u32": U32,
        },
    }
    return buffers, expected


def expected_json(expected: dict[str, Any]) -> str:
    return json.dumps(expected, indent=1, ensure_ascii=False) + "\n"


def main() -> None:
    buffers, expected = build()
    FIXTURES.mkdir(exist_ok=True)
    for name, buffer in buffers.items():
        (FIXTURES / name).write_bytes(buffer)
    (FIXTURES / "expected.json").write_text(expected_json(expected), encoding="utf-8")


if __name__ == "__main__":
    main()
