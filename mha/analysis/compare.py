"""Comparing two attention maps: of one input under two models, or of two inputs on their aligned tokens.

``compare``: per head the difference a - b and the change score js = mean over rows of the Jensen–Shannon
divergence JS(p, q) = H((p+q)/2) - (H(p) + H(q))/2 in nats, in [0, ln 2] (clamped there against
rounding; float32 inputs give about 1e-5 nats of rounding). ``compare_aligned`` first keeps only the
aligned tokens (rows and columns) of each map and renormalises each kept row over the kept keys; a row
with no weight on any kept key becomes uniform over them. The fraction of weight kept is returned as
``kept_a`` / ``kept_b`` [L, H] (mean over kept rows), so a caller can see what was dropped. The pairs
come from ``align_tokens``: difflib's matching blocks of the token strings.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from mha.analysis._base import check_attention, row_entropy
from mha.errors import HeadsMismatchError, NothingAlignedError, ShapeMismatchError

__all__ = ["AlignedComparison", "Comparison", "align_tokens", "compare", "compare_aligned", "js_divergence"]


@dataclass(frozen=True)
class Comparison:
    """What ``compare`` finds between two maps a and b of one shape [L, H, n, n]."""

    difference: Tensor  # a - b, [L, H, n, n]
    js_rows: Tensor  # Jensen–Shannon divergence of each pair of rows, nats in [0, ln 2], [L, H, n]
    js: Tensor  # its mean over rows, [L, H]: the per-head change score

    def __getitem__(self, name: str) -> Tensor:
        """Read access by field name (``result["js"]``), as for the dict this class replaced."""
        if name not in {field.name for field in fields(self)}:
            raise KeyError(name)
        value: Tensor = getattr(self, name)
        return value


@dataclass(frozen=True)
class AlignedComparison(Comparison):
    """What ``compare_aligned`` finds: a ``Comparison`` of the restricted maps [L, H, m, m], and the maps."""

    a: Tensor  # a's aligned rows and keys, rows renormalised, [L, H, m, m] (difference = a - b)
    b: Tensor  # b's, likewise
    kept_a: Tensor  # the mean weight a's aligned rows had on aligned keys, [L, H]
    kept_b: Tensor  # b's, likewise


def js_divergence(p: Tensor, q: Tensor) -> Tensor:
    """Jensen–Shannon divergence in nats between matching rows of p and q [..., n] -> [...]."""
    if p.shape != q.shape:
        raise ValueError(f"shapes differ: {tuple(p.shape)} vs {tuple(q.shape)}")
    mean = (p + q) / 2
    divergence = row_entropy(mean) - (row_entropy(p) + row_entropy(q)) / 2
    return divergence.clamp(0.0, math.log(2))


def compare(a: Tensor, b: Tensor) -> Comparison:
    """Compare two maps of the same shape [L, H, n, n]: their difference and per-head change score."""
    check_attention(a, name="a")
    check_attention(b, name="b")
    if a.shape != b.shape:
        raise ShapeMismatchError(a.shape, b.shape)
    js_rows = js_divergence(a, b)
    return Comparison(difference=a - b, js_rows=js_rows, js=js_rows.mean(-1))


def align_tokens(
    tokens_a: Sequence[str], tokens_b: Sequence[str], *, include_replaced: bool = False
) -> list[tuple[int, int]]:
    """Index pairs (i in a, j in b) where the token sequences align, in order.

    Uses difflib.SequenceMatcher on the token strings (no junk heuristic). With ``include_replaced``
    a replaced run of equal length on both sides is paired position by position too (a swapped word).
    """
    matcher = difflib.SequenceMatcher(a=list(tokens_a), b=list(tokens_b), autojunk=False)
    pairs: list[tuple[int, int]] = []
    for tag, a_start, a_end, b_start, b_end in matcher.get_opcodes():
        if tag == "equal" or (tag == "replace" and include_replaced and a_end - a_start == b_end - b_start):
            pairs.extend(zip(range(a_start, a_end), range(b_start, b_end), strict=True))
    return pairs


def _restrict(attentions: Tensor, index: Tensor) -> tuple[Tensor, Tensor]:
    """Keep rows and columns ``index``, renormalise rows; return (map, kept weight per row)."""
    kept = attentions.index_select(-2, index).index_select(-1, index)  # [L, H, m, m]
    mass = kept.sum(-1, keepdim=True)
    uniform = torch.full_like(kept, 1.0 / kept.shape[-1])
    restricted = torch.where(mass > 0, kept / torch.where(mass > 0, mass, torch.ones_like(mass)), uniform)
    return restricted, mass.squeeze(-1)


def compare_aligned(a: Tensor, b: Tensor, pairs: Sequence[tuple[int, int]]) -> AlignedComparison:
    """Compare maps of two different inputs [L, H, n_a, n_a] and [L, H, n_b, n_b] on aligned tokens.

    ``pairs`` come from ``align_tokens``. Both maps are restricted to the aligned tokens and their
    rows renormalised (module docstring), then compared as by ``compare`` ([L, H, m, m] difference);
    the result also holds the restricted maps and the weight each kept.
    """
    layers_a, heads_a, n_a = check_attention(a, name="a")
    layers_b, heads_b, n_b = check_attention(b, name="b")
    if (layers_a, heads_a) != (layers_b, heads_b):
        raise HeadsMismatchError((layers_a, heads_a), (layers_b, heads_b))
    if not pairs:
        raise NothingAlignedError()
    index_a = [int(i) for i, _ in pairs]
    index_b = [int(j) for _, j in pairs]
    for name, index, n in (("a", index_a, n_a), ("b", index_b, n_b)):
        if len(set(index)) != len(index) or not all(0 <= i < n for i in index):
            raise ValueError(f"pairs must use each {name} index once, within 0..{n - 1}; got {index}")
    restricted_a, mass_a = _restrict(a, torch.tensor(index_a, dtype=torch.long))
    restricted_b, mass_b = _restrict(b, torch.tensor(index_b, dtype=torch.long))
    compared = compare(restricted_a, restricted_b)
    return AlignedComparison(
        difference=compared.difference,
        js_rows=compared.js_rows,
        js=compared.js,
        a=restricted_a,
        b=restricted_b,
        kept_a=mass_a.mean(-1),
        kept_b=mass_b.mean(-1),
    )
