"""A corpus file read as a stream of records, one at a time, never loaded whole.

The format comes from the suffix (``FORMATS``). Every record has a 1-based ``line``: the line for .txt and
.jsonl, the data record (header excluded) for .csv and .parquet. A good record has ``text`` (and maybe
``text_pair``) and ``error`` None; a bad one (blank text, invalid JSON, JSON nested too deeply, not an
object, missing or non-string text, non-string pair, bytes that are not UTF-8, a lone surrogate, a Parquet
page that cannot be decoded) has ``error`` saying why and no text. Each record is decoded and checked in
its own guard (``_guarded``), so nothing in one record's content stops the reading. A problem with the
whole file (an unknown suffix, an empty .csv, a .csv or .parquet without a ``text`` column, a file that
is not Parquet) raises ``CorpusInputError`` before any record, from ``count_records`` as from
``read_records``.
"""

from __future__ import annotations

import codecs
import csv
import hashlib
import io
import json
import re
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

__all__ = [
    "FORMATS",
    "CorpusInputError",
    "Record",
    "Tally",
    "count_records",
    "input_format",
    "read_records",
    "surrogate_problem",
]

FORMATS = {".txt": "txt", ".jsonl": "jsonl", ".csv": "csv", ".parquet": "parquet"}
_SURROGATE = re.compile("[\udc80-\udcff]")  # what surrogateescape makes of a byte that is not UTF-8
# Any lone surrogate: JSON's "\ud800" escape makes one; no UTF-8 encoder (the tokenizer's, Arrow's) takes it.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_PARQUET_BATCH = 1024  # rows per Parquet record batch read: a few hundred KiB of text at a time
# Characters kept of a text (and of its pair): 512 tokens are ~2,500 characters of English and at most a
# few times that in any script (a WordPiece or BPE token is rarely past 20 characters), so 100,000 cuts no
# text that max_tokens would keep whole, while a record's copies (worker rows, shard texts, the tokenizer's
# offsets) stay a few MB whatever the input holds.
MAX_CHARS = 100_000
ID_MAX_CHARS = 1_000  # an id longer is a bad record: per_text repeats it once per head
_UTF8_MAX = 4  # bytes of one character in UTF-8 at most


class CorpusInputError(ValueError):
    """The input as a whole cannot be read (not one bad record: those go to errors.jsonl)."""


class Record(NamedTuple):
    line: int
    id: str
    text: str | None  # None for a bad record
    text_pair: str | None
    error: str | None = None  # why the record is bad; None for a good one
    truncated: bool = False  # text or pair cut at max_chars (read_records)

    @classmethod
    def bad(cls, line: int, reason: str) -> Record:
        return cls(line, str(line), None, None, reason)


def surrogate_problem(fields: dict[str, Any]) -> str | None:
    """Why a record's string fields cannot be UTF-8 text (a lone surrogate, as JSON's "\\ud800" gives),
    or None when they can."""
    for name, value in fields.items():
        found = _LONE_SURROGATE.search(value) if isinstance(value, str) else None
        if found:
            return f"{name!r} holds a lone surrogate {ascii(found.group())} at character {found.start()}"
    return None


def input_format(path: str | Path) -> str:
    """ "txt", "jsonl", "csv" or "parquet" from the suffix; CorpusInputError for any other."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        known = ", ".join(FORMATS)
        raise CorpusInputError(f"input {Path(path).name!r}: unknown format {suffix!r}; use {known}")
    return FORMATS[suffix]


def read_records(path: str | Path, *, max_chars: int = MAX_CHARS) -> Iterator[Record]:
    """The records of ``path`` in input order (see the module docstring), each text and pair cut to
    ``max_chars`` characters (``truncated`` set when one was). A .txt line is read no further than the
    cap needs, and a Parquet cell is cut in Arrow, so their copies never scale with the input; a .jsonl
    line is parsed whole, once (JSON cannot be cut before it is parsed); a .csv field stops at csv's field
    limit (131,072 characters: a longer one is a bad record)."""
    path = Path(path)
    kind = input_format(path)
    if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 1:
        raise ValueError(f"max_chars ({max_chars!r}) must be a positive integer")
    if not path.is_file():
        raise CorpusInputError(f"input {str(path)!r} is not a file")
    if kind == "txt":
        records = _read_txt(path, max_chars)
    elif kind == "parquet":
        records = _read_parquet(path, max_chars)
    else:
        records = _read_jsonl(path) if kind == "jsonl" else _read_csv(path)
    return (_capped(record, max_chars) for record in records)


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
            records = int(_open_parquet(path, f).metadata.num_rows)  # from the footer
            if tally is not None:
                f.seek(0)
                for block in iter(lambda: f.read(1 << 20), b""):
                    tally.update(block)
            return records
        if kind == "csv":
            raw = io.BufferedReader(_Tallied(f, tally)) if tally is not None else f
            text = io.TextIOWrapper(raw, encoding="utf-8-sig", errors="surrogateescape", newline="")
            try:
                rows = csv.reader(text)
                _csv_header(path, rows)
                return sum(1 for _ in _csv_rows(rows))  # read to the end
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
    if not text or text.isspace():  # what `not text.strip()` says, without copying a long text
        return Record.bad(line, "blank text")
    if pair is not None and not isinstance(pair, str):
        return Record.bad(line, f"'text_pair' must be a string or null, got {type(pair).__name__}")
    if pair is not None and (not pair or pair.isspace()):
        return Record.bad(line, "blank text_pair")
    given = fields.get("id")
    problem = surrogate_problem({"text": text, "text_pair": pair, "id": given})
    if problem:
        return Record.bad(line, problem)
    key = str(line) if given is None else given if isinstance(given, str) else json.dumps(given)
    return Record(line, key, text, pair)


def _guarded(line: int, decode: Callable[[], Record]) -> Record:
    """``decode()``, or a bad record saying what one record's content raised there: ValueError (bytes that
    are not UTF-8, a value Python refuses) or RecursionError (nesting deeper than the stack). Other
    exceptions are the job's own faults and pass."""
    try:
        return decode()
    except UnicodeDecodeError:
        return Record.bad(line, "not UTF-8")
    except RecursionError:
        return Record.bad(line, "nested too deeply to decode")
    except ValueError as error:
        return Record.bad(line, f"unreadable record: {error}")


