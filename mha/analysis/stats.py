"""Head statistics, head labels and similar heads: what one head does, in a dozen numbers.

Head statistics, ``head_stats`` (after Clark et al. 2019, "What Does BERT Look At?"). Each is a mean
over the query rows i of one head's map ``a`` [n, n], so each comes back as a Tensor [L, H]. Each entry
reads: what it measures, then its formula; ``STAT_DESCRIPTIONS`` serves each entry as it stands here.

- ``entropy``: mean row entropy in nats: 0 = each token looks at one token, ln n = uniform.
  Formula: mean_i -sum_j a_ij ln a_ij, with 0 ln 0 = 0.
- ``entropy_norm``: mean row entropy over its maximum: 1 = spread as evenly as the mask allows.
  Formula: mean over the rows with k_i > 1 of (row entropy) / ln k_i, where k_i is the number of keys
  row i may see: n, or i + 1 when causal; 0 when n = 1.
- ``distance``: mean distance in tokens between a token and what it looks at.
  Formula: mean_i sum_j a_ij |i - j|.
- ``self``: mean weight a token puts on itself. Formula: mean_i a_ii.
- ``previous``: mean weight a token puts on the token before it.
  Formula: mean over i = 1..n-1 of a_i,i-1; row 0 has no previous token and is left out (so a causal
  shift-by-one head scores exactly 1); 0 when n = 1.
- ``next``: mean weight a token puts on the token after it.
  Formula: mean over i = 0..n-2 of a_i,i+1; row n-1 has no next token and is left out; 0 when n = 1.
- ``local``: mean weight within LOCAL_WINDOW (2) tokens either side.
  Formula: mean_i sum over |i - j| <= LOCAL_WINDOW of a_ij.
- ``forward``: mean weight on later tokens (0 for causal models). Formula: mean_i sum over j > i of a_ij.
- ``special``: mean weight on special tokens, those the tokenizer adds or that control the model ([CLS],
  [SEP], <s>, </s>, <|endoftext|>, chat markers, ...; not [UNK], which stands for a word): on a BERT text,
  Clark et al.'s attention to [CLS] plus [SEP]. Formula: mean_i sum over special j of a_ij.
- ``punctuation``: mean weight on punctuation tokens. Formula: mean_i sum over punctuation j of a_ij.
- ``first``: mean weight on the first position, the "attention sink" of models that add no [CLS]
  (GPT-2). Formula: mean_i a_i0.
- ``max``: mean of each row's largest weight: 1 = every token looks at exactly one token.
  Formula: mean_i max_j a_ij.
- ``previous_token``: TransformerLens's previous-token score, the probe's measure (mha.analysis.detection).
  Formula: mean over the rows i with a previous token of a_i,i-1 / sum_j a_ij (i >= 1).
- ``duplicate_token``: share of the weight on earlier copies of the token, over the rows that have one.
  Formula: mean over R = {i : some j < i has t_j = t_i} of sum over such j of a_ij; absent (null) when no
  token repeats.
- ``induction``: share of the weight on the token just after an earlier copy (Olsson et al. 2022), over
  the rows that have one. Formula: mean over R = {i : some j <= i has t_j-1 = t_i, j - 1 < i} of sum over
  such j of a_ij; absent (null) when no token repeats.

Which tokens count. Special = the ``special`` mask when given, else a token spelled as one of
``SPECIAL_TOKENS``. The mask is mha's (``AttentionResult.special``, rule in mha.text.tokenize): a control
token, [CLS], [SEP], BOS, EOS, PAD, MASK or a chat-template marker, whether typed in the text or added by the
template; never [UNK], the tokenizer's stand-in for a word it cannot spell, which is no sink (Clark et al.
2019 measure [CLS] + [SEP]). SPECIAL_TOKENS spells exactly the special tokens of BERT, RoBERTa, DistilBERT
and GPT-2, so the two agree on those. Punctuation = a
non-special token that, after stripping one leading subword marker (``##``, ``Ġ``, ``▁``), is non-empty
and made only of Unicode punctuation (categories P*). ``causal`` (for ``entropy_norm``) defaults to
"every weight above the diagonal is exactly 0".

Which map. Every statistic reads rows that sum to 1, so ``head_stats`` takes the attention weights or the
weight × value norm shares alike: ``row_shares(weight_norm_map(attentions, norms))[0]`` (mha.analysis.norms;
the service's ``"weighting": "norm"``, the corpus job's ``--weighting norm``), each row's α_ij ‖f_h(x_j)‖
over its total (Kobayashi et al. 2020). They disagree most on sinks: a head that puts its weight on [CLS],
[SEP] or the first token scores a high ``special`` or ``first`` by weight (a special-sink or
first-token-sink), but those tokens' values are small, so it moves little from them and by norm the same
head scores low and is labelled by what it does move (MiniLM's L2 H7 on "The cat sat on the mat because it
was tired.": 0.91 of its weight on [CLS] and [SEP], 0.19 of its norm). A row of total 0 (a query that moves
nothing) stays 0 in row_shares and is refused here like any row that does not sum to 1.

The three detection scores read the tokens' spellings as their ids (one spelling, one id: a vocabulary
spells each id once; at word level, one word, one id). A score no row can have (a text with no repeated
token) is NaN, which the service writes as null and the page as "–": absent, never 0.

Head labels, ``head_labels``, first rule that applies:

0. induction: given ``chance`` (``head_chance``), ``induction`` >= DETECTION_THRESHOLD (0.5) and at least
   DETECTION_MARGIN (0.3) above what uniform attention over the visible keys scores on the same text
   (mha.analysis.detection: the threshold a majority of the weight on the rows that can copy, as the
   pointer labels; the margin keeps short texts, where uniform attention already scores up to 1/2 on
   their few copying rows, from labelling broad heads).
1. Pointer heads: among previous-token (``previous``), next-token (``next``), self (``self``),
   special-sink (``special``), first-token-sink (``first``) and punctuation (``punctuation``), those whose
   statistic is > POINTER_THRESHOLD (0.5, a majority of the weight); the highest wins, ties in that
   order (so a head on a leading [CLS] is special-sink, not first-token-sink).
2. broad: ``entropy_norm`` >= BROAD_THRESHOLD (0.8).
3. local: ``local`` >= LOCAL_THRESHOLD (0.6), i.e. most weight within LOCAL_WINDOW (2) tokens.
4. mixed: anything else.

Similar heads, ``similar_heads``: each statistic in ``SIMILARITY_STATS`` is standardised over all L·H
heads (z-score; a statistic equal on every head contributes 0), and heads are ranked by Euclidean
distance to the chosen head in that space.
"""

