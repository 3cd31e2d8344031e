"""Detection scores: how much of a head's attention falls where a known kind of head looks.

Shape legend: B batch, L layers, H heads, n tokens. ``a`` is one head's map [n, n] (``a[i, j]``: query i's
weight on key j), ``t`` the token ids [n].

The patterns are TransformerLens's (``transformer_lens/head_detector.py``,
``get_*_head_detection_pattern``), each a 0/1 matrix ``P[i, j]`` on or below the diagonal:

- ``previous_token``: P[i, j] = 1 when j = i - 1.
- ``duplicate_token``: P[i, j] = 1 when j < i and t_j = t_i (an earlier copy of the query's token).
- ``induction``: P[i, j] = 1 when 1 <= j <= i and t_(j-1) = t_i with j - 1 < i: the key just after an
  earlier copy (TransformerLens shifts the duplicate pattern one key right and keeps the lower triangle,
  so the query itself counts when the token before it is a copy of it).

An encoder's map is read the same way: the patterns only ever name earlier keys (and, for induction, the
query itself), as TransformerLens's do, whatever the head may see.

Which keys and rows count. ``keys`` [n] (or [B, n]) marks the real, visible tokens (False: padding, a
masked key). A pattern key must be in ``keys`` (for induction its copy j - 1 too), and only rows in
``keys`` are read: a padded position is neither a key nor a query, so a padded batch scores as each text
alone. ``exclude_bos`` drops every row's weight on position 0 and ``exclude_current_token`` its weight on
itself, from the pattern and the total alike (TransformerLens's ``compute_head_attention_similarity_score``
zeroes ``attention_pattern[:, 0]`` and its diagonal before it divides).

The two measures, each a Tensor [L, H] (or [B, L, H]) per kind:

- ``mul`` (TransformerLens's ``error_measure="mul"``): the share of the head's whole attention that falls
  on the pattern, sum_ij a_ij P_ij / sum_ij a_ij over the counted rows; 0 when no key is a pattern key, as
  TransformerLens gives, NaN only when nothing is left to divide by.
- ``probe``: the same share taken per row and averaged over only the rows with at least one pattern key,
  mean over {i : sum_j P_ij > 0} of sum_j a_ij P_ij / sum_j a_ij. On a repeated random sequence this is
  Olsson et al.'s (2022) induction score, the first half (with nothing to copy) left out. NaN when no row
  has a pattern key (no repeated token: the duplicate and induction scores are absent, not 0).

Sums run in float64 (the products with 0/1 masks are exact in the input's dtype), so a score carries one
rounding to float32 and no more.

``chance_scores``: what the same measure gives attention spread evenly over the keys each query may see,
``visible`` [..., n, n] (the model's own keep-masks: causal, sliding windows; mha.model builds them from
the network): the level a score must clear before it says anything about the head.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from mha.analysis._base import ROW_SUM_TOLERANCE

__all__ = [
    "DETECTION_MARGIN",
    "DETECTION_THRESHOLD",
    "KINDS",
    "MEASURES",
    "chance_scores",
    "detection_patterns",
    "detection_scores",
    "model_scores",
]

KINDS = ("previous_token", "duplicate_token", "induction")
MEASURES = ("probe", "mul")
Measure = Literal["probe", "mul"]
# A head does a kind's job when its score (probe measure) is at least DETECTION_THRESHOLD, a majority of
# the weight of the rows that have a pattern key (as the pointer labels of mha.analysis.stats), and at
# least DETECTION_MARGIN above its chance (uniform attention over the same visible keys), so that a broad
# head on a short text, where uniform attention already scores up to 1/2, is not labelled. Measured on the
# bundled SmolLM2's probe (seed 0, 8 x 50 tokens): a naive cut at 0.1 puts 62 of its 270 heads above it
# for previous_token and 19 for induction; this rule labels 13 heads, its known induction layers 17-18.
DETECTION_THRESHOLD = 0.5
DETECTION_MARGIN = 0.3


def _batched(token_ids: Tensor, keys: Tensor | None, n: int) -> tuple[Tensor, Tensor]:
    """token_ids and keys as [B, n] (keys all True when None); ValueError on a wrong shape or dtype."""
    if not isinstance(token_ids, Tensor) or token_ids.is_floating_point() or token_ids.dtype == torch.bool:
        raise ValueError("token_ids must be an integer torch.Tensor")
    ids = token_ids.unsqueeze(0) if token_ids.ndim == 1 else token_ids
    if ids.ndim != 2 or ids.shape[-1] != n:
        raise ValueError(f"token_ids must be [n] or [B, n] with n = {n}, got {tuple(token_ids.shape)}")
    if keys is None:
        real = torch.ones(ids.shape, dtype=torch.bool, device=ids.device)
    else:
        if keys.dtype != torch.bool:
            raise ValueError(f"keys must be a bool mask, got {keys.dtype}")
        real = keys.unsqueeze(0) if keys.ndim == 1 else keys
        if real.ndim != 2 or real.shape[-1] != n:
            raise ValueError(f"keys must be [n] or [B, n] with n = {n}, got {tuple(keys.shape)}")
    return ids, real


def detection_patterns(
    token_ids: Tensor, *, kinds: Sequence[str] = KINDS, keys: Tensor | None = None
) -> dict[str, Tensor]:
    """{kind: P [B, n, n] bool} (module docstring) of token_ids [n] or [B, n]; a pattern key is always in
    ``keys``."""
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown kinds {unknown}; the kinds are {list(KINDS)}")
    n = token_ids.shape[-1]
    ids, real = _batched(token_ids, keys, n)
    device = ids.device
    positions = torch.arange(n, device=device)
    earlier = positions[None, :] < positions[:, None]  # [n, n] j < i
    both = real[:, :, None] & real[:, None, :]  # [B, n, n] query i and key j real
    duplicate = (ids[:, :, None] == ids[:, None, :]) & earlier & both  # [B, n, n]
    patterns: dict[str, Tensor] = {}
    if "previous_token" in kinds:
        patterns["previous_token"] = (positions[None, :] == positions[:, None] - 1) & both
    if "duplicate_token" in kinds:
        patterns["duplicate_token"] = duplicate
    if "induction" in kinds:
        induction = torch.zeros_like(duplicate)
        induction[:, :, 1:] = duplicate[:, :, :-1]  # key j where j - 1 is an earlier copy (it is real)
        induction &= (positions[None, :] <= positions[:, None]) & both  # j <= i, key j real
        patterns["induction"] = induction
    return {kind: patterns[kind] for kind in kinds}


def _check_maps(attentions: Tensor, real: Tensor) -> tuple[Tensor, Tensor]:
    """attentions as [B, L, H, n, n]: floating, non-negative, finite, each counted row summing to 1."""
    if not isinstance(attentions, Tensor) or not attentions.is_floating_point():
        raise ValueError("attentions must be a floating-point torch.Tensor")
    a = attentions.unsqueeze(0) if attentions.ndim == 4 else attentions
    if a.ndim != 5 or a.shape[-1] != a.shape[-2] or 0 in a.shape:
        raise ValueError(f"attentions must be [L, H, n, n] or [B, L, H, n, n], got {tuple(attentions.shape)}")
    if a.shape[0] != real.shape[0]:
        raise ValueError(f"attentions hold {a.shape[0]} texts but token_ids {real.shape[0]}")
    sums = a.sum(-1, dtype=torch.float64)  # [B, L, H, n]
    bad = ~((sums - 1).abs() <= ROW_SUM_TOLERANCE) & real[:, None, None, :]  # NaN counts as bad
    if bool(bad.any()):
        raise ValueError(
            f"attentions rows must sum to 1 (within {ROW_SUM_TOLERANCE}); "
            f"row {bad.nonzero()[0].tolist()} does not"
        )
    if bool((a < 0).any()):
        raise ValueError("attentions must be non-negative")
    return a, sums


def _on_pattern(kept: Tensor, pattern: Tensor) -> Tensor:
    """[B, L, H, n] float64: each row's weight on its pattern keys, sum over j of kept[..., i, j] P[i, j],
    gathered at the pattern's (i, j) alone (a few per row), not by a product over every n x n weight."""
    batch, layers, heads, n, _ = kept.shape
    out = torch.zeros(batch, layers * heads, n, dtype=torch.float64, device=kept.device)
    for b in range(batch):
        i, j = pattern[b].nonzero(as_tuple=True)
        if i.numel():
            weights = kept[b].reshape(layers * heads, n * n).index_select(1, i * n + j)  # [L·H, K]
            out[b].index_add_(1, i, weights.to(torch.float64))
    return out.view(batch, layers, heads, n)