def _lines(path: Path, limit: int = -1) -> Iterator[tuple[int, str | None]]:
    """(line number, the line without its newline, or None when it is not UTF-8). With ``limit``, a line
    past ``limit`` bytes comes as the characters of its first ``limit`` bytes, the rest read a block at a
    time, checked and dropped: no line is held whole."""
    with path.open("rb") as f:
        number = 0
        while raw := f.readline(limit):
            number += 1
            if limit < 0 or len(raw) < limit or raw.endswith(b"\n"):
                end = len(raw) - raw.endswith(b"\n")
                end -= raw[:end].endswith(b"\r")
                try:  # decoded from a view: the line is not copied to drop its newline
                    line: str | None = str(memoryview(raw)[:end], "utf-8")
                except UnicodeDecodeError:
                    line = None
            else:
                line = _head_of_long_line(f, raw)
            del raw  # a long line's bytes go before the consumer holds its text
            yield number, line


def _head_of_long_line(f: BinaryIO, head: bytes) -> str | None:
    """The characters of ``head``, a long line's first bytes (an incomplete last character dropped),
    having read the rest of the line from ``f``; None when any of the line is not UTF-8."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        text: str | None = decoder.decode(head)
    except UnicodeDecodeError:
        text = None
    while block := f.readline(1 << 20):
        if text is not None:
            try:
                decoder.decode(block)  # checked a MiB at a time, then dropped
            except UnicodeDecodeError:
                text = None
        if block.endswith(b"\n"):
            return text
    if text is not None:
        try:
            decoder.decode(b"", final=True)  # the file ends inside a character
        except UnicodeDecodeError:
            text = None
    return text


def _read_txt(path: Path, max_chars: int) -> Iterator[Record]:
    # A line past this many bytes has more than max_chars characters, whatever its BOM and "\r":
    # only that much of it is decoded.
    for number, line in _lines(path, _UTF8_MAX * max_chars + 16):
        if line is None:
            yield Record.bad(number, "not UTF-8")
        else:
            text = line[1:] if number == 1 and line.startswith("\ufeff") else line
            yield _guarded(number, partial(_record, number, {"text": text}))


def _read_jsonl(path: Path) -> Iterator[Record]:
    for number, line in _lines(path):
        if line is None:
            yield Record.bad(number, "not UTF-8")
        else:
            yield _guarded(number, partial(_jsonl_record, number, line))


def _jsonl_record(number: int, line: str) -> Record:
    try:
        value = json.loads(line.lstrip("\ufeff") if number == 1 else line)
    except RecursionError:  # json's decoder recurses once per level: 100,000 "[" exhaust the stack
        return Record.bad(number, "invalid JSON: nested too deeply")
    except ValueError as error:
        return Record.bad(number, f"invalid JSON: {error}")
    if not isinstance(value, dict):
        return Record.bad(number, f"not a JSON object ({type(value).__name__})")
    return _record(number, value)


def _read_csv(path: Path) -> Iterator[Record]:
    # surrogateescape: bytes that are not UTF-8 survive as lone surrogates, so one bad row is flagged
    # instead of the decoder stopping the whole file.
    with path.open(encoding="utf-8-sig", errors="surrogateescape", newline="") as f:
        rows = csv.reader(f)
        header = _csv_header(path, rows)
        for number, row in enumerate(_csv_rows(rows), start=1):
            if isinstance(row, csv.Error):
                yield Record.bad(number, f"unreadable CSV row: {row}")
            elif any(_SURROGATE.search(field) for field in row):
                yield Record.bad(number, "not UTF-8")
            elif len(row) != len(header):
                yield Record.bad(number, f"{len(row)} fields where the header has {len(header)}")
            else:
                yield _guarded(number, partial(_record, number, _csv_fields(header, row)))


def _csv_header(path: Path, rows: Iterator[list[str]]) -> list[str]:
    """The header row, naming ``text``; CorpusInputError for an empty file or a header without it."""
    try:
        header = next(rows)
    except StopIteration:
        raise CorpusInputError(f"input {path.name!r}: empty CSV, no header row") from None
    except csv.Error as error:
        raise CorpusInputError(f"input {path.name!r}: unreadable CSV header ({error})") from None
    _need_text(path, header)
    return header


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


def _open_parquet(path: Path, source: str | Path | BinaryIO) -> Any:
    """A ``pyarrow.parquet.ParquetFile`` whose schema has ``text``; CorpusInputError when its footer is
    unreadable or there is no such column. Pages with a checksum are checked against it."""
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(source, page_checksum_verification=True)
    except Exception as error:  # pyarrow raises ArrowInvalid and friends for a damaged file
        raise CorpusInputError(f"input {path.name!r}: not a readable Parquet file ({error})") from None
    _need_text(path, parquet.schema_arrow.names)
    return parquet


def _read_parquet(path: Path, max_chars: int) -> Iterator[Record]:
    import pyarrow as pa

    parquet = _open_parquet(path, path)
    columns = [c for c in ("text", "text_pair", "id") if c in parquet.schema_arrow.names]
    line = 0  # the last line read
    for group in range(parquet.num_row_groups):
        end = line + parquet.metadata.row_group(group).num_rows  # the footer's count, damaged pages or not
        batches = parquet.iter_batches(batch_size=_PARQUET_BATCH, row_groups=[group], columns=columns)
        while True:
            try:
                batch = next(batches, None)
            except (OSError, pa.ArrowException) as error:  # a page that cannot be read or decoded
                # The reader cannot step over a damaged page: the rest of its row group is lost.
                reason = f"unreadable Parquet data in row group {group}: {' '.join(str(error).split())}"
                yield from (Record.bad(number, reason) for number in range(line + 1, end + 1))
                break
            if batch is None:
                break
            yield from _batch_records(line, _cut_batch(batch, max_chars), columns)
            line += batch.num_rows
        line = end


def _batch_records(line: int, batch: Any, columns: list[str]) -> Iterator[Record]:
    """The records of one Parquet record batch, whose first row is line ``line + 1``."""
    try:
        values = batch.to_pydict()
    except ValueError:  # a string that is not UTF-8 (Arrow does not check them): find it row by row
        values = None
    for i in range(batch.num_rows):
        number = line + i + 1
        fields = {c: values[c][i] for c in columns} if values is not None else None
        yield _guarded(number, partial(_row_record, number, fields, batch, i))


def _row_record(number: int, fields: dict[str, Any] | None, batch: Any, row: int) -> Record:
    """The record of a batch's row: from its converted ``fields``, else converted here, alone."""
    if fields is None:
        fields = {name: batch[name][row].as_py() for name in batch.schema.names}
    return _record(number, fields)


