"""Insight beyond the heatmap: pure tensor functions over attention maps; no web code.

Shape legend: L layers, H heads, n tokens, w words, m aligned tokens. ``a`` is one head's map [n, n]:
``a[i, j]`` is the weight query token i puts on key token j, and every row is a probability distribution
(a row sum differing from 1 by more than ``ROW_SUM_TOLERANCE``, a negative weight or a NaN raises
``ValueError``).

Each module's docstring holds its definitions, written once:

- ``stats``: head statistics (``head_stats``), head labels (``head_labels``), similar heads.
- ``rollout``: attention rollout and attention flow (Abnar & Zuidema 2020).
- ``words``: token maps merged to word maps, and word labels.
- ``compare``: two maps compared, per head, directly or on the aligned tokens of two inputs.
- ``norms``: weight × value norm (Kobayashi et al. 2020): what each head moves along its weights
  (``weight_norm_map``, ``layer_norm_map``, ``row_shares``), from ``AttentionResult.value_products``.
- ``detection``: the detection scores of TransformerLens's patterns (``previous_token``,
  ``duplicate_token``, ``induction``; ``detection_scores``) in its "mul" measure or the probe's, and
  their chance levels (``chance_scores``).
- ``cross``: an encoder-decoder's cross attention [L, H, m, n] (target to source): its statistics
  (``cross_stats``) and labels (``cross_labels``, with "alignment").

Every public name is re-exported here. ``mha.analysis.rollout`` and ``mha.analysis.compare`` are the
functions; their modules are imported by full name (``from mha.analysis.rollout import ...``).

May import: ``mha.networks``, ``mha.core``, ``mha.text``, ``mha.errors`` and ``mha``'s private helpers.
Never a loader (``ablation`` asks a loaded model only for what its ``Ablated`` protocol names), the trace
or web code.
"""

from mha.analysis import detection
from mha.analysis._base import ROW_SUM_TOLERANCE
from mha.analysis.ablation import HeadEffects
from mha.analysis.compare import (
    AlignedComparison,
    Comparison,
    align_tokens,
    compare,
    compare_aligned,
    js_divergence,
)
from mha.analysis.cross import (
    ALIGNMENT_MIN_KEYS,
    CROSS_LABELS,
    CROSS_POINTER_LABELS,
    CROSS_SIMILARITY_STATS,
    CROSS_STAT_DESCRIPTIONS,
    cross_labels,
    cross_stats,
)
from mha.analysis.detection import *  # noqa: F403  # its __all__, added to ours below
from mha.analysis.norms import LAYER_MAP_MAX_TOKENS, layer_norm_map, row_shares, weight_norm_map
from mha.analysis.rollout import (
    FLOW_CAPACITY_SCALE,
    FLOW_MAX_TOKENS,
    HeadReduce,
    attention_flow,
    normalize_flow,
    rollout,
    rollout_per_layer,
)
from mha.analysis.stats import (
    BROAD_THRESHOLD,
    LABELS,
    LOCAL_THRESHOLD,
    LOCAL_WINDOW,
    POINTER_LABELS,
    POINTER_THRESHOLD,
    SIMILARITY_STATS,
    SPECIAL_TOKENS,
    STAT_DESCRIPTIONS,
    head_chance,
    head_labels,
    head_stats,
    is_punctuation_token,
    similar_heads,
)
from mha.analysis.words import WordGroups, merge_to_words, word_groups_from, word_labels

__all__ = [
    "ALIGNMENT_MIN_KEYS",
    "LAYER_MAP_MAX_TOKENS",
    "layer_norm_map",
    "row_shares",
    "weight_norm_map",
    "CROSS_LABELS",
    "CROSS_POINTER_LABELS",
    "CROSS_SIMILARITY_STATS",
    "CROSS_STAT_DESCRIPTIONS",
    "BROAD_THRESHOLD",
    "FLOW_CAPACITY_SCALE",
    "FLOW_MAX_TOKENS",
    "LABELS",
    "LOCAL_THRESHOLD",
    "LOCAL_WINDOW",
    "POINTER_LABELS",
    "POINTER_THRESHOLD",
    "ROW_SUM_TOLERANCE",
    "SIMILARITY_STATS",
    "SPECIAL_TOKENS",
    "STAT_DESCRIPTIONS",
    "AlignedComparison",
    "Comparison",
    "HeadEffects",
    "HeadReduce",
    "WordGroups",
    "align_tokens",
    "attention_flow",
    "compare",
    "compare_aligned",
    "cross_labels",
    "cross_stats",
    "head_chance",
    "head_labels",
    "head_stats",
    "is_punctuation_token",
    "js_divergence",
    "merge_to_words",
    "normalize_flow",
    "rollout",
    "rollout_per_layer",
    "similar_heads",
    "word_groups_from",
    "word_labels",
]
__all__ += detection.__all__  # all of it, listed once there
