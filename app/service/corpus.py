"""Finished corpus runs (`headscope corpus`, mha.corpus) read back for the page, from HEADSCOPE_RUNS_DIR.

Read-only, and a request never names a path: a run is one subfolder's name, checked as the listing checks
it (app/service/corpus_listing.py: real subfolders of the runs folder, symlinks leading out of it left out,
whose run.json says complete), so "..", "a/b", absolute paths and links out of the folder are unknown runs
(404), and a run.json field of the wrong type is a 409 naming it. The files are the contract of
docs/design.md "Corpus runs". Files are read and answers encoded in a worker thread; run.json and the
answers are kept in a small LRU keyed by the files' (size, mtime): a run rewritten in place is read
afresh, an unchanged one once.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from anyio import to_thread

from app.cache import LRUCache
from app.errors import InvalidInputError, ServiceError
from app.schemas.corpus import RunMeta
from app.service.corpus_listing import FILES, RUNS_DIR_HINT, RunListing, find, inside, summary
from mha.analysis import STAT_DESCRIPTIONS
from mha.corpus import shard_of, shard_path, snippets

logger = logging.getLogger(__name__)

CACHE_ENTRIES = 64  # run.json files and the answers of the runs being looked at
CACHE_BYTES = 64 * 2**20


class UnknownRunError(ServiceError):
    status = 404

    def __init__(self, name: str, known: Collection[str], *, configured: bool = True) -> None:
        if not configured:
            super().__init__(f"no corpus runs are served here: {RUNS_DIR_HINT}")
            return
        names = ", ".join(sorted(known)) or "none"
        # repr() so a name with quotes, slashes or newlines is shown, not interpreted.
        super().__init__(f"unknown corpus run {name[:100]!r}; finished runs: {names}")


class UnreadableRunError(ServiceError):
    """A listed run whose files cannot be read (being rewritten, or damaged): the operator's to fix."""

    status = 409


class NoTextError(ServiceError):
    """A line of the run that holds no text: beyond its records, or a bad record."""

    status = 404


