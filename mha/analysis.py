"""Insight beyond the heatmap: head statistics, rollout and flow, words, comparison.

Pure tensor functions over attention maps; no web code. Shape legend: L layers, H heads, n tokens,
w words, m aligned tokens. ``a`` is one head's map [n, n]: ``a[i, j]`` is the weight query token i
puts on key token j, and every row is a probability distribution (a row sum differing from 1 by more
than ``ROW_SUM_TOLERANCE``, a negative weight or a NaN raises ``ValueError``).

Head statistics, ``head_stats`` (after Clark et al. 2019, "What Does BERT Look At?"). Each is a mean
over the query rows i of one head, so each comes back as a Tensor [L, H]:

- ``entropy``      mean_i -sum_j a_ij ln a_ij, in nats (0 ln 0 = 0): 0 for one-hot rows, ln n for uniform.
- ``entropy_norm`` mean over rows with k_i > 1 of (row entropy) / ln k_i, where k_i is the number of keys
                   row i may see: n, or i + 1 when causal. 1 = spread as evenly as the mask allows;
                   0 when n = 1. ``causal`` defaults to "every weight above the diagonal is exactly 0".
- ``distance``     mean_i sum_j a_ij |i - j|, in tokens.
- ``self``         mean_i a_ii.
- ``previous``     mean over i = 1..n-1 of a_i,i-1. Row 0 has no previous token and is left out of the
                   mean (so a causal shift-by-one head scores exactly 1); 0 when n = 1.
- ``next``         mean over i = 0..n-2 of a_i,i+1. Row n-1 is left out likewise; 0 when n = 1.
- ``local``        mean_i sum over |i - j| <= LOCAL_WINDOW of a_ij.
- ``forward``      mean_i sum over j > i of a_ij (weight on later tokens; 0 for causal models).
- ``special``      mean_i sum over special j of a_ij. Special = the ``special`` mask when given, else a
                   token spelled as one of ``SPECIAL_TOKENS``. The two agree on every supported tokenizer:
                   mha marks a token special when its id is one of the tokenizer's special ids (typed in
                   the text or added by the template, [UNK] included), and SPECIAL_TOKENS spells exactly
                   those ids of BERT, RoBERTa, DistilBERT and GPT-2.
- ``punctuation``  mean_i sum over punctuation j of a_ij. Punctuation = a non-special token that, after
                   stripping one leading subword marker (``##``, ``Ġ``, ``▁``), is non-empty and made only
                   of Unicode punctuation (categories P*).
- ``first``        mean_i a_i0: the first position, the "attention sink" of models such as GPT-2 that
                   add no [CLS].
- ``max``          mean_i max_j a_ij.

Head labels, ``head_labels``, first rule that applies:

1. Pointer heads: among previous-token (``previous``), next-token (``next``), self (``self``),
   special-sink (``special``), first-token-sink (``first``) and punctuation (``punctuation``), those whose
   statistic is > ``POINTER_THRESHOLD`` (0.5, a majority of the weight); the highest wins, ties in
   that order (so a head on a leading [CLS] is special-sink, not first-token-sink).
2. broad: ``entropy_norm`` >= ``BROAD_THRESHOLD`` (0.8).
3. local: ``local`` >= ``LOCAL_THRESHOLD`` (0.6), i.e. most weight within LOCAL_WINDOW (2) tokens.
4. mixed: anything else.

Rollout, ``rollout`` / ``rollout_per_layer`` (Abnar & Zuidema 2020, "Quantifying Attention Flow in
Transformers"). Per layer l the heads are reduced (mean by default, or max / min) to A_l, then
Ã_l = (1 - r) A_l + r I with r = ``residual`` (0.5: the residual stream counts as much as attention),
rows renormalised to sum 1 (a row left with no weight, possible only with r = 0 and "min", stays 0).
R = Ã_L ··· Ã_1: row i says how output token i at the top draws on input token j at the bottom.
The per-layer rollout is R_l = Ã_l ··· Ã_1 for l = 1..L, so R_L = R. Computed in float64.

Attention flow, ``attention_flow``: the layered graph has nodes (l, t) for l = 0..L and t = 0..n-1 and
an edge (l, i) -> (l-1, j) of capacity Ã_l[i, j] (the same matrices as rollout). Entry [i, j] is the
max-flow value from (L, i) to (0, j), each pair solved as its own problem with networkx
(shortest augmenting path), so an entry lies in [0, 1] but rows do not sum to 1 (the raw form).
``normalize=True`` gives the paper's published form (``compute_flows`` in its code): each row divided
by its sum, a distribution over input tokens like a rollout row. Zero capacities (a causal row never
attends forward; a weight can round to 0) are edges that carry nothing. Cost: n² max-flow
problems (one per requested query row times n) over a graph of (L+1)·n nodes and L·n² edges, about
L·n⁴ work in pure Python; measured for L = 6 on a shared, loaded core at ~1 s for n = 12 and ~3 s
for n = 16 (benchmarks/analysis.py), hence ``FLOW_MAX_TOKENS`` = 14 (longer inputs raise ValueError).
Capacities are scaled to integers by ``FLOW_CAPACITY_SCALE`` (networkx is exact on integers), which
moves a value by less than L·n²/(2·FLOW_CAPACITY_SCALE) (< 1e-5 at the allowed sizes).

Words, ``merge_to_words``: with word groups g (a partition of the tokens), the word map is
W[g, h] = (1/|g|) sum_{i in g} sum_{j in h} a_ij: attention TO a word sums its pieces, FROM a word
averages its pieces, so rows still sum to 1. ``word_groups_from`` builds the groups from the tokenizer's
word ids per segment (never from the strings); special tokens stay groups of their own.

Comparison, ``compare``: per head the difference a - b and the change score js = mean over rows of the
Jensen–Shannon divergence JS(p, q) = H((p+q)/2) - (H(p) + H(q))/2 in nats, in [0, ln 2] (clamped there
against rounding; float32 inputs give about 1e-5 nats of rounding). ``compare_aligned`` first keeps
only the aligned tokens (rows and columns) of each map and renormalises each kept row over the kept
keys; a row with no weight on any kept key becomes uniform over them. The fraction of weight kept is
returned as ``kept_a`` / ``kept_b`` [L, H] (mean over kept rows), so a caller can see what was dropped.

Similar heads, ``similar_heads``: each statistic in ``SIMILARITY_STATS`` is standardised over all L·H
heads (z-score; a statistic equal on every head contributes 0), and heads are ranked by Euclidean
distance to the chosen head in that space.
"""

