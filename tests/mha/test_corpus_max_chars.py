"""Memory per record is bounded: a text past max_chars is cut as it is read and flagged `truncated`, in
every input format, and examples.parquet keeps a snippet and the line, never a whole text."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mha.corpus import CorpusSettingsError, read_records, run
from mha.corpus.aggregate import SNIPPET_CHARS
from mha.corpus.source import ID_MAX_CHARS, MAX_CHARS, count_records
from mha.model import AttentionModel

CAP = 100
# Past the cap in characters, and in bytes past what the .txt reader decodes (4 bytes a character, at most):
# "é" is 2 bytes, so the cut falls inside a run of multi-byte characters.
LONG = ("naïve café " * 60)[:250] + "é" * 300
EXACT = "x" * CAP  # at the cap: kept whole, not flagged
PAIR = "p" * (CAP + 1)


def write(path: Path, rows: list[dict[str, str | None]]) -> None:
    """`rows` ({"text", "text_pair"}) in the format of `path`'s suffix (.txt takes the text only)."""
    kind = path.suffix
    if kind == ".txt":
        path.write_text("".join(f"{row['text']}\n" for row in rows), encoding="utf-8")
    elif kind == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    elif kind == ".csv":
        with path.open("w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["text", "text_pair"])
            writer.writerows([row["text"], row["text_pair"] or ""] for row in rows)
    else:
        columns = {name: [row[name] for row in rows] for name in ("text", "text_pair")}
        pq.write_table(
            pa.table(columns, schema=pa.schema([("text", pa.string()), ("text_pair", pa.string())])), path
        )


@pytest.mark.parametrize("kind", ["txt", "jsonl", "csv", "parquet"])
def test_a_text_past_max_chars_is_cut_and_flagged_in_every_format(kind: str, tmp_path: Path) -> None:
    path = tmp_path / f"c.{kind}"
    rows = [
        {"text": "short", "text_pair": None},
        {"text": LONG, "text_pair": None},
        {"text": EXACT, "text_pair": None},
        {"text": "with a pair", "text_pair": PAIR},
    ]
    write(path, rows)
    records = list(read_records(path, max_chars=CAP))
    assert [r.error for r in records] == [None] * 4
    assert [r.text for r in records] == ["short", LONG[:CAP], EXACT, "with a pair"]
    assert [r.truncated for r in records[:3]] == [False, True, False]
    if kind != "txt":  # .txt has no pair
        assert (records[3].text_pair, records[3].truncated) == (PAIR[:CAP], True)
    assert count_records(path) == 4


def test_a_long_text_line_is_read_no_further_than_the_cap(tmp_path: Path) -> None:
    """Past the bytes the cap needs, a .txt line is checked a block at a time and dropped: a BOM, a CRLF,
    a character cut by the byte limit, bad bytes beyond the cut, a file that ends inside a character."""
    path = tmp_path / "c.txt"
    lines = [
        b"\xef\xbb\xbf" + "é".encode() * 1000 + b"\r\n",  # a BOM, then 2,000 bytes
        b"a" * 999 + b"\r\n",  # decoded only up to the byte limit
        b"ok\n",
        b"b" * 2000 + b"\xff" + b"c" * 10 + b"\n",  # not UTF-8 far past the cut
        "€".encode() * 700 + b"\n",  # 3-byte characters: the byte limit falls inside one
        b"d" * 5000 + "€".encode()[:2],  # the file ends inside a character
    ]
    path.write_bytes(b"".join(lines))
    records = list(read_records(path, max_chars=200))
    assert [(r.line, r.error) for r in records] == [(k, None) for k in (1, 2, 3)] + [
        (4, "not UTF-8"),
        (5, None),
        (6, "not UTF-8"),
    ]
    assert [r.text for r in records[:3]] == ["é" * 200, "a" * 200, "ok"]
    assert records[4].text == "€" * 200
    assert [r.truncated for r in records] == [True, True, False, False, True, False]
    assert count_records(path) == 6


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_an_id_past_its_cap_is_a_bad_record(kind: str, tmp_path: Path) -> None:
    path = tmp_path / f"c.{kind}"
    ids = ["a", "i" * (ID_MAX_CHARS + 1)]
    if kind == "jsonl":
        path.write_text("".join(json.dumps({"id": i, "text": "fine"}) + "\n" for i in ids))
    else:
        pq.write_table(pa.table({"id": ids, "text": ["fine", "fine"]}), path)
    records = list(read_records(path))
    assert (records[0].id, records[0].error) == ("a", None)
    assert records[1].error == f"'id' is longer than {ID_MAX_CHARS:,} characters"


@pytest.mark.parametrize("value", [0, -1, True, 1.5])
def test_max_chars_must_be_a_positive_integer(value: object, tmp_path: Path) -> None:
    path = tmp_path / "c.txt"
    path.write_text("a\n")
    with pytest.raises(ValueError, match="max_chars"):
        read_records(path, max_chars=value)  # type: ignore[arg-type]


def test_the_default_cap_is_far_above_512_tokens() -> None:
    # MiniLM's WordPiece: 512 tokens of plain English are ~2,500 characters; the default leaves 40x that.
    assert MAX_CHARS >= 40 * 2_500


@pytest.mark.parametrize("kind", ["txt", "jsonl"])
def test_a_run_cuts_and_flags_a_record_past_max_chars(
    kind: str, minilm: AttentionModel, tmp_path: Path
) -> None:
    """The record cut at max_chars is measured on its first max_chars characters and flagged truncated, as
    one cut at max_tokens; its shard keeps the cut text (the page's texts route); examples keep snippets
    of SNIPPET_CHARS and the line; run.json's settings carry the cap."""
    long = " ".join(f"word{k}" for k in range(400))  # ~2,700 characters, ~1,200 tokens uncut
    cap = 1000  # cut to ~140 words: under 512 tokens, so only the character cap cuts it
    short = ["The cat sat on the mat.", "Paris is the capital of France.", "Heads look back."]
    source = tmp_path / f"c.{kind}"
    write(source, [{"text": t, "text_pair": None} for t in [short[0], long, *short[1:]]])
    summary = run(source, minilm, tmp_path / "out", max_chars=cap, device="cpu")
    out = tmp_path / "out"

    assert summary["settings"]["max_chars"] == cap
    assert json.loads((out / "run.json").read_text())["settings"]["max_chars"] == cap
    assert summary["counts"]["truncated"] == 1 and summary["counts"]["texts"] == 4

    per_text = pq.read_table(out / "per_text.parquet").to_pydict()
    heads = 6 * 12
    assert per_text["line"][::heads] == [1, 2, 3, 4]
    assert per_text["truncated"][::heads] == [False, True, False, False]
    cut_tokens = len(minilm.encoder.encode_batch([(long[:cap], None)], 512)[0].ids)
    assert per_text["n_tokens"][heads] == cut_tokens < 512

    texts = pq.read_table(out / "shards" / "00000.texts.parquet").to_pydict()
    assert texts["text"] == [short[0], long[:cap], *short[1:]]

    examples = pq.read_table(out / "examples.parquet")
    assert examples.schema.names[-4:] == ["line", "snippet", "snippet_pair", "cut"]
    rows = examples.to_pydict()
    by_line = {1: short[0], 2: long[:cap], 3: short[1], 4: short[2]}
    assert {len(s) for s in rows["snippet"]} <= {SNIPPET_CHARS, *map(len, short)}
    for line, snippet, pair, cut in zip(
        rows["line"], rows["snippet"], rows["snippet_pair"], rows["cut"], strict=True
    ):
        assert snippet == by_line[line][:SNIPPET_CHARS] and pair is None
        assert cut is (line == 2)
    assert 2 in rows["line"]  # the long text is an example somewhere: its snippet was checked

    # Another cap is another run, refused as any other settings change.
    with pytest.raises(CorpusSettingsError, match=rf"settings\.max_chars {cap} there, {2 * cap} now"):
        run(source, minilm, out, max_chars=2 * cap, device="cpu")
