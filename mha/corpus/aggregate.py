"""The run's final files from its shards, in bounded memory.

- ``per_text.parquet``: the shards' per_text files, one record batch at a time.
- ``per_head.parquet``: one statistic of as many heads at a time as VALUES_BUDGET holds over all shards
  (N × heads float64 values: every head at once for tens of thousands of texts, fewer for millions), then
  each head's mean, std (ddof 0) and 5/50/95th percentiles (numpy's linear interpolation); the label
  histogram summed shard by shard. A detection score (``SCORES``) is null on a text where it is absent
  (no repeated token): its summaries are over the texts that have it, counted in ``<score>_count``.
- ``examples.parquet``: for each (head, stat) the EXAMPLES highest and lowest texts (of a score, among
  the texts that have it: fewer where fewer do), kept as running
  candidates merged with each shard (ties to the earlier line), then their lines' snippets looked up (the
  first SNIPPET_CHARS characters: a text is in as many rows as it is an example of, up to every head and
  statistic, so whole texts made one long text thousands of copies; the page reads a whole text by line).
- ``errors.jsonl``: the shards' bad records in order.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mha.analysis.stats import LABELS
from mha.corpus.job import SCORES, STATISTICS
from mha.corpus.shards import PER_TEXT, shard_path, write_atomic

__all__ = [
    "EXAMPLES",
    "EXAMPLES_SCHEMA",
    "PERCENTILES",
    "SNIPPET_CHARS",
    "aggregate",
    "label_column",
    "snippets",
]

EXAMPLES = 5  # texts kept per (head, stat) and side
SNIPPET_CHARS = 300  # characters of an example's text (and pair) in examples.parquet: a few lines on the page
_TEXTS_BATCH = 256  # rows of a shard's texts read at a time when looking up snippets
PERCENTILES = (5, 50, 95)
# Bytes of one statistic's values per_head holds at once: all 72 heads of MiniLM up to 58,000 texts (each
# shard's column then read once a statistic, not once per group of heads), 8 heads of 500,000.
VALUES_BUDGET = 32 << 20
_READ_BATCH = 65_536  # per_text rows per record batch copied into per_text.parquet
EXAMPLES_SCHEMA = pa.schema(
    [("layer", pa.int16()), ("head", pa.int16()), ("stat", pa.string()), ("side", pa.string())]
    + [("rank", pa.int8()), ("value", pa.float64()), ("id", pa.string()), ("line", pa.int64())]
    # the first SNIPPET_CHARS characters of the text and pair; cut: either is longer than its snippet
    + [("snippet", pa.string()), ("snippet_pair", pa.string()), ("cut", pa.bool_())]
)


def label_column(label: str) -> str:
    """per_head's count column of a label: ``label_previous_token`` for "previous-token"."""
    return "label_" + label.replace("-", "_")


def aggregate(out: Path, shards: Sequence[int], *, layers: int, heads: int) -> None:
    """Write per_text.parquet, per_head.parquet, examples.parquet and errors.jsonl of ``out`` from its
    finished ``shards`` (indices, in order)."""
    out = Path(out)
    files = [shard_path(out, k, ".parquet") for k in shards]
    # per_text is the shards' rows copied, Arrow's work outside Python's lock: it runs in a thread beside
    # per_head and examples (the job's one step on one core otherwise), a record batch at a time.
    with ThreadPoolExecutor(1, thread_name_prefix="per-text") as copier:
        copied = copier.submit(write_atomic, out / "per_text.parquet", lambda p: _concatenate(files, p))
        write_atomic(out / "per_head.parquet", lambda p: pq.write_table(per_head(files, layers, heads), p))
        pa.default_memory_pool().release_unused()  # each step's buffers back before the next step reads
        examples = _examples(out, shards, files, layers, heads)
        write_atomic(out / "examples.parquet", lambda p: pq.write_table(examples, p))
        copied.result()
    pa.default_memory_pool().release_unused()
    errors = [shard_path(out, k, ".errors.jsonl") for k in shards]
    write_atomic(out / "errors.jsonl", lambda p: _concatenate_text(errors, p))


def _concatenate(files: Sequence[Path], target: Path) -> None:
    with pq.ParquetWriter(target, PER_TEXT) as writer:
        for file in files:
            for batch in pq.ParquetFile(file).iter_batches(batch_size=_READ_BATCH):
                writer.write_batch(batch)


def _concatenate_text(files: Sequence[Path], target: Path) -> None:
    with target.open("wb") as sink:
        for file in files:
            sink.write(file.read_bytes())


def _column(files: Sequence[Path], name: str, per_text: int, heads: slice) -> np.ndarray:
    """One column of every shard for some heads, shaped [texts, heads]; one shard's column at a time."""
    parts = []
    for file in files:
        column = pq.read_table(file, columns=[name])[name].to_numpy().reshape(-1, per_text)
        parts.append(np.ascontiguousarray(column[:, heads]))
    return np.concatenate(parts) if parts else np.empty((0, heads.stop - heads.start))


