"""The local engine: the corpus job's shards run through one CorpusWorker in this process.

On the CPU, torch's T threads become T batches at a time, each on one thread (mha._threads.in_order), so
the numbers are a one-thread run's; on an accelerator the batches are pipelined (the next prepared in the
background and queued on the device before this one is finished). Each shard is written as the Ray engine
(mha.corpus.ray_engine) writes it, under the contract mha.corpus.runner states, so the two engines' shards
are the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

import pyarrow as pa
import torch

from mha._memory import HeapReleaser
from mha._threads import in_order, prefetched
from mha.corpus.job import Job, Progress
from mha.corpus.shards import shard_of, write_shard
from mha.corpus.source import Record, read_records
from mha.corpus.worker import Computed, CorpusWorker, output_schema

__all__ = ["HEAP_SLACK", "PREFETCH", "pipelined", "process", "records_in"]

# Batches an accelerator's loop prepares ahead of the one it computes (pipelined): enough that the next is
# ready when the device takes it, few enough that their records stay a few batches.
PREFETCH = 2
K = TypeVar("K")
# Resident memory the local engine lets the C heap grow past its level one batch after its last release
# before it releases again (HeapReleaser). Released after every batch, 2,000 MiniLM texts spent ~6 % of
# their CPU time faulting the same pages in again; never released, the heap held ~170 MiB more by the
# 60th batch.
HEAP_SLACK = 64 << 20


def process(job: Job, todo: Sequence[int], worker: CorpusWorker, progress: Progress | None) -> None:
    """The local engine: each shard of ``todo`` through ``worker`` in batches of job.batch records; on the
    CPU, torch's T threads become T batches at a time, each on one thread (mha._threads: small operators
    split across threads spend their time at barriers), so the numbers are a one-thread run's; on an
    accelerator, ``pipelined``."""
    info = worker.model.info
    wanted = set(todo)
    done = job.records - records_in(job, todo)
    written: set[int] = set()
    tables: list[pa.Table] = []
    release = HeapReleaser(HEAP_SLACK)
    if _on_accelerator(worker):
        answers = pipelined(worker, _work(job, wanted))
    else:
        answers = in_order(worker, _work(job, wanted), torch.get_num_threads())
    for (index, size, last), table in answers:
        tables.append(table)
        release()  # batches' shapes differ: without it the heap's high-water mark creeps
        done += size
        if progress is not None:
            progress(done, job.records)
        if last:
            write_shard(job.out, index, pa.concat_tables(tables), layers=info.layers, heads=info.heads)
            written.add(index)
            tables = []
            # A shard's tables freed: pyarrow's pool gives them back (the C heap is release()'s)
            pa.default_memory_pool().release_unused()
    for index in sorted(wanted - written):  # a shard with no records left (the input ended sooner)
        write_shard(
            job.out, index, output_schema(worker.heads).empty_table(), layers=info.layers, heads=info.heads
        )


def _on_accelerator(worker: CorpusWorker) -> bool:
    return worker.model.device.type != "cpu"


def pipelined(worker: CorpusWorker, items: Iterable[tuple[K, Any]]) -> Iterator[tuple[K, pa.Table]]:
    """(key, worker(batch)) for each (key, batch) of ``items``, in order, overlapped for an accelerator:
    the next batches are prepared (read, tokenized, grouped: CorpusWorker.prepare) in a background thread,
    and batch k + 1's device work is queued (compute) before batch k is finished (its one copy to the host
    waited for, its table built, then written by the caller), so the device has work while the host
    does the rest. The tables are ``worker(batch)``'s."""
    launched: tuple[K, Computed] | None = None
    for key, prepared in prefetched(worker.prepare, items, ahead=PREFETCH):
        computed = worker.compute(prepared)
        if launched is not None:
            yield launched[0], worker.finish(launched[1])
        launched = key, computed
    if launched is not None:
        yield launched[0], worker.finish(launched[1])


def _work(job: Job, wanted: set[int]) -> Iterator[tuple[tuple[int, int, bool], dict[str, list[Any]]]]:
    """((shard, records, last of its shard?), the worker's columns) for each batch of the wanted shards."""
    for index, records in _shards(read_records(job.source, max_chars=job.max_chars), job.shard_size, wanted):
        parts = list(_batches(records, job.batch))
        for k, part in enumerate(parts):
            yield (index, len(part), k == len(parts) - 1), _columns(part)


def records_in(job: Job, shards: Iterable[int]) -> int:
    """Records in these shards of the job's input."""
    return sum(min(job.shard_size, job.records - k * job.shard_size) for k in shards)


def _shards(
    records: Iterable[Record], shard_size: int, wanted: set[int]
) -> Iterator[tuple[int, list[Record]]]:
    """(shard index, its records) for each wanted shard that has records, in order; one shard in memory."""
    current: int | None = None
    held: list[Record] = []
    for record in records:
        index = shard_of(record.line, shard_size)
        if index != current:
            if current is not None and held:
                yield current, held
            current, held = index, []
        if index in wanted:
            held.append(record)
    if current is not None and held:
        yield current, held


def _batches(records: Sequence[Record], size: int) -> Iterator[Sequence[Record]]:
    for start in range(0, len(records), size):
        yield records[start : start + size]


def _columns(records: Sequence[Record]) -> dict[str, list[Any]]:
    """Records as the worker's input columns."""
    return {
        field: [getattr(r, field) for r in records]
        for field in ("line", "id", "text", "text_pair", "error", "truncated")
    }