from __future__ import annotations

import ast
import math
import re
import unicodedata
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor

from mha.analysis._base import check_attention, check_length, entropy_into, strip_marker, tile_rows
from mha.analysis.detection import (
    DETECTION_MARGIN,
    DETECTION_THRESHOLD,
    KINDS,
    chance_scores,
    detection_scores,
)
from mha.errors import HeadOutOfRangeError

__all__ = [
    "BROAD_THRESHOLD",
    "LABELS",
    "LOCAL_THRESHOLD",
    "LOCAL_WINDOW",
    "POINTER_LABELS",
    "POINTER_THRESHOLD",
    "SIMILARITY_STATS",
    "SPECIAL_TOKENS",
    "STAT_DESCRIPTIONS",
    "head_chance",
    "head_labels",
    "head_stats",
    "is_punctuation_token",
    "pick_labels",
    "similar_heads",
    "token_masks",
]

# The special tokens of WordPiece (BERT, DistilBERT), RoBERTa's and GPT-2's BPE: what their control ids
# spell, so the spelled rule equals the id rule of mha's `special` mask. No [UNK]: it stands for a word.
# RoBERTa's <unk> stays: a byte-level BPE never writes it for a word, only for "<unk>" typed.
SPECIAL_TOKENS = frozenset(
    {"[CLS]", "[SEP]", "[PAD]", "[MASK]", "<s>", "</s>", "<pad>", "<mask>", "<unk>", "<|endoftext|>"}
)

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
# "induction" last: a corpus run's Parquet stores labels as indices into LABELS, which stay as they were.
LABELS = (*POINTER_LABELS, "broad", "local", "mixed", "induction")

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
    *KINDS,
)


def _entries(doc: str) -> dict[str, str]:
    """The "- ``name``: text" entries of a docstring's list, each folded to one line without markup."""
    found = re.findall(r"^- ``(\w+)``: (.*?)(?=^- |^$)", doc, flags=re.MULTILINE | re.DOTALL)
    return {name: " ".join(text.replace("``", "").split()) for name, text in found}


# One line per head_stats key, for a reader of the numbers (the API serves these next to them): the
# module docstring's entries, so the definitions are written once.
# Under `python -OO` there is no __doc__: the source still holds it.
STAT_DESCRIPTIONS = _entries(__doc__ or ast.get_docstring(ast.parse(Path(__file__).read_text("utf-8"))) or "")


def is_punctuation_token(token: str) -> bool:
    """True when ``token`` minus one leading subword marker is non-empty Unicode punctuation (P*)."""
    token = strip_marker(token)
    return bool(token) and all(unicodedata.category(ch).startswith("P") for ch in token)


def token_masks(tokens: Sequence[str], special: Sequence[bool]) -> tuple[list[bool], list[bool]]:
    """(special, punctuation) masks of one text's tokens: punctuation is never special."""
    special_mask = [bool(s) for s in special]
    punctuation = [not s and is_punctuation_token(t) for t, s in zip(tokens, special_mask, strict=True)]
    return special_mask, punctuation


