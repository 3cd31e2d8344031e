"""Shard files under ``out/shards/``: written atomically, marked done last, read back in order.

Shard k holds the records whose line is in [k·S + 1, (k+1)·S] (S the shard size). Its files:

- ``NNNNN.parquet``: its per_text rows (``PER_TEXT`` columns), the per_text.parquet of its texts.
- ``NNNNN.texts.parquet``: ``line``, ``id``, ``text``, ``text_pair`` of its good records (for examples).
- ``NNNNN.errors.jsonl``: its bad records, ``{"line", "reason"}`` one a line.
- ``NNNNN.done.json``: written last, ``{"records", "texts", "errors", "truncated"}``: the shard is finished
  only when this exists, so a job killed mid-shard redoes that shard and no other.

Each file is written to a temporary name and renamed into place (atomic on POSIX), so a reader never sees
half a file. ``write_shard`` is what both engines call with ``CorpusWorker``'s rows.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mha.analysis.stats import LABELS
from mha.corpus.job import STATISTICS

__all__ = [
    "PER_TEXT",
    "TEXTS",
    "TEMPORARY",
    "done_shards",
    "is_temporary",
    "remove_temporaries",
    "shard_count",
    "shard_directory",
    "shard_of",
    "shard_path",
    "write_atomic",
    "write_shard",
]

PER_TEXT = pa.schema(
    [("id", pa.string()), ("line", pa.int64()), ("n_tokens", pa.int32()), ("truncated", pa.bool_())]
    + [("layer", pa.int16()), ("head", pa.int16())]
    + [(stat, pa.float64()) for stat in STATISTICS]  # a detection score: null where absent
    + [("label", pa.string())]
)
# write_atomic's temporary names: ".{name}.{pid}.tmp", beside the file they become.
TEMPORARY = re.compile(r"\..+\.\d+\.tmp")
TEXTS = pa.schema(
    [("line", pa.int64()), ("id", pa.string()), ("text", pa.string()), ("text_pair", pa.string())]
)


def shard_directory(out: Path) -> Path:
    return Path(out) / "shards"


def shard_path(out: Path, index: int, suffix: str) -> Path:
    """``out/shards/NNNNN<suffix>``; suffix one of .parquet, .texts.parquet, .errors.jsonl, .done.json."""
    return shard_directory(out) / f"{index:05d}{suffix}"


def shard_of(line: int, shard_size: int) -> int:
    return (line - 1) // shard_size


def shard_count(records: int, shard_size: int) -> int:
    """Shards of an input of ``records`` records (lines 1..records)."""
    return -(-records // shard_size)


def write_atomic(path: Path, write: Any) -> None:
    """``write(temporary_path)`` then rename onto ``path``: readers see the old file or the whole new one."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # what TEMPORARY matches
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def is_temporary(name: str) -> bool:
    """Whether ``name`` is one of write_atomic's temporary files (a job killed mid-write leaves them)."""
    return TEMPORARY.fullmatch(name) is not None


def remove_temporaries(folder: Path) -> list[str]:
    """Delete write_atomic's temporary files in ``folder`` (none where it does not exist); their names."""
    if not folder.is_dir():
        return []
    names = sorted(p.name for p in folder.iterdir() if is_temporary(p.name) and p.is_file())
    for name in names:
        (folder / name).unlink(missing_ok=True)
    return names


def write_shard(out: Path, index: int, rows: pa.Table, *, layers: int, heads: int) -> dict[str, int]:
    """Write shard ``index`` from ``rows``, CorpusWorker's answers for the shard's records in line order
    (an empty table for a shard without records); return its counts (what ``NNNNN.done.json`` holds)."""
    shard_directory(out).mkdir(parents=True, exist_ok=True)
    bad = rows.filter(pc.is_valid(rows["error"]))
    good = rows.filter(pc.is_null(rows["error"]))
    per_text = explode(good, layers=layers, heads=heads)
    texts = good.select(["line", "id", "text", "text_pair"]).cast(TEXTS)
    errors = "".join(
        json.dumps({"line": line, "reason": reason}, ensure_ascii=False) + "\n"
        for line, reason in zip(bad["line"].to_pylist(), bad["error"].to_pylist(), strict=True)
    )
    write_atomic(shard_path(out, index, ".parquet"), lambda p: pq.write_table(per_text, p))
    write_atomic(shard_path(out, index, ".texts.parquet"), lambda p: pq.write_table(texts, p))
    write_atomic(shard_path(out, index, ".errors.jsonl"), lambda p: p.write_text(errors, encoding="utf-8"))
    counts = {
        "records": rows.num_rows,
        "texts": good.num_rows,
        "errors": bad.num_rows,
        "truncated": int(pc.sum(good["truncated"]).as_py() or 0),
    }
    write_atomic(shard_path(out, index, ".done.json"), lambda p: p.write_text(json.dumps(counts)))
    return counts


def explode(good: pa.Table, *, layers: int, heads: int) -> pa.Table:
    """Worker rows of good records -> per_text rows: one per (text, layer, head), text then layer then
    head."""
    per_text = layers * heads
    n = good.num_rows
    repeat = pa.array(np.repeat(np.arange(n), per_text))
    layer = np.tile(np.repeat(np.arange(layers, dtype=np.int16), heads), n)
    head = np.tile(np.arange(heads, dtype=np.int16), layers * n)
    stats = [_flat(good[stat], n * per_text, pa.float64()) for stat in STATISTICS]
    label_index = _flat(good["label"], n * per_text, pa.int8())
    columns = [
        *[good[c].take(repeat) for c in ("id", "line", "n_tokens", "truncated")],
        pa.array(layer),
        pa.array(head),
        *stats,
        pc.take(pa.array(LABELS, pa.string()), label_index),
    ]
    return pa.Table.from_arrays(columns, schema=PER_TEXT)


def _flat(column: pa.ChunkedArray, length: int, kind: pa.DataType) -> pa.Array:
    """A fixed-size list column's values, one flat array (empty when the column is)."""
    if length == 0:
        return pa.array([], kind)
    return pc.list_flatten(column.combine_chunks()).cast(kind)


def done_shards(out: Path) -> dict[int, dict[str, int]]:
    """index -> counts of every finished shard under ``out``."""
    done: dict[int, dict[str, int]] = {}
    for marker in sorted(shard_directory(out).glob("*.done.json")):
        done[int(marker.name.split(".")[0])] = json.loads(marker.read_text())
    return done