def per_head(files: Sequence[Path], layers: int, heads: int) -> pa.Table:
    """One row per (layer, head): count, each statistic's mean, std, p05, p50, p95, label counts."""
    per_text = layers * heads
    columns: dict[str, pa.Array] = {
        "layer": pa.array(np.repeat(np.arange(layers, dtype=np.int16), heads)),
        "head": pa.array(np.tile(np.arange(heads, dtype=np.int16), layers)),
    }
    count = 0
    texts = sum(pq.ParquetFile(file).metadata.num_rows for file in files) // per_text
    group_size = max(1, min(per_text, VALUES_BUDGET // (8 * max(texts, 1))))
    for stat in STATISTICS:
        summary = np.full((2 + len(PERCENTILES), per_text), np.nan)  # mean, std, the percentiles
        present = np.zeros(per_text, dtype=np.int64)  # a score's texts that have it
        # group_size heads at a time: N × group_size values in memory, whatever N.
        for start in range(0, per_text, group_size):
            group = slice(start, min(start + group_size, per_text))
            values = _column(files, stat, per_text, group)  # a null (absent score) reads as NaN
            pa.default_memory_pool().release_unused()  # the shards' buffers, read and copied
            count = values.shape[0]
            if count and stat in SCORES:
                present[group] = np.count_nonzero(~np.isnan(values), axis=0)
                summary[:, group] = _summaries_present(values)
            elif count:
                summary[0, group], summary[1, group] = values.mean(axis=0), values.std(axis=0)
                summary[2:, group] = np.percentile(values, PERCENTILES, axis=0)
        columns[f"{stat}_mean"], columns[f"{stat}_std"] = pa.array(summary[0]), pa.array(summary[1])
        for q, row in zip(PERCENTILES, summary[2:], strict=True):
            columns[f"{stat}_p{q:02d}"] = pa.array(row)
        if stat in SCORES:
            columns[f"{stat}_count"] = pa.array(present)
    histogram = np.zeros((per_text, len(LABELS)), dtype=np.int64)
    for file in files:
        index = pc.index_in(pq.read_table(file, columns=["label"])["label"], value_set=pa.array(LABELS))
        codes = index.to_numpy(zero_copy_only=False).reshape(-1, per_text)
        np.add.at(histogram, (np.broadcast_to(np.arange(per_text), codes.shape), codes), 1)
    for k, label in enumerate(LABELS):
        columns[label_column(label)] = pa.array(histogram[:, k])
    layer, head = columns.pop("layer"), columns.pop("head")
    return pa.table({"layer": layer, "head": head, "count": pa.array(np.full(per_text, count)), **columns})


def _summaries_present(values: np.ndarray) -> np.ndarray:
    """[2 + P, C]: mean, std (ddof 0) and PERCENTILES of each column of values [N, C] over its non-NaN
    entries (a score's texts that have it); NaN for a column with none."""
    with warnings.catch_warnings():  # a column with no value: NaN, which is what it should be
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.concatenate(
            [
                np.nanmean(values, axis=0)[None],
                np.nanstd(values, axis=0)[None],
                np.nanpercentile(values, PERCENTILES, axis=0).reshape(len(PERCENTILES), -1),
            ]
        )


def _examples(out: Path, shards: Sequence[int], files: Sequence[Path], layers: int, heads: int) -> pa.Table:
    """examples.parquet: each (layer, head, stat)'s top and bottom EXAMPLES texts."""
    per_text = layers * heads
    # side -> stat -> (values [k, L·H], lines [k, L·H]) of the best candidates so far
    kept: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {
        side: {
            stat: (np.empty((0, per_text)), np.empty((0, per_text), dtype=np.int64)) for stat in STATISTICS
        }
        for side in ("top", "bottom")
    }
    for file in files:
        table = pq.read_table(file, columns=["line", *STATISTICS])
        lines = table["line"].to_numpy().reshape(-1, per_text)
        for stat in STATISTICS:
            values = table[stat].to_numpy().reshape(-1, per_text)
            for side, sign in (("top", -1.0), ("bottom", 1.0)):
                old_values, old_lines = kept[side][stat]
                both_values = np.concatenate([old_values, values])
                both_lines = np.concatenate([old_lines, lines])
                # Each head's column by (sign·value, line): highest (or lowest) first, ties to the
                # earlier line.
                order = _smallest(sign * both_values, both_lines, EXAMPLES)
                kept[side][stat] = (
                    np.take_along_axis(both_values, order, axis=0),
                    np.take_along_axis(both_lines, order, axis=0),
                )
    wanted = {int(line) for side in kept.values() for _, lines in side.values() for line in lines.flat}
    return _example_rows(kept, _snippets_of(out, shards, wanted), heads)


def _smallest(keys: np.ndarray, lines: np.ndarray, k: int) -> np.ndarray:
    """The row indices [min(k, N), C] of each column's k smallest (key, line) pairs in that order, keys
    and lines [N, C]: np.lexsort((lines, keys), axis=0)[:k], exactly (NaN keys last, ties to the lower
    line). A column's k smallest keys are found by partition (linear), and only they are sorted; a column
    whose k-th key is tied beyond the k (or NaN) is sorted whole."""
    rows, columns = keys.shape
    if rows <= k:
        return np.lexsort((lines, keys), axis=0)
    picked = np.argpartition(keys, k - 1, axis=0)[:k]  # [k, C] some k smallest, ties at the k-th in any order
    kth = np.take_along_axis(keys, picked, axis=0).max(axis=0)  # NaN when one of them is
    exact = ~np.isnan(kth) & ((keys <= kth).sum(axis=0) == k)  # no tie reaches past the k picked
    order = np.empty((k, columns), dtype=np.intp)
    if exact.any():
        within = np.lexsort(
            (np.take_along_axis(lines, picked, axis=0), np.take_along_axis(keys, picked, axis=0)), axis=0
        )
        order[:, exact] = np.take_along_axis(picked, within, axis=0)[:, exact]
    if not exact.all():
        order[:, ~exact] = np.lexsort((lines[:, ~exact], keys[:, ~exact]), axis=0)[:k]
    return order


def _example_rows(
    kept: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]],
    found: dict[int, tuple[str, str, str | None, bool]],
    heads: int,
) -> pa.Table:
    """examples.parquet's rows from the kept candidates (side -> stat -> (values, lines), each [k, L·H])
    and their lines' snippets: by head (layer-major), then statistic, side (top first) and rank, built as
    whole columns (a row at a time in Python was most of aggregate's time)."""
    sides = ("top", "bottom")
    # [L·H, S, 2, k]: the rows' order
    values, lines = (
        np.stack([[kept[side][stat][part] for side in sides] for stat in STATISTICS]).transpose(3, 0, 1, 2)
        for part in (0, 1)
    )
    per_text, _, _, k = values.shape
    flat = np.repeat(np.arange(per_text), len(STATISTICS) * 2 * k)
    known = np.array(sorted(found), dtype=np.int64)
    text = pa.array(np.searchsorted(known, lines.reshape(-1)))  # each row's line in `known`
    record = [found[int(line)] for line in known]
    columns = {
        "layer": pa.array((flat // heads).astype(np.int16)),
        "head": pa.array((flat % heads).astype(np.int16)),
        "stat": pa.array(STATISTICS).take(
            pa.array(np.tile(np.repeat(np.arange(len(STATISTICS)), 2 * k), per_text))
        ),
        "side": pa.array(sides).take(
            pa.array(np.tile(np.repeat(np.arange(2), k), per_text * len(STATISTICS)))
        ),
        "rank": pa.array(np.tile(np.arange(1, k + 1, dtype=np.int8), per_text * len(STATISTICS) * 2)),
        "value": pa.array(values.reshape(-1), pa.float64()),
        "id": pa.array([r[0] for r in record], pa.string()).take(text),
        "line": pa.array(lines.reshape(-1), pa.int64()),
        "snippet": pa.array([r[1] for r in record], pa.string()).take(text),
        "snippet_pair": pa.array([r[2] for r in record], pa.string()).take(text),
        "cut": pa.array([r[3] for r in record], pa.bool_()).take(text),
    }
    # A score's candidates where it is absent sort last (NaN) and are no example: a head with fewer than
    # EXAMPLES texts that have it lists those it has.
    table = pa.table(columns, schema=EXAMPLES_SCHEMA)
    return table.filter(pc.invert(pc.is_nan(table["value"])))


def snippets(text: pa.Array, pair: pa.Array) -> tuple[pa.Array, pa.Array, pa.Array]:
    """examples.parquet's (snippet, snippet_pair, cut) of texts and pairs (a null pair stays null and is
    not cut), computed in Arrow."""
    # utf8_slice_codeunits counts code points, despite its name (as Python's len does)
    snippet, snippet_pair = (pc.utf8_slice_codeunits(c, 0, SNIPPET_CHARS) for c in (text, pair))
    longer = [pc.greater(pc.utf8_length(c), SNIPPET_CHARS) for c in (text, pair)]
    return snippet, snippet_pair, pc.or_(longer[0], pc.fill_null(longer[1], False))


def _snippets_of(
    out: Path, shards: Sequence[int], lines: set[int]
) -> dict[int, tuple[str, str, str | None, bool]]:
    """line -> (id, snippet, snippet_pair, cut) of the given lines, from the shards' texts files, a few
    rows at a time, each text cut in Arrow: no whole text becomes a Python string."""
    found: dict[int, tuple[str, str, str | None, bool]] = {}
    wanted = pa.array(sorted(lines), pa.int64())
    for k in shards:
        texts = pq.ParquetFile(shard_path(out, k, ".texts.parquet"))
        for batch in texts.iter_batches(batch_size=_TEXTS_BATCH):
            batch = batch.filter(pc.is_in(batch["line"], value_set=wanted))
            columns = (batch["line"], batch["id"], *snippets(batch["text"], batch["text_pair"]))
            for line, record_id, snippet, pair, cut in zip(*(c.to_pylist() for c in columns), strict=True):
                found[line] = (record_id, snippet, pair, cut)
    return found
