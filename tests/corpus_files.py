"""Test-made corpus files: the same texts in each input format, with bad rows at known places."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

# Good texts; a few with a pair, a few long enough to be cut at a small max_tokens.
GOOD = [
    ("The cat sat on the mat.", None),
    ("Attention heads look at tokens; some look at the previous token, some at punctuation!", None),
    ("Hi.", "A pair, with words of its own."),
    ("Ünïcödé: naïve café, Straße and numbers 12345.", None),
    ("Transformers read text as tokens, and every head of every layer weighs the others.", None),
    ("Short one.", None),
    ("Where is the dog? In the garden, under the old tree, asleep.", "It is sunny."),
    ("One, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve.", None),
]


def texts(count: int) -> list[tuple[str, str | None]]:
    """``count`` good (text, pair) items: GOOD over and over, each made distinct by its number."""
    return [(f"{GOOD[i % len(GOOD)][0]} ({i})", GOOD[i % len(GOOD)][1]) for i in range(count)]


def write_jsonl(path: Path, items: list[tuple[str, str | None]]) -> dict[int, str]:
    """The items as JSON lines with bad lines among them; returns line -> the reason expected for each."""
    lines = [json.dumps({"id": f"t{i}", "text": t, "text_pair": p}) for i, (t, p) in enumerate(items)]
    bad = {
        3: ("{not json", "invalid JSON"),
        6: (json.dumps({"text": "   "}), "blank text"),
        9: (json.dumps(["a", "list"]), "not a JSON object (list)"),
        12: (json.dumps({"title": "no text"}), "missing field 'text'"),
        15: (json.dumps({"text": 5}), "'text' must be a string, got int"),
        18: (json.dumps({"text": "fine", "text_pair": 3}), "'text_pair' must be a string or null, got int"),
    }
    return _insert(path, lines, bad)


def write_txt(path: Path, items: list[tuple[str, str | None]]) -> dict[int, str]:
    lines = [t for t, _ in items]
    return _insert(path, lines, {2: ("", "blank text"), 5: ("   \t", "blank text")})


def write_csv(path: Path, items: list[tuple[str, str | None]]) -> dict[int, str]:
    """CSV with a header; a bad record's number counts data records (the header excluded)."""
    rows = [[f"t{i}", t, p or ""] for i, (t, p) in enumerate(items)]
    bad = {4: (["x", ""], "2 fields where the header has 3"), 7: (["y", " ", ""], "blank text")}
    expected: dict[int, str] = {}
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "text", "text_pair"])
        writer.writerows(_merged(rows, bad, expected))
    return expected


def write_parquet(path: Path, items: list[tuple[str, str | None]]) -> dict[int, str]:
    rows: list[dict[str, object]] = [{"id": i, "text": t, "text_pair": p} for i, (t, p) in enumerate(items)]
    bad = {
        2: ({"id": 100, "text": None, "text_pair": None}, "missing field 'text'"),
        5: ({"id": 101, "text": "", "text_pair": None}, "blank text"),
    }
    expected: dict[int, str] = {}
    merged = list(_merged(rows, bad, expected))
    table = pa.table({c: [r[c] for r in merged] for c in ("id", "text", "text_pair")})
    pq.write_table(table, path, row_group_size=4)  # several row groups: the reader streams them
    return expected


WRITERS = {"jsonl": write_jsonl, "txt": write_txt, "csv": write_csv, "parquet": write_parquet}


def _merged(good: list, bad: dict[int, tuple[object, str]], expected: dict[int, str]):
    """Good rows with each bad row placed at its 1-based record number; fills ``expected``."""
    remaining = iter(good)
    number = 0
    while True:
        number += 1
        if number in bad:
            row, reason = bad[number]
            expected[number] = reason
            yield row
            continue
        try:
            yield next(remaining)
        except StopIteration:
            return


def _insert(path: Path, lines: list[str], bad: dict[int, tuple[str, str]]) -> dict[int, str]:
    expected: dict[int, str] = {}
    path.write_text("".join(f"{line}\n" for line in _merged(lines, bad, expected)), encoding="utf-8")
    return expected


def attend_as_the_worker(
    model, items: list[tuple[str, str | None]], *, max_tokens: int = 512, norms: bool = False
) -> list:
    """(result, padded width) per item, from the same padded forwards CorpusWorker makes of this batch
    (mha.corpus.worker.padded_groups), so the statistics differ only in the order of their float sums;
    norms: with attend's value norms (the worker's weighting "norm")."""
    from mha.corpus.worker import padded_groups

    limit = model.token_limit(min(max_tokens, model.info.max_tokens))
    lengths = [len(model.encoder.encode_batch([item], limit)[0].ids) for item in items]
    answers: list = [None] * len(items)
    for group in padded_groups(lengths):
        results = model.attend_batch([items[k] for k in group], max_tokens=limit, norms=norms)
        width = max(r.n for r in results)
        for k, result in zip(group, results, strict=True):
            answers[k] = (result, width)
    return answers