from __future__ import annotations

import difflib
import math
import unicodedata
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Literal, NamedTuple

import networkx as nx
import torch
from networkx.algorithms.flow import build_residual_network, shortest_augmenting_path
from torch import Tensor

__all__ = [
    "BROAD_THRESHOLD",
    "FLOW_CAPACITY_SCALE",
    "FLOW_MAX_TOKENS",
    "LABELS",
    "LOCAL_THRESHOLD",
    "LOCAL_WINDOW",
    "POINTER_THRESHOLD",
    "ROW_SUM_TOLERANCE",
    "SIMILARITY_STATS",
    "SPECIAL_TOKENS",
    "STAT_DESCRIPTIONS",
    "WordGroups",
    "align_tokens",
    "attention_flow",
    "normalize_flow",
    "compare",
    "compare_aligned",
    "head_labels",
    "head_stats",
    "is_punctuation_token",
    "js_divergence",
    "merge_to_words",
    "rollout",
    "rollout_per_layer",
    "similar_heads",
    "word_groups_from",
    "word_labels",
]

ROW_SUM_TOLERANCE = 1e-3  # catches wrong axes / logits, not float rounding (6-decimal JSON at n=512: 3e-4)
# The special tokens of every supported tokenizer (WordPiece, RoBERTa's BPE, GPT-2's): what the tokenizer's
# special ids spell, so the spelled rule equals the id rule mha's `special` mask follows.
SPECIAL_TOKENS = frozenset(
    {"[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]", "<s>", "</s>", "<pad>", "<mask>", "<unk>", "<|endoftext|>"}
)
SUBWORD_MARKERS = ("##", "Ġ", "▁")  # WordPiece continuation, GPT-2 byte-level space, SentencePiece space

LOCAL_WINDOW = 2  # tokens either side counted by the "local" statistic
POINTER_THRESHOLD = 0.5  # a pointer label needs more than half of the head's weight on its target
BROAD_THRESHOLD = 0.8  # entropy_norm from which a head counts as spread over everything
LOCAL_THRESHOLD = 0.6  # "local" weight from which a head counts as local

# label -> the statistic that decides it; dict order breaks ties.
POINTER_LABELS = {
    "previous-token": "previous",
    "next-token": "next",
    "self": "self",
    "special-sink": "special",
    "first-token-sink": "first",
    "punctuation": "punctuation",
}
LABELS = (*POINTER_LABELS, "broad", "local", "mixed")

SIMILARITY_STATS = (
    "entropy_norm",
    "distance",
    "self",
    "previous",
    "next",
    "local",
    "forward",
    "special",
    "punctuation",
    "first",
    "max",
)