def _scores(
    a: Tensor,
    patterns: dict[str, Tensor],
    real: Tensor,
    measure: str,
    exclude_bos: bool,
    exclude_current_token: bool,
    row_sums: Tensor | None = None,
) -> dict[str, Tensor]:
    """The measure of a [B, L, H, n, n] against each pattern [B, n, n]: {kind: [B, L, H]} in a's dtype;
    ``row_sums`` [B, L, H, n] float64, a's own (the check's), saves a pass when every weight counts."""
    n = a.shape[-1]
    keep = real[:, :, None] & real[:, None, :]  # [B, n, n]: rows and keys counted
    if exclude_bos:
        keep = keep.clone()
        keep[:, :, 0] = False
    if exclude_current_token:
        keep = keep & ~torch.eye(n, dtype=torch.bool, device=a.device)
    # exact: a product with 0 or 1 (a itself when every weight counts: no copy of an n x n per head)
    every = bool(keep.all())
    kept = a if every else a * keep[:, None, None].to(a.dtype)
    totals = row_sums if every and row_sums is not None else kept.sum(-1, dtype=torch.float64)  # [B, L, H, n]
    out: dict[str, Tensor] = {}
    for kind, pattern in patterns.items():
        pattern = pattern & keep
        on = _on_pattern(kept, pattern)  # [B, L, H, n]
        if measure == "mul":
            score = on.sum(-1) / totals.sum(-1)  # 0/0 = NaN: nothing left to divide by
        else:
            rows = pattern.any(-1)[:, None, None, :] & (totals > 0)  # [B, L, H, n]
            share = torch.where(rows, on / totals.clamp(min=torch.finfo(torch.float64).tiny), 0.0)
            score = share.sum(-1) / rows.sum(-1)  # no such row: 0/0 = NaN, the score is absent
        out[kind] = score.to(a.dtype)
    return out


