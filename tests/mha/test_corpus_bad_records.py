"""No record stops a corpus job: lone surrogates, JSON nested past the stack, damaged Parquet pages and
strings the tokenizer raises on each become a line of errors.jsonl, in every input format where they can
occur, and the job goes on."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mha.corpus import CorpusWorker, read_records, run
from mha.corpus.source import count_records
from mha.model import AttentionModel

DEEP = 100_000  # nesting levels: far past Python's recursion limit (1,000), which json's decoder obeys
NESTED = "invalid JSON: nested too deeply"
NOT_UTF8 = "not UTF-8"
SURROGATE = b"\xed\xa0\x80"  # U+D800 as UTF-8 would spell it: a sequence UTF-8 forbids


def write_jsonl(path: Path) -> dict[int, str]:
    """Lone surrogates (JSON's escapes) in each field and three deep nestings among good lines; returns
    line -> the reason expected."""
    lines = [
        json.dumps({"text": "The first good line."}),
        '{"text": "a \\ud800 b"}',
        '{"text": "fine", "text_pair": "\\udfff"}',
        '{"text": "fine", "id": "x\\udbff"}',
        "[" * DEEP + "]" * DEEP,
        '{"a": ' * DEEP + "1" + "}" * DEEP,
        '{"text": "fine", "meta": ' + "[" * DEEP + "]" * DEEP + "}",  # deep inside a field's value
        json.dumps({"text": "The last good line."}),
    ]
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return {
        2: "'text' holds a lone surrogate '\\ud800' at character 2",
        3: "'text_pair' holds a lone surrogate '\\udfff' at character 0",
        4: "'id' holds a lone surrogate '\\udbff' at character 1",
        5: NESTED,
        6: NESTED,
        7: NESTED,
    }


def write_txt(path: Path) -> dict[int, str]:
    path.write_bytes(b"The first good line.\na " + SURROGATE + b" b\nThe last good line.\n")
    return {2: NOT_UTF8}


def write_csv(path: Path) -> dict[int, str]:
    """A surrogate's bytes in a text and in an id (read with surrogateescape, then flagged)."""
    path.write_bytes(
        b"text,id\nThe first good line.,a\na " + SURROGATE + b" b,b\nfine,c" + SURROGATE + b"\n"
        b"The last good line.,d\n"
    )
    return {2: NOT_UTF8, 3: NOT_UTF8}


def write_parquet(path: Path) -> dict[int, str]:
    """Three row groups of four texts: a surrogate's bytes in line 10 (Arrow writes strings unchecked),
    and the data page of row group 1 (lines 5-8) overwritten, its footer intact."""
    texts = [f"Text number {k} of the file.".encode() for k in range(12)]
    texts[9] = b"a " + SURROGATE + b" b"
    offsets = np.cumsum([0, *map(len, texts)]).astype(np.int32)
    column = pa.Array.from_buffers(
        pa.string(), len(texts), [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"".join(texts))]
    )
    pq.write_table(pa.table({"text": column}), path, row_group_size=4)
    chunk = pq.ParquetFile(path).metadata.row_group(1).column(0)
    data = bytearray(path.read_bytes())
    start = chunk.data_page_offset
    end = (chunk.dictionary_page_offset or start) + chunk.total_compressed_size
    data[start:end] = b"\xff" * (end - start)
    path.write_bytes(bytes(data))
    damaged = "unreadable Parquet data in row group 1: "
    return {5: damaged, 6: damaged, 7: damaged, 8: damaged, 10: NOT_UTF8}


WRITERS = {"jsonl": write_jsonl, "txt": write_txt, "csv": write_csv, "parquet": write_parquet}


@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_each_bad_record_is_one_error_line(kind: str, tmp_path: Path) -> None:
    path = tmp_path / f"corpus.{kind}"
    expected = WRITERS[kind](path)
    records = list(read_records(path))
    assert count_records(path) == len(records)
    assert [r.line for r in records] == list(range(1, len(records) + 1))
    found = {r.line: r.error for r in records if r.error is not None}
    assert sorted(found) == sorted(expected)
    for line, reason in expected.items():
        assert found[line].startswith(reason), (line, found[line])  # the pyarrow message follows
    assert all(r.text is not None and r.text.strip() for r in records if r.error is None)