def finite(value: Any) -> Any:
    """JSON has no NaN or infinity: such a float (an empty statistic) becomes null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [finite(item) for item in value]
    return value


class CorpusRuns:
    """The runs of one folder (None: none configured). `served()` names the models this server runs."""

    def __init__(self, root: Path | None, *, served: Callable[[], Collection[str]]) -> None:
        self.root = root
        self.served = served
        self.cache = LRUCache(max_entries=CACHE_ENTRIES, max_bytes=CACHE_BYTES)
        self.listed = RunListing(root) if root is not None else None

    @property
    def configured(self) -> bool:
        return self.root is not None

    # -- from a name to a folder: one folder checked as the listing checks each ----------------------

    def _run(self, name: str) -> tuple[Path, dict[str, Any]]:
        found = None
        if self.root is not None:
            try:
                found = find(self.root.resolve(strict=True), name, self.cache)
            except OSError:
                found = None  # the runs folder is gone: no run is there
        if found is None:
            known = self.listed.names() if self.listed is not None else []
            raise UnknownRunError(name, known, configured=self.configured)
        if found.problem is not None:
            raise UnreadableRunError(
                f"corpus run {name[:100]!r}: run.json breaks the format: {found.problem}"
            )
        return found.folder, found.meta

    # -- answers (each runs in a worker thread) -----------------------------------------------------

    # Each is read and encoded to JSON in a worker thread: a head's values may be 100,000 numbers.

    async def listing(self) -> bytes:
        return await to_thread.run_sync(self._listing)

    async def run(self, name: str) -> bytes:
        return await to_thread.run_sync(self._kept, self._run_answer, name)

    async def head(self, name: str, layer: int, head: int, stat: str) -> bytes:
        return await to_thread.run_sync(self._kept, self._head_answer, name, layer, head, stat)

    async def text(self, name: str, line: int) -> bytes:
        return await to_thread.run_sync(self._kept, self._text_answer, name, line)

    def _kept(self, answer: Callable[..., dict[str, Any]], name: str, *args: Any) -> bytes:
        """`answer(name, folder, meta, *args)` as JSON, through the LRU keyed by the run's files as they are
        now (a head of 20,000 texts: ~240 ms read and encoded, then ~1 ms; benchmarks/corpus_view.py)."""
        folder, meta = self._run(name)
        try:
            stamps = tuple(_stamp(folder / file) for file in FILES)
        except OSError as error:
            raise UnreadableRunError(f"corpus run {name!r} cannot be read ({error})") from error
        key = ("answer", answer.__name__, name, *args, stamps)
        body = self.cache.get(key)
        if body is None:
            body = _readable(answer, name, folder, meta, *args)
            self.cache.put(key, body, size=len(body))
        return body

    def _listing(self) -> bytes:
        """The list, kept by RunListing between requests (a folder is read again when it changes)."""
        if self.listed is None:
            return json.dumps({"configured": False, "hint": RUNS_DIR_HINT, "runs": []}).encode()
        return self.listed.body(self.served())

    @staticmethod
    def _summary(name: str, meta: dict[str, Any], served: Collection[str]) -> dict[str, Any]:
        """What the list says of a run (run.json checked by `_run` first)."""
        return summary(name, RunMeta.model_validate(meta), served)

    def _run_answer(self, name: str, folder: Path, meta: dict[str, Any]) -> dict[str, Any]:
        table = self._table(folder, "per_head.parquet")
        order = pc.sort_indices(table, sort_keys=[("layer", "ascending"), ("head", "ascending")])
        columns = table.take(order).to_pydict()
        summary = self._summary(name, meta, set(self.served()))
        descriptions = {stat: STAT_DESCRIPTIONS.get(stat, "") for stat in summary["stats"]}
        return finite({**summary, "run": meta, "stat_descriptions": descriptions, "per_head": columns})

    def _head_answer(
        self, name: str, folder: Path, meta: dict[str, Any], layer: int, head: int, stat: str
    ) -> dict[str, Any]:
        summary = self._summary(name, meta, ())
        stats = summary["stats"]
        if stat not in stats:
            raise InvalidInputError(f"unknown statistic {stat[:100]!r}; this run has: {', '.join(stats)}")
        for what, index, count in (("layer", layer, summary["layers"]), ("head", head, summary["heads"])):
            if isinstance(count, int) and index >= count:
                raise InvalidInputError(
                    f"{what} {index} out of range: the run's model has {count} {what}s (0..{count - 1})"
                )
        where = (pc.field("layer") == layer) & (pc.field("head") == head)
        # A detection score's absent values (null: the text has no repeated token) are no point of its
        # distribution, as its mean leaves them out (mha.corpus.aggregate).
        present = where & pc.field(stat).is_valid()
        texts = self._table(folder, "per_text.parquet", columns=("id", "line", stat), where=present)
        texts = texts.take(pc.sort_indices(texts, sort_keys=[("line", "ascending")]))
        examples = self._table(folder, "examples.parquet", where=where & (pc.field("stat") == stat))
        examples = examples.take(pc.sort_indices(examples, sort_keys=[("rank", "ascending")]))
        rows = _example_rows(examples)
        return finite(
            {
                "name": name,
                "layer": layer,
                "head": head,
                "stat": stat,
                "values": texts.column(stat).to_pylist(),
                "ids": texts.column("id").to_pylist(),
                "lines": texts.column("line").to_pylist(),
                "top": [row for row in rows if row["side"] == "top"],
                "bottom": [row for row in rows if row["side"] == "bottom"],
            }
        )

    def _text_answer(self, name: str, folder: Path, meta: dict[str, Any], line: int) -> dict[str, Any]:
        """One text of the run by its line, from the shard that kept it (shards/NNNNN.texts.parquet): a
        point of the distribution opens on demand, so a head's answer need not carry 20,000 texts."""
        run = RunMeta.model_validate(meta)  # checked by _run: shard_size >= 1, records >= 0
        records = run.counts.records
        if line > records:
            raise NoTextError(f"corpus run {name!r} has {records} records; there is no line {line}")
        shard = shard_of(line, run.settings.shard_size)
        file = str(shard_path(folder, shard, ".texts.parquet").relative_to(folder))
        if not inside(folder / file, folder.resolve()):
            detail = f"{file} is missing or lies outside the run, so its texts cannot be read"
            raise UnreadableRunError(f"corpus run {name!r}: {detail}")
        rows = self._table(folder, file, where=pc.field("line") == line).to_pylist()
        if not rows:
            raise NoTextError(
                f"line {line} of corpus run {name!r} is a bad record (errors.jsonl), not a text"
            )
        row = rows[0]
        return finite(
            {"name": name, "line": line, "id": row["id"], "text": row["text"], "text_pair": row["text_pair"]}
        )

    @staticmethod
    def _table(
        folder: Path, file: str, *, columns: tuple[str, ...] | None = None, where: pc.Expression | None = None
    ) -> pa.Table:
        """A Parquet file of a run, the rows `where` keeps (the answers built from it are kept, not it)."""
        try:
            return pq.read_table(folder / file, columns=list(columns) if columns else None, filters=where)
        except (OSError, pa.ArrowException) as error:
            detail = f"corpus run {folder.name!r}: {file} cannot be read ({error})"
            raise UnreadableRunError(detail) from error


def _example_rows(examples: pa.Table) -> list[dict[str, Any]]:
    """examples.parquet's rows as the head's answer gives them: side, rank, value, id, line, snippet,
    snippet_pair, cut. A run of the first format (run.json "format": 1) kept whole texts in `text` and
    `text_pair`: their snippets are cut here, so such a run still opens (the page reads a whole text by
    its line either way)."""
    names = examples.schema.names
    if "snippet" not in names and "text" in names and "text_pair" in names:
        cut = snippets(examples["text"], examples["text_pair"])
        for name, column in zip(("snippet", "snippet_pair", "cut"), cut, strict=True):
            examples = examples.append_column(name, column)
    columns = ["side", "rank", "value", "id", "line", "snippet", "snippet_pair", "cut"]
    return examples.select(columns).to_pylist()


def _readable(answer: Callable[..., dict[str, Any]], name: str, *args: Any) -> bytes:
    """`answer(name, *args)` as JSON; a run's files that break the contract (a column missing, a wrong
    type) said as such rather than as a server error."""
    try:
        return json.dumps(answer(name, *args), allow_nan=False, separators=(",", ":")).encode()
    except (KeyError, TypeError, ValueError, pa.ArrowException) as error:
        detail = f"corpus run {name[:100]!r} does not follow the format: {error!r}"
        raise UnreadableRunError(detail) from error


def _stamp(path: Path) -> tuple[int, int]:
    """What changes when a file is rewritten: its size and modification time (ns)."""
    status = os.stat(path)
    return status.st_size, status.st_mtime_ns
