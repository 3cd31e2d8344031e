"""A corpus file read as a stream of records, one at a time, never loaded whole.

The format comes from the suffix (``FORMATS``). Every record has a 1-based ``line``: the line for .txt and
.jsonl, the data record (header excluded) for .csv and .parquet. A good record has ``text`` (and maybe
``text_pair``) and ``error`` None; a bad one (blank text, invalid JSON, not an object, missing or
non-string text, non-string pair) has ``error`` saying why and no text. A problem with the whole file (an
unknown suffix, a .csv or .parquet without a ``text`` column) raises ``CorpusInputError`` before any
record.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

__all__ = ["FORMATS", "CorpusInputError", "Record", "Tally", "count_records", "input_format", "read_records"]

FORMATS = {".txt": "txt", ".jsonl": "jsonl", ".csv": "csv", ".parquet": "parquet"}
_SURROGATE = re.compile("[\udc80-\udcff]")  # what surrogateescape makes of a byte that is not UTF-8
_PARQUET_BATCH = 1024  # rows per Parquet record batch read: a few hundred KiB of text at a time


class CorpusInputError(ValueError):
    """The input as a whole cannot be read (not one bad record: those go to errors.jsonl)."""


class Record(NamedTuple):
    line: int
    id: str
    text: str | None  # None for a bad record
    text_pair: str | None
    error: str | None = None  # why the record is bad; None for a good one

    @classmethod
    def bad(cls, line: int, reason: str) -> Record:
        return cls(line, str(line), None, None, reason)


def input_format(path: str | Path) -> str:
    """ "txt", "jsonl", "csv" or "parquet" from the suffix; CorpusInputError for any other."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        known = ", ".join(FORMATS)
        raise CorpusInputError(f"input {Path(path).name!r}: unknown format {suffix!r}; use {known}")
    return FORMATS[suffix]


def read_records(path: str | Path) -> Iterator[Record]:
    """The records of ``path`` in input order (see the module docstring)."""
    path = Path(path)
    kind = input_format(path)
    if not path.is_file():
        raise CorpusInputError(f"input {str(path)!r} is not a file")
    readers = {"txt": _read_txt, "jsonl": _read_jsonl, "csv": _read_csv, "parquet": _read_parquet}
    return readers[kind](path)


class Tally:
    """What one read of a file saw: its bytes' SHA-256 and their number."""

    def __init__(self) -> None:
        self.sha256 = hashlib.sha256()
        self.bytes = 0

    def update(self, block: bytes | memoryview) -> None:
        self.sha256.update(block)
        self.bytes += len(block)


class _Tallied(io.RawIOBase):
    """A binary file whose every byte read also goes to a Tally (the CSV count hashes what it parses)."""

    def __init__(self, raw: BinaryIO, tally: Tally) -> None:
        self.raw, self.tally = raw, tally

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        count = self.raw.readinto(buffer)  # type: ignore[attr-defined]  # a buffered binary file has it
        self.tally.update(memoryview(buffer)[:count])
        return int(count)


def count_records(path: str | Path, tally: Tally | None = None) -> int:
    """How many records ``path`` holds (the last record's ``line``), without decoding a text: newlines
    for .txt and .jsonl, parsed rows for .csv (a quoted field may hold newlines), Parquet's row count.
    With ``tally``, every byte of the file also goes to it, on the same read: one pass gives the count
    and the hash a resume checks."""
    path = Path(path)
    kind = input_format(path)
    with path.open("rb") as f:
        if kind == "parquet":
            import pyarrow.parquet as pq

            records = int(pq.ParquetFile(f).metadata.num_rows)  # from the footer
            if tally is not None:
                f.seek(0)
                for block in iter(lambda: f.read(1 << 20), b""):
                    tally.update(block)
            return records
        if kind == "csv":
            raw = io.BufferedReader(_Tallied(f, tally)) if tally is not None else f
            text = io.TextIOWrapper(raw, encoding="utf-8-sig", errors="surrogateescape", newline="")
            try:
                return max(sum(1 for _ in _csv_rows(csv.reader(text))) - 1, 0)  # read to the end
            finally:
                text.detach()  # `with` closes f
        lines = 0
        last = b"\n"
        for block in iter(lambda: f.read(1 << 20), b""):
            lines += block.count(b"\n")
            last = block[-1:]
            if tally is not None:
                tally.update(block)
    return lines + (last != b"\n")  # a last line without a newline counts too


