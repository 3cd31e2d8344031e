"""CorpusWorker: one model, loaded once; a batch of records in, one row of statistics per record out.

The same class runs in both engines: the local engine calls it on each batch in this process; the Ray
engine gives it to ``Dataset.map_batches`` as its callable class (``__init__`` runs once per worker, so
the model loads once per worker). A batch is a few padded forwards (``AttentionModel.forward_layers``;
the texts sorted by length and grouped so that padding stays under PADDING), its maps handed over a few
layers at a time (MAPS_BYTES), each group followed by one batched ``head_stats`` over all its texts' heads
(``mha.analysis.batched``) on the model's device, so the L layers' maps are never alive together. The
same maps give the detection scores (``mha.analysis.detection``, the probe's measure) of each text's
tokens (words: its words) by spelling, one id per distinct spelling as ``head_stats`` reads them; a score
a text cannot have (no repeated token) is null in the output.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from mha._transfer import HostCopy, to_device, to_host
from mha.analysis.batched import STATS, BatchStats, batch_head_labels
from mha.analysis.detection import chance_scores, model_scores
from mha.analysis.norms import row_shares, weight_norm_map
from mha.analysis.stats import is_punctuation_token
from mha.analysis.words import merge_to_words, word_groups_from, word_index, word_labels
from mha.corpus.job import SCORES, STATISTICS, WEIGHTINGS
from mha.corpus.source import surrogate_problem
from mha.errors import InputError, NonFiniteOutputError
from mha.model import load_pretrained
from mha.model.attention_model import AttentionModel
from mha.text.tokenize import Encoded

__all__ = [
    "DEVICE_MAPS_BYTES",
    "INPUT_COLUMNS",
    "MAPS_BYTES",
    "PADDING",
    "Computed",
    "CorpusWorker",
    "Group",
    "Prepared",
    "output_schema",
    "padded_groups",
]

# and optionally "error", a reader's reason, and "truncated", the reader's cut at max_chars
INPUT_COLUMNS = ("line", "id", "text", "text_pair")
# The maps a forward hands over at once: as many layers as this holds (one at least, float32). Short
# texts then take few statistics calls (each is tens of small operators), and of a 512-token MiniLM text
# one layer (12 MiB) is alive at a time, not the L layers' 72 MiB. On an accelerator (statistics of
# tokens, left there) each call's launches cost more than its memory: an H200 took 1.37x the whole
# stack's time on 4 x 512 tokens a layer at a time.
MAPS_BYTES = 16 << 20
DEVICE_MAPS_BYTES = 256 << 20
# A batch's texts are sorted by length and cut into forwards whose padding stays within this share of
# their tokens: 32 texts of 20-60 tokens padded to the longest waste ~50 % of a forward (about 1.35x
# slower on the CPU, benchmarks/corpus.py); texts of like length stay one forward (what a GPU wants).
PADDING = 0.15


def output_schema(heads: int) -> pa.Schema:
    """What CorpusWorker returns, one row per record: a bad record has ``error`` set, n_tokens 0, and
    NaN statistics; a good one ``heads`` (layers × heads) values per statistic and label, layer-major, a
    detection score null where the text has none."""
    return pa.schema(
        [
            ("line", pa.int64()),
            ("id", pa.string()),
            ("text", pa.string()),
            ("text_pair", pa.string()),
            ("error", pa.string()),
            ("n_tokens", pa.int32()),
            ("truncated", pa.bool_()),
            *[(stat, pa.list_(pa.float64(), heads)) for stat in STATISTICS],
            ("label", pa.list_(pa.int8(), heads)),  # an index into mha.analysis.stats.LABELS
        ]
    )


@dataclass(frozen=True)
class Group:
    """One padded forward of a batch (CorpusWorker.prepare): its texts and what their statistics need."""

    rows: list[int]  # each text's row in the batch
    encoded: list[Encoded]
    lengths: list[int]  # tokens (words with --words) of each text
    special: torch.Tensor  # [B, width] bool, on the host (BatchStats copies it)
    punctuation: torch.Tensor  # [B, width] bool
    spelled: torch.Tensor  # [B, width] int64: one id per distinct spelling of the text, -1 on padding
    words: list[list[list[int]]]  # --words: each text's word groups (else empty)
    indices: list[torch.Tensor]  # --words: each text's word_index


@dataclass(frozen=True)
class Prepared:
    """A batch on the host, ready for the device: the output's columns but the statistics, and the good
    records' padded forwards."""

    lines: list[int]
    ids: list[str]
    texts: list[str | None]
    pairs: list[str | None]
    errors: list[str | None]
    n_tokens: np.ndarray  # int32, 0 for a bad record
    truncated: np.ndarray  # bool
    groups: list[Group]


