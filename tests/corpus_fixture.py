"""A finished corpus run written exactly to the contract of docs/design.md "Corpus runs" (the files
`mha.corpus.run` writes and the Corpus view reads), from given numbers, with pyarrow.

`write_run(out, texts, values, ...)`: `texts` the input records ({"id", "line", "text", "text_pair"}),
`values[stat]` an array [texts, layers, heads] for every `head_stats` statistic. Labels come from
mha's own `head_labels` on each text's statistics; per_head and examples are aggregated here by the
contract's rules (population std, numpy's linear percentiles, ties to the earlier line; snippets of
SNIPPET_CHARS, or with `format=1` whole texts, as the first format kept them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from mha.analysis.stats import LABELS, STAT_DESCRIPTIONS, head_labels
from mha.corpus.aggregate import SNIPPET_CHARS, label_column
from mha.corpus.shards import TEXTS, shard_directory, shard_of, shard_path
from mha.corpus.source import MAX_CHARS

# head_stats's keys, in its order (its docstring lists them so).
STATS = tuple(STAT_DESCRIPTIONS)
EXAMPLES = 5  # texts per side, head and statistic


def random_values(texts: int, layers: int, heads: int, *, seed: int = 0) -> dict[str, np.ndarray]:
    """Plausible statistics: shares in [0, 1], entropy and distance positive; all distinct."""
    rng = np.random.default_rng(seed)
    shape = (texts, layers, heads)
    values = {stat: rng.uniform(0.0, 1.0, shape) for stat in STATS}
    values["entropy"] = rng.uniform(0.0, 3.0, shape)
    values["distance"] = rng.uniform(0.0, 12.0, shape)
    return values


def write_run(
    out: Path,
    texts: Sequence[Mapping[str, Any]],
    values: Mapping[str, np.ndarray],
    *,
    model: str = "all-MiniLM-L6-v2",
    kind: str = "self",
    words: bool = False,
    complete: bool = True,
    format: int = 2,
    weighting: str | None = None,
) -> Path:
    """Write run.json, per_text.parquet, per_head.parquet, examples.parquet and the shards' texts into
    `out`; `weighting` None writes none, as runs before --weighting did."""
    out.mkdir(parents=True, exist_ok=True)
    count, layers, heads = values[STATS[0]].shape
    if len(texts) != count or set(values) != set(STATS):
        raise ValueError(f"{len(texts)} texts for {count} rows of values; stats {sorted(values)}")
    # head_labels reads [L, H]; every text's layers stacked as its rows label all texts in one call.
    stacked = {s: torch.from_numpy(values[s].reshape(count * layers, heads)) for s in STATS}
    labels = np.array(head_labels(stacked), dtype=object).reshape(count, layers, heads)

    # per_text: input order, then layer, then head.
    t_index, l_index, h_index = (a.ravel() for a in np.indices((count, layers, heads)))
    per_text: dict[str, pa.Array] = {
        "id": pa.array([str(texts[t]["id"]) for t in t_index], pa.string()),
        "line": pa.array([int(texts[t]["line"]) for t in t_index], pa.int64()),
        "n_tokens": pa.array([len(str(texts[t]["text"]).split()) + 2 for t in t_index], pa.int32()),
        "truncated": pa.array([False] * len(t_index), pa.bool_()),
        "layer": pa.array(l_index, pa.int16()),
        "head": pa.array(h_index, pa.int16()),
        **{stat: pa.array(values[stat].ravel(), pa.float64()) for stat in STATS},
        "label": pa.array(labels.ravel().tolist(), pa.string()),
    }
    pq.write_table(pa.table(per_text), out / "per_text.parquet")

    # per_head: one row per (layer, head).
    rows: dict[str, list[Any]] = {"layer": [], "head": [], "count": []}
    for layer in range(layers):
        for head in range(heads):
            rows["layer"].append(layer)
            rows["head"].append(head)
            rows["count"].append(count)
            for stat in STATS:
                column = values[stat][:, layer, head]
                for suffix, value in (
                    ("mean", column.mean()),
                    ("std", column.std(ddof=0)),
                    ("p05", np.percentile(column, 5)),
                    ("p50", np.percentile(column, 50)),
                    ("p95", np.percentile(column, 95)),
                ):
                    rows.setdefault(f"{stat}_{suffix}", []).append(float(value))
            for label in LABELS:
                hits = int((labels[:, layer, head] == label).sum())
                rows.setdefault(label_column(label), []).append(hits)
    types = {"layer": pa.int16(), "head": pa.int16(), "count": pa.int64()}
    table = {
        key: pa.array(column, types.get(key, pa.int64() if key.startswith("label_") else pa.float64()))
        for key, column in rows.items()
    }
    pq.write_table(pa.table(table), out / "per_head.parquet")

    # examples: for each (layer, head, stat) the top and bottom texts, ties to the earlier line.
    kept = ("text", "text_pair") if format == 1 else ("snippet", "snippet_pair", "cut")
    examples: dict[str, list[Any]] = {
        key: [] for key in ("layer", "head", "stat", "side", "rank", "value", "id", "line", *kept)
    }
    lines = np.array([int(text["line"]) for text in texts])
    for layer in range(layers):
        for head in range(heads):
            for stat in STATS:
                column = values[stat][:, layer, head]
                for side, key in (("top", -column), ("bottom", column)):
                    order = np.lexsort((lines, key))[:EXAMPLES]
                    for rank, t in enumerate(order, start=1):
                        text = texts[int(t)]
                        whole, pair = str(text["text"]), text.get("text_pair")
                        if format == 1:
                            snipped: tuple[tuple[str, Any], ...] = (("text", whole), ("text_pair", pair))
                        else:
                            cut = len(whole) > SNIPPET_CHARS or len(pair or "") > SNIPPET_CHARS
                            snipped = (
                                ("snippet", whole[:SNIPPET_CHARS]),
                                ("snippet_pair", pair and pair[:SNIPPET_CHARS]),
                                ("cut", cut),
                            )
                        for field, value in (
                            ("layer", layer),
                            ("head", head),
                            ("stat", stat),
                            ("side", side),
                            ("rank", rank),
                            ("value", float(column[t])),
                            ("id", str(text["id"])),
                            ("line", int(text["line"])),
                            *snipped,
                        ):
                            examples[field].append(value)
    example_types = {
        "layer": pa.int16(),
        "head": pa.int16(),
        "rank": pa.int16(),
        "line": pa.int64(),
        "value": pa.float64(),
        "text_pair": pa.string(),
        "snippet_pair": pa.string(),
        "cut": pa.bool_(),
    }
    pq.write_table(
        pa.table({key: pa.array(column, example_types.get(key)) for key, column in examples.items()}),
        out / "examples.parquet",
    )
    (out / "errors.jsonl").write_text("")

    # shards/NNNNN.texts.parquet: each shard's texts by line, as the job keeps them (the view reads a
    # clicked text from there).
    shard_size = 1000
    shard_directory(out).mkdir(exist_ok=True)
    for index in sorted({shard_of(int(text["line"]), shard_size) for text in texts}):
        kept = [text for text in texts if shard_of(int(text["line"]), shard_size) == index]
        columns = {
            "line": [int(text["line"]) for text in kept],
            "id": [str(text["id"]) for text in kept],
            "text": [text["text"] for text in kept],
            "text_pair": [text.get("text_pair") for text in kept],
        }
        pq.write_table(pa.table(columns, schema=TEXTS), shard_path(out, index, ".texts.parquet"))

    run = {
        "format": format,
        "complete": complete,
        "name": out.name,
        "engine": "local",
        "kind": kind,
        "model": {
            "name": model,
            "family": "bert",
            "architecture": "encoder",
            "layers": layers,
            "heads": heads,
        },
        "input": {"name": "texts.jsonl", "format": "jsonl", "bytes": 1234},
        "settings": {"batch": 32, "words": words, "shard_size": shard_size, "max_tokens": 512}
        | ({"max_chars": MAX_CHARS} if format >= 2 else {})
        | ({"weighting": weighting} if weighting is not None else {}),
        "counts": {"records": count, "texts": count, "errors": 0, "truncated": 0, "shards": 1},
        "stats": list(STATS),
        "labels": list(LABELS),
        "timings": {"seconds": 1.5, "texts_per_second": count / 1.5},
        "versions": {"headscope": "0.1.0", "torch": torch.__version__, "pyarrow": pa.__version__},
        "started": "2026-11-24T01:00:00Z",
        "finished": "2026-11-24T01:00:02Z",
    }
    (out / "run.json").write_text(json.dumps(run, indent=2))
    return out


def sentences(count: int) -> list[dict[str, Any]]:
    """`count` distinct short records, every third with a pair, ids "t<line>"."""
    words = ("the cat sat on the mat", "a dog ran in the park", "birds sing at dawn", "rain fell all night")
    return [
        {
            "id": f"t{line}",
            "line": line,
            "text": f"{words[line % len(words)]} {line}.",
            "text_pair": f"And then {line} more." if line % 3 == 0 else None,
        }
        for line in range(1, count + 1)
    ]


def write_demo_runs(root: Path, *, layers: int, heads: int, texts: int, seed: int) -> dict[str, Any]:
    """Two finished runs in `root`: "minilm-demo" of the embedded default model (`texts` records, random
    statistics from `seed`) and "unserved", of a model no test server runs. Returns root, texts, values."""
    records = sentences(texts)
    values = random_values(texts, layers, heads, seed=seed)
    write_run(root / "minilm-demo", records, values)
    write_run(root / "unserved", records[:5], random_values(5, 1, 2, seed=seed + 1), model="not-served-here")
    return {"root": root, "texts": records, "values": values}
