"""Cross-attention statistics and labels: an encoder-decoder's target tokens (the queries, m of them)
reading its source tokens (the keys, n). A cross map ``a`` [m, n] has no diagonal and no previous or next
key (queries and keys are two sequences), so it gets its own statistics, each a mean over the query rows
i of one head's map, a Tensor [L, H]. Each entry reads: what it measures, then its formula;
``CROSS_STAT_DESCRIPTIONS`` serves each entry as it stands here.

- ``entropy``: mean row entropy in nats: 0 = each target token looks at one source token, ln n = uniform.
  Formula: mean_i -sum_j a_ij ln a_ij, with 0 ln 0 = 0.
- ``entropy_norm``: mean row entropy over its maximum ln n: 1 = spread evenly over the source.
  Formula: mean_i (row entropy) / ln n; 0 when n = 1.
- ``special``: mean weight on special source tokens (</s>, <pad>, ...).
  Formula: mean_i sum over special j of a_ij.
- ``punctuation``: mean weight on punctuation source tokens. Formula: mean_i sum over punctuation j of a_ij.
- ``first``: mean weight on the first source token. Formula: mean_i a_i0.
- ``max``: mean of each row's largest weight: 1 = every target token looks at exactly one source token.
  Formula: mean_i max_j a_ij.
- ``monotone``: how steadily the row maxima move forward through the source: the share of consecutive
  content rows whose content argmax does not move left. Formula: with r_1 < ... < r_k the non-special
  target rows and p_t = argmax over non-special source keys j of a_(r_t) j (the first on ties), the share
  of t = 2..k with p_t >= p_(t-1); 0 when k < 2.
- ``argmax_keys``: how many distinct source tokens those row maxima land on. Formula: |{p_1, ..., p_k}|.

Labels, ``cross_labels``, first rule that applies:

1. Pointer heads, as for self-attention (mha.analysis.stats): special-sink (``special``), first-token-sink
   (``first``), punctuation (``punctuation``) when that statistic is > POINTER_THRESHOLD; the highest wins,
   ties in that order.
2. alignment: the content rows' maxima never move left (``monotone`` = 1) and land on at least
   ALIGNMENT_MIN_KEYS (2) distinct source tokens (``argmax_keys``): target position i reads source
   positions in order, the picture of a translation's word alignment. A head whose maxima all sit on one
   source token is not aligning anything and falls through.
3. broad: ``entropy_norm`` >= BROAD_THRESHOLD (0.8).
4. mixed: anything else.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor

from mha.analysis._base import _check_rows, check_length, row_entropy
from mha.analysis.stats import BROAD_THRESHOLD, SPECIAL_TOKENS, _entries, is_punctuation_token, pick_labels

__all__ = ["ALIGNMENT_MIN_KEYS", "CROSS_LABELS", "CROSS_POINTER_LABELS", "CROSS_SIMILARITY_STATS"]
__all__ += ["CROSS_STAT_DESCRIPTIONS", "cross_labels", "cross_stats"]

ALIGNMENT_MIN_KEYS = 2  # an alignment's row maxima visit at least this many source tokens

# label -> the statistic that decides it; dict order breaks ties (as stats.POINTER_LABELS).
CROSS_POINTER_LABELS = {"special-sink": "special", "first-token-sink": "first", "punctuation": "punctuation"}
CROSS_LABELS = (*CROSS_POINTER_LABELS, "alignment", "broad", "mixed")
CROSS_SIMILARITY_STATS = ("entropy_norm", "special", "punctuation", "first", "max", "monotone")

# Under `python -OO` there is no __doc__: the source still holds it.
CROSS_STAT_DESCRIPTIONS = _entries(
    __doc__ or ast.get_docstring(ast.parse(Path(__file__).read_text("utf-8"))) or ""
)


def _check_cross(attentions: Tensor) -> tuple[int, int, int, int]:
    """Validate a [L, H, m, n] map of row distributions; return (L, H, m, n)."""
    if not isinstance(attentions, Tensor):
        raise ValueError(f"attentions must be a torch.Tensor, got {type(attentions).__name__}")
    shape = tuple(attentions.shape)
    if attentions.ndim != 4 or 0 in shape or not attentions.is_floating_point():
        raise ValueError(f"attentions must be a float tensor shaped [layers, heads, m, n], got {shape}")
    _check_rows(attentions, name="attentions")
    return shape[0], shape[1], shape[2], shape[3]


def cross_stats(
    attentions: Tensor,
    key_tokens: Sequence[str],
    *,
    key_special: Sequence[bool] | None = None,
    query_special: Sequence[bool] | None = None,
) -> dict[str, Tensor]:
    """Per-head statistics of cross attention [L, H, m, n], each a Tensor [L, H] (definitions: module
    docstring). ``key_special`` and ``query_special`` mark the source's and the target's special tokens;
    without them tokens spelled as one of SPECIAL_TOKENS count (keys), and no query row is special."""
    layers, heads, m, n = _check_cross(attentions)
    check_length(key_tokens, n, name="key_tokens")
    if key_special is None:
        key_special = [token in SPECIAL_TOKENS for token in key_tokens]
    check_length(key_special, n, name="key_special")
    query_mask = [False] * m if query_special is None else [bool(s) for s in query_special]
    check_length(query_mask, m, name="query_special")
    punctuation = [not s and is_punctuation_token(t) for t, s in zip(key_tokens, key_special, strict=True)]

    a = attentions.contiguous()
    entropy = row_entropy(a).mean(-1)  # [L, H]

    def weight_on(mask: Sequence[bool]) -> Tensor:
        columns = torch.tensor([j for j, on in enumerate(mask) if on], dtype=torch.long)
        if columns.numel() == 0:
            return torch.zeros(layers, heads, dtype=a.dtype)
        return a.index_select(-1, columns).sum(-1).mean(-1)

    monotone, argmax_keys = _row_maxima(a, query_mask, [bool(s) for s in key_special])
    return {
        "entropy": entropy,
        "entropy_norm": entropy / math.log(n) if n > 1 else torch.zeros_like(entropy),
        "special": weight_on(key_special),
        "punctuation": weight_on(punctuation),
        "first": a[..., 0].mean(-1),
        "max": a.amax(-1).mean(-1),
        "monotone": monotone,
        "argmax_keys": argmax_keys,
    }


def _row_maxima(a: Tensor, query_special: list[bool], key_special: list[bool]) -> tuple[Tensor, Tensor]:
    """``monotone`` and ``argmax_keys`` of every head (module docstring), [L, H] each."""
    layers, heads = a.shape[:2]
    rows = torch.tensor([i for i, s in enumerate(query_special) if not s], dtype=torch.long)
    keys = torch.tensor([j for j, s in enumerate(key_special) if not s], dtype=torch.long)
    if rows.numel() == 0 or keys.numel() == 0:
        zeros = torch.zeros(layers, heads, dtype=a.dtype)
        return zeros, zeros.clone()
    content = a.index_select(-2, rows).index_select(-1, keys)  # [L, H, k, keys]
    positions = keys[content.argmax(-1)]  # [L, H, k], source positions; argmax takes the first on ties
    distinct = torch.tensor(
        [[len(set(positions[ly, hd].tolist())) for hd in range(heads)] for ly in range(layers)], dtype=a.dtype
    )
    if positions.shape[-1] < 2:
        return torch.zeros(layers, heads, dtype=a.dtype), distinct
    forward = (positions[..., 1:] >= positions[..., :-1]).to(a.dtype).mean(-1)
    return forward, distinct


def cross_labels(stats: Mapping[str, Tensor]) -> list[list[str]]:
    """A label per cross-attention head, ``labels[layer][head]``, from ``cross_stats`` (rules: module
    docstring)."""
    needed = {*CROSS_POINTER_LABELS.values(), "entropy_norm", "monotone", "argmax_keys"}
    missing = sorted(needed - set(stats))
    if missing:
        raise ValueError(f"stats lack {missing}; pass the dict cross_stats returns")
    pointer_scores = torch.stack([stats[key] for key in CROSS_POINTER_LABELS.values()], dim=-1)  # [L, H, P]
    aligned = (stats["monotone"] == 1) & (stats["argmax_keys"] >= ALIGNMENT_MIN_KEYS)
    broad = stats["entropy_norm"] >= BROAD_THRESHOLD
    return pick_labels(pointer_scores, list(CROSS_POINTER_LABELS), [("alignment", aligned), ("broad", broad)])