def _check_options(measure: str) -> None:
    if measure not in MEASURES:
        raise ValueError(f"measure must be one of {list(MEASURES)}, got {measure!r}")


def detection_scores(
    attentions: Tensor,
    token_ids: Tensor,
    *,
    kinds: Sequence[str] = KINDS,
    measure: Measure = "probe",
    exclude_bos: bool = False,
    exclude_current_token: bool = False,
    keys: Tensor | None = None,
) -> dict[str, Tensor]:
    """{kind: score} of ``attentions`` [L, H, n, n] (or [B, L, H, n, n]) on ``token_ids`` [n] (or [B, n]):
    [L, H] (or [B, L, H]); definitions, measures and options in the module docstring. NaN where a score is
    absent (the probe measure on a text where no row has a pattern key)."""
    _check_options(measure)
    n = attentions.shape[-1]
    ids, real = _batched(token_ids, keys, n)
    a, sums = _check_maps(attentions, real)
    patterns = detection_patterns(ids, kinds=kinds, keys=real)
    scores = _scores(a, patterns, real, measure, exclude_bos, exclude_current_token, sums)
    if attentions.ndim == 4:
        return {kind: score[0] for kind, score in scores.items()}
    return scores


def model_scores(maps: Tensor, token_ids: Tensor, *, keys: Tensor | None = None) -> dict[str, Tensor]:
    """detection_scores(maps [B, L, H, n, n], token_ids [B, n], keys=...) without the row checks, for maps a
    forward of ours just made (mha.model.probe, the corpus worker): a half-precision model's rows may miss 1
    by its rounding (bf16: up to 2**-9), and the probe's measure divides by each row's own total anyway; a
    forward that computed NaN is the caller's to refuse (NonFiniteOutputError), not a ValueError here. No
    check reads the values, so the host never waits for a device."""
    ids, real = _batched(token_ids, keys, maps.shape[-1])
    patterns = detection_patterns(ids, keys=real)
    return _scores(maps, patterns, real, "probe", False, False, maps.sum(-1, dtype=torch.float64))


def chance_scores(
    visible: Tensor,
    token_ids: Tensor,
    *,
    kinds: Sequence[str] = KINDS,
    measure: Measure = "probe",
    exclude_bos: bool = False,
    exclude_current_token: bool = False,
    keys: Tensor | None = None,
) -> dict[str, Tensor]:
    """{kind: score} of attention spread evenly over the keys each query may see: ``visible`` a bool
    keep-mask [n, n], [L, H, n, n] or [B, L, H, n, n] (H may be 1; the model's own masks, with their causal
    triangle and sliding windows), intersected with ``keys``. Returns [L, H] ([B, L, H] when token_ids is
    [B, n]; [1, 1] for an [n, n] mask), what ``detection_scores`` with the same options gives such
    attention."""
    _check_options(measure)
    if visible.dtype != torch.bool or visible.ndim not in (2, 4, 5) or visible.shape[-1] != visible.shape[-2]:
        shape = tuple(visible.shape)
        raise ValueError(f"visible must be a bool [n, n], [L, H, n, n] or [B, L, H, n, n] mask, got {shape}")
    n = visible.shape[-1]
    ids, real = _batched(token_ids, keys, n)
    mask = visible.reshape(1, 1, 1, n, n) if visible.ndim == 2 else visible
    mask = mask.unsqueeze(0) if mask.ndim == 4 else mask  # [B|1, L, H, n, n]
    mask = mask & real[:, None, None, None, :]
    uniform = mask.to(torch.float64) / mask.sum(-1, keepdim=True).clamp(min=1)  # a row with no key stays 0
    patterns = detection_patterns(ids, kinds=kinds, keys=real)
    scores = _scores(uniform, patterns, real, measure, exclude_bos, exclude_current_token)
    return {kind: (score if token_ids.ndim == 2 else score[0]).float() for kind, score in scores.items()}