# One line per head_stats key, for a reader of the numbers (the API serves these next to them).
STAT_DESCRIPTIONS = {
    "entropy": "mean row entropy in nats: 0 = each token looks at one token, ln n = uniform",
    "entropy_norm": "mean row entropy over its maximum (ln of the keys the row may see): 1 = spread evenly",
    "distance": "mean distance in tokens between a token and what it looks at",
    "self": "mean weight a token puts on itself",
    "previous": "mean weight a token puts on the token before it",
    "next": "mean weight a token puts on the token after it",
    "local": f"mean weight within {LOCAL_WINDOW} tokens either side",
    "forward": "mean weight on later tokens (0 for causal models)",
    "special": "mean weight on special tokens ([CLS], [SEP], [UNK], <s>, </s>, <|endoftext|>, ...)",
    "punctuation": "mean weight on punctuation tokens",
    "first": "mean weight on the first position (the attention sink of models without [CLS])",
    "max": "mean of each row's largest weight: 1 = every token looks at exactly one token",
}

FLOW_MAX_TOKENS = 14  # ~2 s at 6 layers on a loaded shared core (benchmarks/analysis.py); cost ~ L·n⁴
FLOW_CAPACITY_SCALE = 10**9

# The row kernels walk the map in tiles of about this many weights (2 MiB of float32), so their
# temporaries stay in cache and are allocated once; each tile is one set of vectorized ops over
# all its heads and rows (a 6x12 model is a single tile up to n = 85).
_TILE_ELEMENTS = 1 << 19

HeadReduce = Literal["mean", "max", "min"]


# ---------------------------------------------------------------------------------------- checks


def _check_attention(attentions: Tensor, *, name: str = "attentions") -> tuple[int, int, int]:
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


def _check_length(values: Sequence[object], n: int, *, name: str) -> None:
    if len(values) != n:
        raise ValueError(f"{name} has {len(values)} entries but the attention has n = {n} tokens")


# -------------------------------------------------------------------------------- head statistics


def is_punctuation_token(token: str) -> bool:
    """True when ``token`` minus one leading subword marker is non-empty Unicode punctuation (P*)."""
    for marker in SUBWORD_MARKERS:
        if token.startswith(marker):
            token = token[len(marker) :]
            break
    return bool(token) and all(unicodedata.category(ch).startswith("P") for ch in token)