def _record(line: int, fields: dict[str, Any]) -> Record:
    """A record from a row's fields, or a bad one saying what is wrong with them."""
    if "text" not in fields or fields["text"] is None:
        return Record.bad(line, "missing field 'text'")
    text, pair = fields["text"], fields.get("text_pair")
    if not isinstance(text, str):
        return Record.bad(line, f"'text' must be a string, got {type(text).__name__}")
    if not text.strip():
        return Record.bad(line, "blank text")
    if pair is not None and not isinstance(pair, str):
        return Record.bad(line, f"'text_pair' must be a string or null, got {type(pair).__name__}")
    if pair is not None and not pair.strip():
        return Record.bad(line, "blank text_pair")
    given = fields.get("id")
    key = str(line) if given is None else given if isinstance(given, str) else json.dumps(given)
    return Record(line, key, text, pair)


def _lines(path: Path) -> Iterator[tuple[int, str | None]]:
    """(line number, the line without its newline, or None when it is not UTF-8)."""
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                yield number, raw.decode("utf-8").removesuffix("\n").removesuffix("\r")
            except UnicodeDecodeError:
                yield number, None


def _read_txt(path: Path) -> Iterator[Record]:
    for number, line in _lines(path):
        if line is None:
            yield Record.bad(number, "not UTF-8")
        elif number == 1 and line.startswith("\ufeff"):
            yield _record(number, {"text": line[1:]})
        else:
            yield _record(number, {"text": line})


def _read_jsonl(path: Path) -> Iterator[Record]:
    for number, line in _lines(path):
        if line is None:
            yield Record.bad(number, "not UTF-8")
            continue
        try:
            value = json.loads(line.lstrip("\ufeff") if number == 1 else line)
        except ValueError as error:
            yield Record.bad(number, f"invalid JSON: {error}")
            continue
        if not isinstance(value, dict):
            yield Record.bad(number, f"not a JSON object ({type(value).__name__})")
            continue
        yield _record(number, value)


def _read_csv(path: Path) -> Iterator[Record]:
    # surrogateescape: bytes that are not UTF-8 survive as lone surrogates, so one bad row is flagged
    # instead of the decoder stopping the whole file.
    with path.open(encoding="utf-8-sig", errors="surrogateescape", newline="") as f:
        rows = csv.reader(f)
        try:
            header = next(rows)
        except StopIteration:
            raise CorpusInputError(f"input {path.name!r}: empty CSV, no header row") from None
        _need_text(path, header)
        for number, row in enumerate(_csv_rows(rows), start=1):
            if isinstance(row, csv.Error):
                yield Record.bad(number, f"unreadable CSV row: {row}")
            elif any(_SURROGATE.search(field) for field in row):
                yield Record.bad(number, "not UTF-8")
            elif len(row) != len(header):
                yield Record.bad(number, f"{len(row)} fields where the header has {len(header)}")
            else:
                yield _record(number, _csv_fields(header, row))


def _csv_rows(rows: Iterator[list[str]]) -> Iterator[list[str] | csv.Error]:
    """Each row, or the error that one row raised (the reader goes on after it)."""
    while True:
        try:
            yield next(rows)
        except StopIteration:
            return
        except csv.Error as error:
            yield error


def _csv_fields(header: list[str], row: list[str]) -> dict[str, Any]:
    fields: dict[str, Any] = dict(zip(header, row, strict=True))
    # CSV has no null: an empty pair or id is an absent one.
    for optional in ("text_pair", "id"):
        if fields.get(optional) == "":
            fields[optional] = None
    return fields


def _read_parquet(path: Path) -> Iterator[Record]:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except Exception as error:  # pyarrow raises ArrowInvalid and friends for a damaged file
        raise CorpusInputError(f"input {path.name!r}: not a readable Parquet file ({error})") from None
    names = parquet.schema_arrow.names
    _need_text(path, names)
    columns = [c for c in ("text", "text_pair", "id") if c in names]
    number = 0
    for batch in parquet.iter_batches(batch_size=_PARQUET_BATCH, columns=columns):
        values = batch.to_pydict()
        for i in range(batch.num_rows):
            number += 1
            yield _record(number, {c: values[c][i] for c in columns})


def _need_text(path: Path, names: list[str]) -> None:
    if "text" not in names:
        raise CorpusInputError(f"input {path.name!r} has no 'text' column (columns: {', '.join(names)})")
