"""mha.corpus.source: each format streamed as records, bad rows kept with their line and reason."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import pytest
from corpus_files import WRITERS, texts

from mha.corpus.job import Job
from mha.corpus.source import CorpusInputError, count_records, read_records


@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_each_format_gives_the_texts_and_the_bad_rows(kind: str, tmp_path: Path) -> None:
    items = texts(20)
    path = tmp_path / f"corpus.{kind}"
    expected_bad = WRITERS[kind](path, items)
    records = list(read_records(path))
    assert [r.line for r in records] == list(range(1, len(items) + len(expected_bad) + 1))
    assert count_records(path) == len(records)
    found = {r.line: r.error for r in records if r.error is not None}
    assert sorted(found) == sorted(expected_bad)
    assert all(found[line].startswith(reason) for line, reason in expected_bad.items()), found  # + detail
    good = [r for r in records if r.error is None]
    pairs = [(t, p) for t, p in items] if kind != "txt" else [(t, None) for t, _ in items]
    assert [(r.text, r.text_pair) for r in good] == pairs
    if kind == "txt":  # no id field: the line
        assert [r.id for r in good] == [str(r.line) for r in good]
    elif kind == "parquet":  # an integer id, stringified
        assert [r.id for r in good] == [str(i) for i in range(len(items))]
    else:
        assert [r.id for r in good] == [f"t{i}" for i in range(len(items))]


def test_text_lines_keep_their_content_and_flag_bad_bytes(tmp_path: Path) -> None:
    path = tmp_path / "c.txt"
    path.write_bytes(b"\xef\xbb\xbffirst\r\nsecond  \n\xff bad\nlast without newline")  # a BOM, CRLF, no end
    records = list(read_records(path))
    assert [(r.line, r.text, r.error) for r in records] == [
        (1, "first", None),
        (2, "second  ", None),
        (3, None, "not UTF-8"),
        (4, "last without newline", None),
    ]
    assert count_records(path) == 4


def test_csv_quoted_newlines_and_bad_bytes(tmp_path: Path) -> None:
    path = tmp_path / "c.csv"
    path.write_bytes(b'text,id\n"two\nlines",a\n\xff,b\nplain,\n')
    records = list(read_records(path))
    assert [(r.line, r.id, r.text, r.error) for r in records] == [
        (1, "a", "two\nlines", None),
        (2, "2", None, "not UTF-8"),
        (3, "3", "plain", None),
    ]
    assert count_records(path) == 3


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("c.xml", b"<a/>", "unknown format '.xml'"),
        ("c.csv", b"title,id\nx,1\n", "no 'text' column"),
        ("c.csv", b"", "empty CSV"),
        ("c.parquet", b"not parquet", "not a readable Parquet file"),
    ],
)
def test_a_file_that_cannot_be_read_as_a_whole_is_refused(
    tmp_path: Path, name: str, content: bytes, message: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(CorpusInputError, match=message):
        list(read_records(path))


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CorpusInputError, match="is not a file"):
        read_records(tmp_path / "missing.jsonl")


@pytest.mark.parametrize("kind", sorted(WRITERS))
@pytest.mark.parametrize("copies", [1, 3000])  # 3,000 copies: well past the 1 MiB blocks and CSV's buffer
def test_the_count_and_the_hash_come_from_one_read(
    kind: str, copies: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / f"corpus.{kind}"
    WRITERS[kind](path, texts(20) * copies)
    opened: list[object] = []
    real_open = io.open

    def counting_open(file: object, *args: object, **kwargs: object) -> object:
        if isinstance(file, (str, Path)) and Path(file) == path:
            opened.append(file)
        return real_open(file, *args, **kwargs)  # type: ignore[call-overload]

    expected = {
        "records": count_records(path),
        "input_bytes": path.stat().st_size,
        "input_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }
    monkeypatch.setattr(io, "open", counting_open)
    assert Job.survey(path) == expected
    assert len(opened) == 1
    assert expected["input_bytes"] > (2 << 20 if copies > 1 else 0)