def _tile_rows(rows: int, n: int) -> int:
    return max(1, min(rows, _TILE_ELEMENTS // max(n, 1)))


def _entropy_into(rows: Tensor, work: Tensor, out: Tensor) -> None:
    """out[r] = -sum_j rows[r, j] log2 rows[r, j] for a tile; ``work`` is scratch of rows' shape."""
    torch.clamp(rows, min=torch.finfo(rows.dtype).tiny, out=work)  # 0·log(tiny) = 0, never 0·(-inf)
    work.log2_().mul_(rows)  # log2 is markedly faster than ln on CPU; callers rescale by ln 2
    torch.sum(work, -1, out=out)
    out.neg_()


def _row_entropy(rows: Tensor) -> Tensor:
    """Entropy in nats of each row of [..., n] (0 ln 0 = 0), in cache-sized tiles of rows."""
    n = rows.shape[-1]
    flat = rows.reshape(-1, n)
    out = torch.empty(flat.shape[0], dtype=rows.dtype)
    per_tile = _tile_rows(flat.shape[0], n)
    scratch = torch.empty(min(per_tile, flat.shape[0]), n, dtype=rows.dtype)
    for start in range(0, flat.shape[0], per_tile):
        tile = flat[start : start + per_tile]
        _entropy_into(tile, scratch[: tile.shape[0]], out[start : start + tile.shape[0]])
    return out.mul_(math.log(2)).reshape(rows.shape[:-1])


def _row_kernels(a3: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-row entropy (nats), distance, forward weight and max of a [B, n, n] map, each [B, n]."""
    batch, n, _ = a3.shape
    per_tile = max(1, min(batch, _TILE_ELEMENTS // (n * n)))
    positions = torch.arange(n, dtype=a3.dtype)
    distance_matrix = (positions[:, None] - positions[None, :]).abs()  # [n, n] |i - j|
    later = torch.ones(n, n, dtype=a3.dtype).triu(1)  # [n, n] 1 where j > i
    out = torch.empty(4, batch, n, dtype=a3.dtype)
    scratch = torch.empty(per_tile, n, n, dtype=a3.dtype)
    for start in range(0, batch, per_tile):
        tile = a3[start : start + per_tile]  # (T, n, n)
        work = scratch[: tile.shape[0]]
        rows = slice(start, start + tile.shape[0])
        _entropy_into(tile, work, out[0, rows])
        torch.mul(tile, distance_matrix, out=work)
        torch.sum(work, -1, out=out[1, rows])
        torch.mul(tile, later, out=work)
        torch.sum(work, -1, out=out[2, rows])
        torch.amax(tile, -1, out=out[3, rows])
    out[0].mul_(math.log(2))
    return out[0], out[1], out[2], out[3]


def _diagonal_rows(a: Tensor, offset: int) -> tuple[Tensor, slice]:
    """a[..., i, i + offset] for the rows i that have such a key, and the slice of those rows."""
    n = a.shape[-1]
    rows = slice(0, max(n - offset, 0)) if offset >= 0 else slice(min(-offset, n), n)
    return a.diagonal(offset, -2, -1), rows


def head_stats(
    attentions: Tensor,
    tokens: Sequence[str],
    *,
    special: Sequence[bool] | None = None,
    causal: bool | None = None,
) -> dict[str, Tensor]:
    """Per-head statistics of ``attentions`` [L, H, n, n], each a Tensor [L, H].

    Definitions (entropy, entropy_norm, distance, self, previous, next, local, forward, special,
    punctuation, first, max) are in the module docstring. ``special`` is the special-token mask
    (``AttentionResult.special``); without it tokens spelled as one of ``SPECIAL_TOKENS`` count as special,
    which gives the same mask for every supported tokenizer. ``causal`` only
    changes ``entropy_norm``; None infers it (no weight above the diagonal).
    Vectorized over all heads: at L=6, H=12, n=512 it takes tens of milliseconds on one core.
    """
    layers, heads, n = _check_attention(attentions)
    _check_length(tokens, n, name="tokens")
    if special is None:
        special_mask = [token in SPECIAL_TOKENS for token in tokens]
    else:
        _check_length(special, n, name="special")
        special_mask = [bool(s) for s in special]
    punctuation_mask = [not s and is_punctuation_token(t) for t, s in zip(tokens, special_mask, strict=True)]

    a = attentions.contiguous()
    entropy_rows, distance_rows, forward_rows, max_rows = _row_kernels(a.view(-1, n, n))
    entropy_rows = entropy_rows.view(layers, heads, n)

    if causal is None:
        causal = n > 1 and not bool(forward_rows.any())
    keys_seen = torch.arange(1, n + 1, dtype=a.dtype) if causal else torch.full((n,), float(n), dtype=a.dtype)
    spread_rows = keys_seen > 1  # rows that could spread at all
    if bool(spread_rows.any()):
        entropy_norm = (entropy_rows[..., spread_rows] / keys_seen[spread_rows].log()).mean(-1)
    else:
        entropy_norm = torch.zeros(layers, heads, dtype=a.dtype)

    def pointer(offset: int) -> Tensor:
        values, _ = _diagonal_rows(a, offset)
        if values.shape[-1] == 0:
            return torch.zeros(layers, heads, dtype=a.dtype)
        return values.mean(-1)

    local_rows = torch.zeros(layers, heads, n, dtype=a.dtype)
    for offset in range(-LOCAL_WINDOW, LOCAL_WINDOW + 1):  # 2·LOCAL_WINDOW+1 diagonals, not heads
        values, rows = _diagonal_rows(a, offset)
        local_rows[..., rows] += values

    def weight_on(mask: list[bool]) -> Tensor:
        columns = torch.tensor([j for j, m in enumerate(mask) if m], dtype=torch.long)
        if columns.numel() == 0:
            return torch.zeros(layers, heads, dtype=a.dtype)
        return a.index_select(-1, columns).sum(-1).mean(-1)

    per_head = (layers, heads)
    return {
        "entropy": entropy_rows.mean(-1),
        "entropy_norm": entropy_norm,
        "distance": distance_rows.view(layers, heads, n).mean(-1),
        "self": pointer(0),
        "previous": pointer(-1),
        "next": pointer(1),
        "local": local_rows.mean(-1),
        "forward": forward_rows.view(layers, heads, n).mean(-1),
        "special": weight_on(special_mask),
        "punctuation": weight_on(punctuation_mask),
        "first": a[..., 0].mean(-1).reshape(per_head),
        "max": max_rows.view(layers, heads, n).mean(-1),
    }


def head_labels(stats: Mapping[str, Tensor]) -> list[list[str]]:
    """A label per head, ``labels[layer][head]``, from ``head_stats`` output (rules: module docstring)."""
    needed = {*POINTER_LABELS.values(), "entropy_norm", "local"}
    missing = sorted(needed - set(stats))
    if missing:
        raise ValueError(f"stats lack {missing}; pass the dict head_stats returns")
    pointer_scores = torch.stack([stats[key] for key in POINTER_LABELS.values()], dim=-1)  # [L, H, P]
    best_score, best_index = pointer_scores.max(dim=-1)  # max returns the first index on ties
    pointer_names = list(POINTER_LABELS)
    broad = stats["entropy_norm"] >= BROAD_THRESHOLD
    local = stats["local"] >= LOCAL_THRESHOLD
    labels: list[list[str]] = []
    for layer in range(best_score.shape[0]):
        row: list[str] = []
        for head in range(best_score.shape[1]):
            if best_score[layer, head] > POINTER_THRESHOLD:  # strict: uniform over 2 tokens is broad
                row.append(pointer_names[int(best_index[layer, head])])
            elif broad[layer, head]:
                row.append("broad")
            elif local[layer, head]:
                row.append("local")
            else:
                row.append("mixed")
        labels.append(row)
    return labels


def similar_heads(
    stats: Mapping[str, Tensor],
    layer: int,
    head: int,
    *,
    k: int = 5,
    keys: Sequence[str] = SIMILARITY_STATS,
) -> list[tuple[int, int, float]]:
    """The ``k`` heads nearest to (layer, head) in z-scored statistic space: [(layer, head, distance)].

    Sorted by distance, then layer, then head; the head itself is left out.
    """
    missing = sorted(set(keys) - set(stats))
    if missing or not keys:
        raise ValueError(f"keys {list(keys)} must be non-empty and present in stats (missing {missing})")
    features = torch.stack([stats[key].double() for key in keys], dim=-1)  # [L, H, S]
    layers, heads, _ = features.shape
    if not (0 <= layer < layers and 0 <= head < heads):
        raise ValueError(f"head ({layer}, {head}) is outside the {layers} x {heads} heads")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    flat = features.reshape(layers * heads, -1)
    spread = flat.std(dim=0, unbiased=False)
    z = (flat - flat.mean(dim=0)) / torch.where(spread > 0, spread, torch.ones_like(spread))
    distances = (z - z[layer * heads + head]).norm(dim=-1)
    ranked = sorted(
        (float(distances[index]), index // heads, index % heads)
        for index in range(layers * heads)
        if index != layer * heads + head
    )
    return [(other_layer, other_head, dist) for dist, other_layer, other_head in ranked[:k]]


# ------------------------------------------------------------------------------- rollout and flow


def _layer_matrices(attentions: Tensor, *, residual: float, head_reduce: HeadReduce) -> Tensor:
    """Ã_l for every layer, float64 [L, n, n]: reduced heads, residual mixed in, rows renormalised."""
    if not 0.0 <= residual <= 1.0:
        raise ValueError(f"residual must lie in [0, 1], got {residual}")
    # Heads are reduced in the input dtype first: a float64 copy of the whole map costs more than
    # all the matrix products.
    if head_reduce == "mean":
        reduced = attentions.mean(dim=1).double()
    elif head_reduce == "max":
        reduced = attentions.amax(dim=1).double()
    elif head_reduce == "min":
        reduced = attentions.amin(dim=1).double()
    else:
        raise ValueError(f"head_reduce must be 'mean', 'max' or 'min', got {head_reduce!r}")
    n = reduced.shape[-1]
    mixed = (1 - residual) * reduced + residual * torch.eye(n, dtype=torch.float64)  # [L, n, n]
    totals = mixed.sum(-1, keepdim=True)
    return mixed / torch.where(totals > 0, totals, torch.ones_like(totals))


def rollout_per_layer(
    attentions: Tensor, *, residual: float = 0.5, head_reduce: HeadReduce = "mean"
) -> Tensor:
    """Cumulative rollout after each layer, [L, n, n]: entry l is Ã_{l+1} ··· Ã_1 (module docstring)."""
    _check_attention(attentions)
    layer_maps = _layer_matrices(attentions, residual=residual, head_reduce=head_reduce)
    cumulative = torch.empty_like(layer_maps)
    cumulative[0] = layer_maps[0]
    for layer in range(1, layer_maps.shape[0]):  # a product has to run layer by layer
        cumulative[layer] = layer_maps[layer] @ cumulative[layer - 1]
    return cumulative.to(attentions.dtype)


def rollout(attentions: Tensor, *, residual: float = 0.5, head_reduce: HeadReduce = "mean") -> Tensor:
    """Attention rollout R = Ã_L ··· Ã_1, [n, n] (Abnar & Zuidema 2020; module docstring)."""
    return rollout_per_layer(attentions, residual=residual, head_reduce=head_reduce)[-1]


def attention_flow(
    attentions: Tensor,
    *,
    max_tokens: int = FLOW_MAX_TOKENS,
    residual: float = 0.5,
    head_reduce: HeadReduce = "mean",
    queries: Sequence[int] | None = None,
    normalize: bool = False,
) -> Tensor:
    """Attention flow (Abnar & Zuidema 2020): max-flow from output token i to input token j.

    Returns [q, n] for the rows ``queries`` (all n rows by default, giving [n, n]), in one of two forms:

    - ``normalize=False`` (raw): entry [i, j] is the max-flow value from (L, i) to (0, j) in the layered
      graph of the module docstring, each pair its own problem. It lies in [0, 1], but a row does not
      sum to 1: the same capacity near the top carries the flow to several inputs j.
    - ``normalize=True``: each raw row divided by its sum, as the paper's ``compute_flows`` does, so row i
      is a distribution over the input tokens, comparable with rollout's rows. A row with no flow at all
      (possible only with ``residual=0``) stays 0.

    Cost is q·n max-flow problems over (L+1)·n nodes and L·n² edges (module docstring); inputs longer
    than ``max_tokens`` are refused. Asking for few ``queries`` (say the [CLS] row) makes a larger
    ``max_tokens`` affordable.
    """
    layers, _, n = _check_attention(attentions)
    if n > max_tokens:
        raise ValueError(
            f"attention flow is limited to {max_tokens} tokens (n² max-flow problems), got {n}; "
            "use rollout, pass fewer queries with a larger max_tokens, or shorten the input"
        )
    rows = list(range(n)) if queries is None else [int(q) for q in queries]
    outside = [q for q in rows if not 0 <= q < n]
    if outside:
        raise ValueError(f"queries {outside} are outside 0..{n - 1}")
    layer_maps = _layer_matrices(attentions, residual=residual, head_reduce=head_reduce)
    if layers == 1:  # one edge from (1, i) to (0, j): the flow is its capacity
        flow = layer_maps[0][rows]
    else:
        flow = _max_flows(layer_maps, rows)
    return (normalize_flow(flow) if normalize else flow).to(attentions.dtype)


def normalize_flow(flow: Tensor) -> Tensor:
    """Raw attention flow [..., q, n] with each row divided by its sum (the published form, as
    `attention_flow(normalize=True)`); a row with no flow at all stays 0."""
    totals = flow.sum(-1, keepdim=True)
    return flow / torch.where(totals > 0, totals, torch.ones_like(totals))


def _max_flows(layer_maps: Tensor, rows: list[int]) -> Tensor:
    """Raw flow values [q, n] in float64 for L >= 2 layer matrices Ã_l [L, n, n]."""
    layers, n, _ = layer_maps.shape
    capacity = (
        (layer_maps * FLOW_CAPACITY_SCALE).round().long().tolist()
    )  # [l - 1][i][j]: (l, i) -> (l - 1, j)

    # One graph serves every (i, j) problem: "source" stands for (L, i) with edges to layer L-1 of
    # capacity Ã_L[i, :], and "sink" for (0, j) with edges from layer 1 of capacity Ã_1[:, j]. The
    # other top and bottom nodes are unreachable or dead ends, so leaving them out changes no flow
    # value. Between problems only those 2n capacities change; they are set in the residual network
    # (networkx's documented R[u][v]["capacity"]), which every solve resets and reuses.
    graph = nx.DiGraph()
    # The 2n changing edges are built at the largest capacity an edge can have: networkx leaves a
    # zero-capacity edge out of the residual network (a causal row never attends forward; a weight can
    # round to 0), so one built at 0 could not be given a capacity later. Its stand-in for infinity,
    # 3 x the total capacity, stays above any single path's flow (at most FLOW_CAPACITY_SCALE).
    for k in range(n):
        graph.add_edge("source", (layers - 1, k), capacity=FLOW_CAPACITY_SCALE)
        graph.add_edge((1, k), "sink", capacity=FLOW_CAPACITY_SCALE)
    for layer in range(2, layers):
        for i in range(n):
            for j in range(n):
                if capacity[layer - 1][i][j]:  # a zero edge carries nothing and never changes
                    graph.add_edge((layer, i), (layer - 1, j), capacity=capacity[layer - 1][i][j])
    residual_network = build_residual_network(graph, "capacity")
    out_edges = residual_network.succ["source"]
    in_edges = residual_network.pred["sink"]
    flow = torch.zeros(len(rows), n, dtype=torch.float64)
    for out_row, query in enumerate(rows):
        for k in range(n):
            out_edges[(layers - 1, k)]["capacity"] = capacity[layers - 1][query][k]
        for sink_token in range(n):
            for k in range(n):
                in_edges[(1, k)]["capacity"] = capacity[0][k][sink_token]
            value = nx.maximum_flow_value(
                graph, "source", "sink", flow_func=shortest_augmenting_path, residual=residual_network
            )
            flow[out_row, sink_token] = value / FLOW_CAPACITY_SCALE
    return flow


# ------------------------------------------------------------------------------------------ words


class WordGroups(NamedTuple):
    """Token groups, one per word, and each group's (segment, word id); None for a special token."""

    groups: list[list[int]]
    keys: list[tuple[int, int] | None]


def word_groups_from(
    word_ids: Sequence[int | None], segments: Sequence[int], special: Sequence[bool]
) -> WordGroups:
    """Group tokens into words by the tokenizer's word ids within each segment.

    Tokens sharing (segment, word id) form one group, groups ordered by their first token. Special
    tokens and tokens without a word id stay groups of their own.
    """
    n = len(word_ids)
    _check_length(segments, n, name="segments")
    _check_length(special, n, name="special")
    groups: list[list[int]] = []
    keys: list[tuple[int, int] | None] = []
    group_of: dict[tuple[int, int], int] = {}
    for index, (word, segment, is_special) in enumerate(zip(word_ids, segments, special, strict=True)):
        if is_special or word is None:
            groups.append([index])
            keys.append(None)
            continue
        key = (int(segment), int(word))
        if key not in group_of:
            group_of[key] = len(groups)
            groups.append([])
            keys.append(key)
        groups[group_of[key]].append(index)
    return WordGroups(groups, keys)


def _strip_marker(token: str) -> str:
    for marker in SUBWORD_MARKERS:
        if token.startswith(marker):
            return token[len(marker) :]
    return token


def word_labels(
    tokens: Sequence[str],
    groups: Sequence[Sequence[int]],
    *,
    offsets: Sequence[tuple[int, int]] | None = None,
    segments: Sequence[int] | None = None,
    texts: Sequence[str | None] | None = None,
) -> list[str]:
    """One label per word group.

    With ``offsets``, ``segments`` and ``texts`` (the segments' own texts: (text, text_pair)), a word
    is its slice of the original text, from its pieces' first start to their last end, so accents and
    case survive. Otherwise, or for a group with no span (special tokens), the pieces are joined
    with one leading subword marker (``##``, ``Ġ``, ``▁``) stripped from each.
    """
    n = len(tokens)
    spans: list[tuple[int, int, int]] | None = None  # (segment, start, end) per token
    if offsets is not None and segments is not None and texts is not None:
        _check_length(offsets, n, name="offsets")
        _check_length(segments, n, name="segments")
        spans = [
            (int(seg), int(start), int(end)) for seg, (start, end) in zip(segments, offsets, strict=True)
        ]
    labels: list[str] = []
    for group in groups:
        if not group or any(not 0 <= t < n for t in group):
            raise ValueError(f"word group {list(group)} is empty or outside 0..{n - 1}")
        label = ""
        if spans is not None and texts is not None:
            segment = spans[group[0]][0]
            text = texts[segment] if 0 <= segment < len(texts) else None
            start = min(spans[t][1] for t in group)
            end = max(spans[t][2] for t in group)
            if text is not None and end > start:
                label = text[start:end]
        if not label:
            label = "".join(_strip_marker(tokens[t]) for t in group) or "".join(tokens[t] for t in group)
        labels.append(label)
    return labels


def merge_to_words(attentions: Tensor, word_groups: Sequence[Sequence[int]]) -> Tensor:
    """Word-level map [..., w, w] from a token map [..., n, n] (definition in the module docstring).

    ``word_groups`` must partition the tokens 0..n-1. The map is linear, so it also merges
    difference maps; on row distributions the word rows still sum to 1.
    """
    if (
        not isinstance(attentions, Tensor)
        or attentions.ndim < 2
        or attentions.shape[-1] != attentions.shape[-2]
    ):
        shape = tuple(attentions.shape) if isinstance(attentions, Tensor) else type(attentions).__name__
        raise ValueError(f"attentions must be shaped [..., n, n], got {shape}")
    n = attentions.shape[-1]
    seen = Counter(t for group in word_groups for t in group)
    duplicates = sorted(t for t, count in seen.items() if count > 1)
    outside = sorted(t for t in set(seen) if not 0 <= t < n)
    missing = sorted(set(range(n)) - set(seen))
    empty = [g for g, group in enumerate(word_groups) if not group]
    if duplicates or outside or missing or empty:
        raise ValueError(
            f"word_groups must partition tokens 0..{n - 1}: duplicated {duplicates}, outside {outside}, "
            f"missing {missing}, empty groups {empty}"
        )
    words = len(word_groups)
    word_of = torch.empty(n, dtype=torch.long)  # [n] the word of each token
    for g, group in enumerate(word_groups):
        word_of[list(group)] = g
    # Segment sums (index_add) instead of products with the 0/1 membership matrix: O(n²) not O(n²·w),
    # about 5x faster for a 6x12 map at n = 512.
    to_words = torch.zeros(*attentions.shape[:-1], words, dtype=attentions.dtype)
    to_words.index_add_(-1, word_of, attentions)  # [..., n, w] summed over each word's keys
    merged = torch.zeros(*attentions.shape[:-2], words, words, dtype=attentions.dtype)
    merged.index_add_(-2, word_of, to_words)  # [..., w, w] summed over each word's queries
    sizes = torch.tensor([len(group) for group in word_groups], dtype=attentions.dtype)
    return merged.div_(sizes[:, None])  # the sum over a word's queries becomes their mean


# ------------------------------------------------------------------------------------- comparison


def js_divergence(p: Tensor, q: Tensor) -> Tensor:
    """Jensen–Shannon divergence in nats between matching rows of p and q [..., n] -> [...]."""
    if p.shape != q.shape:
        raise ValueError(f"shapes differ: {tuple(p.shape)} vs {tuple(q.shape)}")
    mean = (p + q) / 2
    divergence = _row_entropy(mean) - (_row_entropy(p) + _row_entropy(q)) / 2
    return divergence.clamp(0.0, math.log(2))


def compare(a: Tensor, b: Tensor) -> dict[str, Tensor]:
    """Compare two maps of the same shape [L, H, n, n].

    Returns ``difference`` a - b [L, H, n, n], ``js_rows`` the per-row JS divergence [L, H, n] and
    ``js`` its mean over rows [L, H] (nats, in [0, ln 2]): the per-head change score.
    """
    _check_attention(a, name="a")
    _check_attention(b, name="b")
    if a.shape != b.shape:
        raise ValueError(f"a and b must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    js_rows = js_divergence(a, b)
    return {"difference": a - b, "js_rows": js_rows, "js": js_rows.mean(-1)}


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


def compare_aligned(a: Tensor, b: Tensor, pairs: Sequence[tuple[int, int]]) -> dict[str, Tensor]:
    """Compare maps of two different inputs [L, H, n_a, n_a] and [L, H, n_b, n_b] on aligned tokens.

    ``pairs`` come from ``align_tokens``. Both maps are restricted to the aligned tokens and their
    rows renormalised (module docstring), then compared as by ``compare`` ([L, H, m, m] difference).
    Also returns those restricted maps as ``a`` / ``b`` [L, H, m, m] (difference = a - b), and
    ``kept_a`` / ``kept_b`` [L, H]: the mean weight the aligned rows had on aligned keys.
    """
    layers_a, heads_a, n_a = _check_attention(a, name="a")
    layers_b, heads_b, n_b = _check_attention(b, name="b")
    if (layers_a, heads_a) != (layers_b, heads_b):
        raise ValueError(f"a has {layers_a}x{heads_a} heads but b has {layers_b}x{heads_b}")
    if not pairs:
        raise ValueError("no aligned tokens to compare (pairs is empty)")
    index_a = [int(i) for i, _ in pairs]
    index_b = [int(j) for _, j in pairs]
    for name, index, n in (("a", index_a, n_a), ("b", index_b, n_b)):
        if len(set(index)) != len(index) or not all(0 <= i < n for i in index):
            raise ValueError(f"pairs must use each {name} index once, within 0..{n - 1}; got {index}")
    restricted_a, mass_a = _restrict(a, torch.tensor(index_a, dtype=torch.long))
    restricted_b, mass_b = _restrict(b, torch.tensor(index_b, dtype=torch.long))
    result = compare(restricted_a, restricted_b)
    result["a"] = restricted_a
    result["b"] = restricted_b
    result["kept_a"] = mass_a.mean(-1)
    result["kept_b"] = mass_b.mean(-1)
    return result