def _need_text(path: Path, names: list[str]) -> None:
    if "text" not in names:
        raise CorpusInputError(f"input {path.name!r} has no 'text' column (columns: {', '.join(names)})")


def _cut_batch(batch: Any, max_chars: int) -> Any:
    """A Parquet record batch with its strings cut in Arrow (one past the caps, so ``_capped`` still sees
    what was cut) before they become Python strings; as it is when Arrow cannot (bytes that are not UTF-8:
    ``_batch_records`` finds that row)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    columns = []
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            stop = (ID_MAX_CHARS if name == "id" else max_chars) + 1
            try:
                column = pc.utf8_slice_codeunits(column, 0, stop)  # code points, despite the name
            except pa.ArrowInvalid:
                return batch
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names)


def _capped(record: Record, max_chars: int) -> Record:
    """``record`` with its text and pair cut to ``max_chars`` characters each and flagged ``truncated``
    when either was (as the token cap flags a text); a bad record when its id is past ID_MAX_CHARS."""
    if record.error is not None:
        return record
    if len(record.id) > ID_MAX_CHARS:
        return Record.bad(record.line, f"'id' is longer than {ID_MAX_CHARS:,} characters")
    text, pair = record.text or "", record.text_pair
    if len(text) <= max_chars and (pair is None or len(pair) <= max_chars):
        return record
    return record._replace(
        text=text[:max_chars], text_pair=None if pair is None else pair[:max_chars], truncated=True
    )