@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_the_job_goes_on_past_every_bad_record(kind: str, minilm: AttentionModel, tmp_path: Path) -> None:
    """Through mha.corpus.run: every bad record in errors.jsonl with its reason, every other record
    measured, the run complete."""
    path = tmp_path / f"corpus.{kind}"
    expected = WRITERS[kind](path)
    records = count_records(path)
    summary = run(path, minilm, tmp_path / "out", batch=3, shard_size=5)
    assert summary["complete"] is True
    assert summary["counts"]["errors"] == len(expected)
    assert summary["counts"]["texts"] == records - len(expected)
    errors = [json.loads(line) for line in (tmp_path / "out" / "errors.jsonl").read_text().splitlines()]
    assert [e["line"] for e in errors] == sorted(expected)
    assert all(e["reason"].startswith(expected[e["line"]]) for e in errors), errors
    lines = set(pq.read_table(tmp_path / "out" / "per_text.parquet", columns=["line"])["line"].to_pylist())
    assert lines == set(range(1, records + 1)) - set(expected)


def test_a_checksummed_page_that_changed_is_caught(tmp_path: Path) -> None:
    """One bit flipped in a page's data, which decodes without complaint; its CRC (written by
    write_page_checksum) is checked, so its row group is flagged instead of read wrong."""
    path = tmp_path / "c.parquet"
    pq.write_table(
        pa.table({"text": [f"Text number {k}." for k in range(12)]}),
        path,
        row_group_size=4,
        write_page_checksum=True,
    )
    chunk = pq.ParquetFile(path).metadata.row_group(2).column(0)
    data = bytearray(path.read_bytes())
    data[(chunk.dictionary_page_offset or chunk.data_page_offset) + chunk.total_compressed_size - 3] ^= 1
    path.write_bytes(bytes(data))
    records = list(read_records(path))
    assert [r.line for r in records if r.error is None] == list(range(1, 9))
    assert all("CRC checksum verification failed" in str(r.error) for r in records[8:])


def test_the_worker_makes_a_bad_row_of_what_fails_one_record(
    minilm: AttentionModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records handed to CorpusWorker directly (not through read_records): lone surrogates in each field,
    and a text the tokenizer raises TypeError on, as Hugging Face's does for a string it cannot take,
    are bad rows; the batch's other records are measured."""
    worker = CorpusWorker(minilm)
    real = minilm.encoder.encode_batch

    def encode_batch(pairs, limit, **options):
        if pairs[0][0] == "explodes":
            raise TypeError("TextEncodeInput must be Union[TextInputSequence, Tuple[InputSequence, ...]]")
        return real(pairs, limit, **options)

    monkeypatch.setattr(minilm.encoder, "encode_batch", encode_batch)
    batch = {
        "line": [1, 2, 3, 4, 5],
        "id": ["a", "b", "c\ud800", "d", "e"],
        "text": ["Good one.", "a \ud800 b", "Fine.", "explodes", "Good too."],
        "text_pair": [None, None, None, None, "pair \udc80"],
    }
    rows = worker(batch).to_pydict()
    assert rows["error"] == [
        None,
        "'text' holds a lone surrogate '\\ud800' at character 2",
        "'id' holds a lone surrogate '\\ud800' at character 1",
        "the tokenizer failed on it (TypeError: TextEncodeInput must be Union[TextInputSequence, "
        "Tuple[InputSequence, ...]])",
        "'text_pair' holds a lone surrogate '\\udc80' at character 5",
    ]
    assert rows["id"] == ["a", "b", "3", "d", "e"]  # an id Arrow cannot hold becomes the line
    assert rows["n_tokens"][0] > 0 and rows["n_tokens"][1:] == [0, 0, 0, 0]
    assert not np.isnan(rows["entropy"][0]).any() and np.isnan(rows["entropy"][3]).all()


def test_the_worker_passes_a_fault_of_the_job(
    minilm: AttentionModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception no record's content causes (here AttributeError) is a fault of the code, not a bad
    record: it ends the batch instead of hiding among the errors."""
    worker = CorpusWorker(minilm)

    def broken(*args, **kwargs):
        raise AttributeError("'Encoder' object has no attribute 'vocab'")

    monkeypatch.setattr(minilm.encoder, "encode_batch", broken)
    batch = {"line": [1], "id": ["a"], "text": ["Good one."], "text_pair": [None]}
    with pytest.raises(AttributeError, match="no attribute 'vocab'"):
        worker(batch)