@dataclass(frozen=True)
class Computed:
    """A batch whose device work is queued: ``values`` [S + K + 1, good texts in group order, L·H] float32
    on its way to the host (the statistics, the K detection scores, then the label index), None when no
    record was good."""

    prepared: Prepared
    values: HostCopy | None


class CorpusWorker:
    """``CorpusWorker(model, words=..., max_tokens=..., device=...)(batch) -> pyarrow.Table``.

    ``model``: a name or path as ``load_pretrained`` takes it (loaded here, once, named ``name``), or a
    loaded model.
    ``batch``: a dict of columns ``line``, ``id``, ``text``, ``text_pair`` (and optionally ``error`` and
    ``truncated``, a text the reader cut: flagged as one the token cap cuts) as
    lists or numpy arrays (what Ray Data hands over), or a pyarrow Table of them. The answer has one row
    per record, in order (``output_schema``). An input the model refuses (no tokens left, a pair it cannot
    take, no room under max_tokens) becomes a bad row with the model's message; so does a text with a lone
    surrogate, or one the tokenizer raises on (each record is encoded in its own guard, ``_encode``).
    Words: the statistics of the word-level maps (``mha.analysis.words``), as the service's words view
    computes them.
    ``weighting``: "weight", the statistics of the attention weights; "norm", of the weight × value norm
    shares (each row's α_ij ‖f_h(x_j)‖ over its total, mha.analysis.norms), as the service's weighting
    "norm" gives them, the norms from the same forward (words: merged from those token shares).
    """

    def __init__(
        self,
        model: str | Path | AttentionModel | None,
        *,
        name: str | None = None,
        words: bool = False,
        weighting: str = "weight",
        max_tokens: int = 512,
        device: str = "auto",
    ) -> None:
        if weighting not in WEIGHTINGS:
            raise ValueError(f"weighting ({weighting!r}) must be one of {', '.join(WEIGHTINGS)}")
        if isinstance(model, AttentionModel):
            self.model = model
        else:
            self.model = load_pretrained(model, device=device, name=name)
        info = self.model.info
        if words and info.seq2seq:
            raise ValueError(f"words are not available for an encoder-decoder ({info.name!r}): use tokens")
        self.words = words
        self.weighting = weighting
        self.limit = self.model.token_limit(min(max_tokens, info.max_tokens))
        self.heads = info.layers * info.heads
        self.schema = output_schema(self.heads)
        # Whether a spelling is punctuation, judged once (a vocabulary's tokens recur in every batch).
        self._punctuation = lru_cache(maxsize=1 << 16)(is_punctuation_token)

    def __call__(self, batch: Mapping[str, Any] | pa.Table) -> pa.Table:
        return self.finish(self.compute(self.prepare(batch)))

    # A batch in three steps, so that an engine can overlap them (mha.corpus.local_engine on an accelerator):
    # prepare (the host: records, tokens, groups, masks), compute (the device: forwards and statistics,
    # queued, then one copy to the host) and finish (waits for that copy; the Arrow table).
    def prepare(self, batch: Mapping[str, Any] | pa.Table) -> Prepared:
        """The host's part of a batch, before any device work: each record checked and encoded, the good
        ones cut into padded forwards (padded_groups) with what their statistics need."""
        columns = batch.to_pydict() if isinstance(batch, pa.Table) else batch
        size = len(columns["line"])
        errors = list(columns.get("error", [None] * size))
        lines = [int(v) for v in columns["line"]]
        ids = [str(v) for v in columns["id"]]
        texts = [_optional(v) for v in columns["text"]]
        pairs = [_optional(v) for v in columns["text_pair"]]
        encoded: list[Encoded] = []
        rows: list[int] = []  # the batch row of each encoded text
        for row in range(size):  # each record on its own: one that fails is a bad row, not a failed batch
            error = _optional(errors[row])
            answer = self._encode(texts[row], pairs[row], ids[row]) if error is None else error
            if isinstance(answer, Encoded):
                encoded.append(answer)
                rows.append(row)
                continue
            # Arrow takes only UTF-8: a surrogate in a reason (or the id) would fail the whole batch.
            errors[row] = answer.encode("utf-8", "backslashreplace").decode("utf-8")
            texts[row] = pairs[row] = None
            if surrogate_problem({"id": ids[row]}):
                ids[row] = str(lines[row])
        n_tokens = np.zeros(size, dtype=np.int32)
        truncated = np.zeros(size, dtype=bool)
        n_tokens[rows] = [len(e.ids) for e in encoded]
        cut = [_flag(v) for v in columns.get("truncated", [False] * size)]
        truncated[rows] = [e.truncated or cut[row] for e, row in zip(encoded, rows, strict=True)]
        groups = [
            self._group([encoded[k] for k in group], [rows[k] for k in group])
            for group in padded_groups([len(e.ids) for e in encoded])
        ]
        return Prepared(lines, ids, texts, pairs, errors, n_tokens, truncated, groups)

    def compute(self, prepared: Prepared) -> Computed:
        """The device's part: each group's forward and statistics, queued on the model's device with no
        wait between them, then the batch's statistics and labels copied to the host at once (one queued
        copy on CUDA, mha._transfer): nothing here waits for the device, but --words' merge on the CPU."""
        parts = [self._statistics(group) for group in prepared.groups]  # [S + K + 1, B, L·H] each
        values = to_host(torch.cat(parts, dim=1)) if parts else None
        return Computed(prepared, values)

    def finish(self, computed: Computed) -> pa.Table:
        """The batch's table (output_schema): waits for compute's copy to the host."""
        prepared = computed.prepared
        size = len(prepared.lines)
        values = np.full((len(STATISTICS), size, self.heads), np.nan)
        labels = np.full((size, self.heads), -1, dtype=np.int8)
        if computed.values is not None:
            where = [row for group in prepared.groups for row in group.rows]  # compute's order
            copied = computed.values.ready().numpy()
            values[:, where] = copied[: len(STATISTICS)]  # float32 to float64: exact
            labels[where] = copied[len(STATISTICS)]  # small whole numbers: exact in float32
            # A text whose attention held NaN or an infinity has no statistics: it is recorded as an error,
            # as the service answers it (mha.errors.NonFiniteOutputError), never as NaN statistics. Its
            # entropy sums every weight of each of its rows (a clamped NaN stays NaN), so a NaN anywhere in
            # its maps is a NaN statistic here: the maps are never read again for it. (A detection score's
            # NaN is an absent score, not a fault: only head_stats' statistics are checked.)
            for row in where:
                if not np.isfinite(values[: len(STATS), row]).all():
                    values[:, row], labels[row] = np.nan, -1
                    error = NonFiniteOutputError(model=self.model.info.name, what="its attention")
                    prepared.errors[row], prepared.n_tokens[row] = str(error), 0  # a bad record's row
        arrays = [
            pa.array(prepared.lines, pa.int64()),
            pa.array(prepared.ids, pa.string()),
            pa.array(prepared.texts, pa.string()),
            pa.array(prepared.pairs, pa.string()),
            pa.array(prepared.errors, pa.string()),
            pa.array(prepared.n_tokens),
            pa.array(prepared.truncated),
            *[
                pa.FixedSizeListArray.from_arrays(
                    pa.array(v.reshape(-1), from_pandas=stat in SCORES), self.heads
                )
                for stat, v in zip(STATISTICS, values, strict=True)  # from_pandas: NaN is null
            ],
            pa.FixedSizeListArray.from_arrays(pa.array(labels.reshape(-1)), self.heads),
        ]
        return pa.Table.from_arrays(arrays, schema=self.schema)

    def _encode(self, text: str | None, pair: str | None, key: str) -> Encoded | str:
        """The record encoded, or why it is bad: no text, a string no tokenizer takes (a lone surrogate),
        the model's refusal (InputError), or what the tokenizer raised for it (ValueError, TypeError:
        Hugging Face's tokenizers raise TypeError for a string they cannot convert). Any other exception
        is a fault of the job, not of this record, and passes."""
        if text is None:
            return "missing field 'text'"
        problem = surrogate_problem({"text": text, "text_pair": pair, "id": key})
        if problem:
            return problem
        try:
            return self.model.encoder.encode_batch([(text, pair)], self.limit)[0]
        except InputError as error:
            return str(error)
        except (ValueError, TypeError) as error:
            return f"the tokenizer failed on it ({type(error).__name__}: {' '.join(str(error).split())})"

    def _group(self, encoded: list[Encoded], rows: list[int]) -> Group:
        """One padded forward's texts and, on the host, their lengths and key masks (tokens, or words:
        each text's word groups and word_index, built once for its L merges)."""
        tokens = [self.model.tokenizer.convert_ids_to_tokens(e.ids) for e in encoded]
        words: list[list[list[int]]] = []
        indices: list[torch.Tensor] = []
        if self.words:
            words = [word_groups_from(e.word_ids, e.segments, e.special).groups for e in encoded]
            indices = [word_index(g, len(e.ids)) for e, g in zip(encoded, words, strict=True)]
            tokens = [
                word_labels(spelled, g, offsets=e.offsets, segments=e.segments, texts=e.texts)
                for e, spelled, g in zip(encoded, tokens, words, strict=True)
            ]
            # special tokens are groups of their own
            special = [[e.special[group[0]] for group in g] for e, g in zip(encoded, words, strict=True)]
        else:
            special = [e.special for e in encoded]
        lengths = [len(t) for t in tokens]
        special_mask = np.zeros((len(tokens), max(lengths)), dtype=bool)
        punctuation_mask = np.zeros_like(special_mask)
        spelled_ids = np.full(special_mask.shape, -1, dtype=np.int64)
        for row, (spelled, marks) in enumerate(zip(tokens, special, strict=True)):
            seen: dict[str, int] = {}  # the detection scores' ids: a repeated spelling is a repeated token
            spelled_ids[row, : len(spelled)] = [seen.setdefault(t, len(seen)) for t in spelled]
            # token_masks' rule (punctuation is never special), each spelling judged once a run
            special_mask[row, : len(marks)] = [bool(s) for s in marks]
            punctuation_mask[row, : len(marks)] = [
                not s and self._punctuation(t) for t, s in zip(spelled, marks, strict=True)
            ]
        return Group(
            rows,
            encoded,
            lengths,
            torch.from_numpy(special_mask),
            torch.from_numpy(punctuation_mask),
            torch.from_numpy(spelled_ids),
            words,
            indices,
        )

    def _statistics(self, group: Group) -> torch.Tensor:
        """[S + K + 1, B, L·H] float32 of the group's texts, on the statistics' device: the S statistics
        (STATS order), the K detection scores (SCORES), then the label index (batch_head_labels), in one
        forward whose maps are taken a few layers at a time (forward_layers, MAPS_BYTES): each group's
        statistics are computed as its weights come out, so not all L layers' maps are alive at once (a
        512-token text's 72 MiB of MiniLM maps was most of a corpus run's peak over short texts). Every
        statistic is a function of one map, so on the CPU the groups give the bits the whole stack at
        once gives."""
        encoded, width = group.encoded, max(group.lengths)
        # Words are merged on the CPU (merge_to_words builds its index there); tokens stay on the device.
        # Prepared once for the forward's L layers: no call waits on the device between two layers.
        statistics = BatchStats(
            group.lengths,
            special=group.special,
            punctuation=group.punctuation,
            causal=self.model.info.causal,
            batch=len(encoded),
            width=width,
            device=torch.device("cpu") if self.words else self.model.device,
        )
        per_group: list[torch.Tensor] = []  # [S + K, B, k, H] each
        spelled = to_device(group.spelled, statistics.n.device)  # [B, width]; queued, as BatchStats' copies
        real = spelled >= 0

        def group_stats(_: int, weights: torch.Tensor, norms: torch.Tensor | None = None) -> None:
            maps = weights  # (k, B, H, T, T): k layers, as the forward wrote them
            if norms is not None:  # weighting "norm": the same layers' norms (k, B, H, T)
                maps = _norm_shares(maps, norms)
            if self.words:
                maps = _merge_words(maps.cpu(), group.words, group.indices, width)
            detected = model_scores(maps.transpose(0, 1), spelled, keys=real)  # {kind: [B, k, H]}
            scores = torch.stack([detected[kind] for kind in SCORES])  # [K, B, k, H]
            per_group.append(torch.cat([statistics.stacked(maps, layer_major=True), scores]))

        # As many layers at once as MAPS_BYTES of maps holds (DEVICE_MAPS_BYTES on an accelerator).
        info = self.model.info
        padded = max(len(e.ids) for e in encoded)
        layer_bytes = len(encoded) * info.heads * padded * padded * 4  # float32
        if self.weighting == "norm":  # the weighted maps and their shares beside the weights
            layer_bytes *= 3
        on_host = self.words or self.model.device.type == "cpu"  # words are merged on the CPU
        at_once = max(1, min(info.layers, (MAPS_BYTES if on_host else DEVICE_MAPS_BYTES) // layer_bytes))
        norms = self.weighting == "norm"
        self.model.forward_layers(encoded, group_stats, layers_at_once=at_once, on_device=True, norms=norms)
        stats = torch.cat(per_group, dim=2)  # [S + K, B, L, H]
        # Each text's chance level, as head_labels takes it from head_chance: uniform attention over its
        # keys (the causal triangle for a decoder), what the induction label's margin is measured from.
        n = spelled.shape[-1]  # the maps' width: words' in a words run
        visible = torch.ones(n, n, dtype=torch.bool, device=spelled.device)
        chance = chance_scores(
            visible.tril() if info.causal else visible, spelled, kinds=("induction",), keys=real
        )
        labels = batch_head_labels(
            dict(zip([*STATS, *SCORES], stats, strict=True)), chance=chance
        )  # [B, L, H] indices into LABELS
        # One tensor to copy: the statistics and scores, then the labels (small whole numbers, exact in
        # float32).
        rows = len(STATISTICS) + 1
        return torch.cat([stats, labels.to(torch.float32)[None]]).reshape(rows, len(encoded), -1)


def padded_groups(lengths: Sequence[int], *, padding: float = PADDING) -> list[list[int]]:
    """The indices of ``lengths`` in forwards: sorted by length (stable), each group as long as its padded
    size (count × longest) stays within ``padding`` of its tokens; one group when the lengths are alike."""
    order = sorted(range(len(lengths)), key=lambda k: lengths[k])
    groups: list[list[int]] = []
    tokens = 0
    for k in order:
        if groups and (len(groups[-1]) + 1) * lengths[k] <= (1 + padding) * (tokens + lengths[k]):
            groups[-1].append(k)
            tokens += lengths[k]
        else:
            groups.append([k])
            tokens = lengths[k]
    return groups


def _merge_words(
    maps: torch.Tensor,
    groups: Sequence[Sequence[Sequence[int]]],
    indices: Sequence[torch.Tensor],
    width: int,
) -> torch.Tensor:
    """Each text's token maps [L, B, H, T, T] merged to its words (``groups``, ``indices`` their
    word_index), padded to ``width`` words: [L, B, H, width, width]."""
    padded = maps.new_zeros(*maps.shape[:3], width, width)
    for row, (text_groups, word_of) in enumerate(zip(groups, indices, strict=True)):
        n, w = len(word_of), len(text_groups)
        padded[:, row, :, :w, :w] = merge_to_words(maps[:, row, :, :n, :n], text_groups, word_of=word_of)
    return padded


def _norm_shares(weights: torch.Tensor, norms: torch.Tensor) -> torch.Tensor:
    """Weight × value norm shares [k, B, H, T, T] of weights [k, B, H, T, T] and norms [k, B, H, T]: each
    row's α_ij ‖f_h(x_j)‖ over its total (row_shares of weight_norm_map, as the service computes them).
    Padded keys carry weight 0, so a text's rows share among its own keys."""
    shares, _ = row_shares(weight_norm_map(weights.flatten(0, 1), norms.flatten(0, 1)))  # (k·B, H, T, T)
    return shares.view(weights.shape)


def _flag(value: Any) -> bool:
    """A ``truncated`` input value: only a real true (numpy's too) counts; None or NaN is false."""
    return isinstance(value, bool | np.bool_) and bool(value)


def _optional(value: Any) -> str | None:
    """A column value as a string or None (Ray's pandas batches give NaN for a missing value)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return str(value)