def _row_kernels(a3: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-row entropy (nats), distance, forward weight and max of a [B, n, n] map, each [B, n]."""
    batch, n, _ = a3.shape
    per_tile = tile_rows(batch, n * n)
    positions = torch.arange(n, dtype=a3.dtype)
    distance_matrix = (positions[:, None] - positions[None, :]).abs()  # [n, n] |i - j|
    later = torch.ones(n, n, dtype=a3.dtype).triu(1)  # [n, n] 1 where j > i
    out = torch.empty(4, batch, n, dtype=a3.dtype)
    scratch = torch.empty(per_tile, n, n, dtype=a3.dtype)
    for start in range(0, batch, per_tile):
        tile = a3[start : start + per_tile]  # (T, n, n)
        work = scratch[: tile.shape[0]]
        rows = slice(start, start + tile.shape[0])
        entropy_into(tile, work, out[0, rows])
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
    punctuation, first, max, and the detection scores previous_token, duplicate_token, induction, NaN
    where absent) are in the module docstring. ``special`` is the special-token mask
    (``AttentionResult.special``: the control tokens, never [UNK]); without it tokens spelled as one of
    ``SPECIAL_TOKENS`` count as special, which gives the same mask on BERT, RoBERTa, DistilBERT and GPT-2
    texts. ``causal`` only changes ``entropy_norm``; None infers it (no weight above the diagonal).
    ``attentions`` may be weight × value norm shares (``row_shares(weight_norm_map(...))[0]``): any rows
    that sum to 1 (module docstring, "Which map").
    Vectorized over all heads: at L=6, H=12, n=512 it takes tens of milliseconds on one core.
    """
    layers, heads, n = check_attention(attentions)
    check_length(tokens, n, name="tokens")
    if special is None:
        special = [token in SPECIAL_TOKENS for token in tokens]
    else:
        check_length(special, n, name="special")
    special_mask, punctuation_mask = token_masks(tokens, special)

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
    detected = detection_scores(a, spelled_ids(tokens))
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
        **detected,
    }


def spelled_ids(tokens: Sequence[str]) -> Tensor:
    """[n] int64: one id per distinct spelling, in order of first appearance."""
    seen: dict[str, int] = {}
    return torch.tensor([seen.setdefault(token, len(seen)) for token in tokens], dtype=torch.long)


def head_chance(tokens: Sequence[str], *, causal: bool) -> dict[str, Tensor]:
    """{kind: [1, 1]}: the detection scores of uniform attention over a text's keys (all of them, or the
    causal triangle), what ``head_labels`` measures the induction margin from."""
    n = len(tokens)
    visible = torch.ones(n, n, dtype=torch.bool)
    return chance_scores(visible.tril() if causal else visible, spelled_ids(tokens))


def head_labels(
    stats: Mapping[str, Tensor], *, chance: Mapping[str, Tensor] | None = None
) -> list[list[str]]:
    """A label per head, ``labels[layer][head]``, from ``head_stats`` output (rules: module docstring);
    the induction rule applies only given ``chance`` (``head_chance``) and an ``induction`` statistic."""
    needed = {*POINTER_LABELS.values(), "entropy_norm", "local"}
    missing = sorted(needed - set(stats))
    if missing:
        raise ValueError(f"stats lack {missing}; pass the dict head_stats returns")
    pointer_scores = torch.stack([stats[key] for key in POINTER_LABELS.values()], dim=-1)  # [L, H, P]
    broad = stats["entropy_norm"] >= BROAD_THRESHOLD
    local = stats["local"] >= LOCAL_THRESHOLD
    labels = pick_labels(pointer_scores, list(POINTER_LABELS), [("broad", broad), ("local", local)])
    if chance is not None and "induction" in stats:
        score = stats["induction"]  # NaN (absent) fails both comparisons
        induction = (score >= DETECTION_THRESHOLD) & (score - chance["induction"] >= DETECTION_MARGIN)
        for layer, head in induction.nonzero().tolist():
            labels[layer][head] = "induction"
    return labels


def pick_labels(
    pointer_scores: Tensor, pointer_names: Sequence[str], rules: Sequence[tuple[str, Tensor]]
) -> list[list[str]]:
    """labels[layer][head]: the pointer label of the highest score [L, H, P] above POINTER_THRESHOLD
    (the first on ties), else the first rule whose [L, H] mask holds, else "mixed"."""
    best_score, best_index = pointer_scores.max(dim=-1)  # max returns the first index on ties
    labels: list[list[str]] = []
    for layer in range(best_score.shape[0]):
        row: list[str] = []
        for head in range(best_score.shape[1]):
            if best_score[layer, head] > POINTER_THRESHOLD:  # strict: uniform over 2 tokens is broad
                row.append(pointer_names[int(best_index[layer, head])])
            else:
                row.append(next((name for name, mask in rules if mask[layer, head]), "mixed"))
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
    # An absent statistic (NaN: a detection score on a text with no repeated token) places no head.
    keys = [key for key in keys if bool(stats[key].isfinite().all())] or list(keys)
    features = torch.stack([stats[key].double() for key in keys], dim=-1)  # [L, H, S]
    layers, heads, _ = features.shape
    if not (0 <= layer < layers and 0 <= head < heads):
        raise HeadOutOfRangeError(layer, head, layers, heads)
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
