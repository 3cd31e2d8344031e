"""What every analysis module shares: the checks of an attention map, the tiled row-entropy kernel and
the tokenizers' subword markers."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = [
    "ROW_SUM_TOLERANCE",
    "SUBWORD_MARKERS",
    "check_attention",
    "check_length",
    "entropy_into",
    "row_entropy",
    "strip_marker",
    "tile_rows",
]

ROW_SUM_TOLERANCE = 1e-3  # catches wrong axes / logits, not float rounding (6-decimal JSON at n=512: 3e-4)
SUBWORD_MARKERS = ("##", "Ġ", "▁")  # WordPiece continuation, GPT-2 byte-level space, SentencePiece space

# The row kernels walk the map in tiles of about this many weights (2 MiB of float32), so their
# temporaries stay in cache and are allocated once; each tile is one set of vectorized ops over
# all its heads and rows (a 6x12 model is a single tile up to n = 85).
_TILE_ELEMENTS = 1 << 19


def check_attention(attentions: Tensor, *, name: str = "attentions") -> tuple[int, int, int]:
    """Validate a [L, H, n, n] map of row distributions; return (L, H, n)."""
    if not isinstance(attentions, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(attentions).__name__}")
    shape = tuple(attentions.shape)
    if attentions.ndim != 4 or shape[-1] != shape[-2] or 0 in shape:
        raise ValueError(f"{name} must be shaped [layers, heads, n, n] with none empty, got {shape}")
    if not attentions.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got {attentions.dtype}")
    _check_rows(attentions, name=name)
    return shape[0], shape[1], shape[2]


def _check_rows(attentions: Tensor, *, name: str) -> None:
    error = (attentions.sum(-1) - 1).abs()
    bad = ~(error <= ROW_SUM_TOLERANCE)  # written this way so NaN counts as bad
    if bool(bad.any()):
        where = tuple(int(x) for x in bad.nonzero()[0])
        total = float(attentions.sum(-1)[where])
        raise ValueError(
            f"{name} rows must sum to 1 (within {ROW_SUM_TOLERANCE}); row {where} sums to {total}"
        )
    low = float(attentions.min())
    if low < 0:
        raise ValueError(f"{name} must be non-negative, found {low}")


def check_length(values: Sequence[object], n: int, *, name: str) -> None:
    if len(values) != n:
        raise ValueError(f"{name} has {len(values)} entries but the attention has n = {n} tokens")


def strip_marker(token: str) -> str:
    """``token`` without one leading subword marker (``##``, ``Ġ``, ``▁``)."""
    for marker in SUBWORD_MARKERS:
        if token.startswith(marker):
            return token[len(marker) :]
    return token


def tile_rows(rows: int, row_size: int) -> int:
    """How many of ``rows`` rows of ``row_size`` weights make one tile (at least one)."""
    return max(1, min(rows, _TILE_ELEMENTS // max(row_size, 1)))


def entropy_into(rows: Tensor, work: Tensor, out: Tensor) -> None:
    """out[r] = -sum_j rows[r, j] log2 rows[r, j] for a tile; ``work`` is scratch of rows' shape."""
    torch.clamp(rows, min=torch.finfo(rows.dtype).tiny, out=work)  # 0·log(tiny) = 0, never 0·(-inf)
    work.log2_().mul_(rows)  # log2 is markedly faster than ln on CPU; callers rescale by ln 2
    torch.sum(work, -1, out=out)
    out.neg_()


def row_entropy(rows: Tensor) -> Tensor:
    """Entropy in nats of each row of [..., n] (0 ln 0 = 0), in cache-sized tiles of rows."""
    n = rows.shape[-1]
    flat = rows.reshape(-1, n)
    out = torch.empty(flat.shape[0], dtype=rows.dtype)
    per_tile = tile_rows(flat.shape[0], n)
    scratch = torch.empty(min(per_tile, flat.shape[0]), n, dtype=rows.dtype)
    for start in range(0, flat.shape[0], per_tile):
        tile = flat[start : start + per_tile]
        entropy_into(tile, scratch[: tile.shape[0]], out[start : start + tile.shape[0]])
    return out.mul_(math.log(2)).reshape(rows.shape[:-1])
