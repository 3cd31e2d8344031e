"""The local engine's overlap and what it spends beside its forwards: the worker's prepare / compute /
finish, the accelerator's loop (pipelined, prefetched), the queued copies (mha._transfer), the heap's
release after a batch only once it grew (HeapReleaser), and aggregate's examples by partition. The loop
is tested on the CPU (it must give the worker's own tables, bit for bit); what only a GPU can show (no
step waits for the device) runs where CUDA exists."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from corpus_files import texts, write_jsonl

from mha import _memory, load_pretrained
from mha._threads import prefetched
from mha._transfer import to_device, to_host
from mha.corpus import CorpusWorker, local_engine, run
from mha.corpus.aggregate import _smallest
from mha.corpus.local_engine import pipelined
from mha.corpus.shards import shard_directory
from mha.model import AttentionModel

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def batches(items: list[tuple[str, str | None]], size: int) -> Iterator[tuple[int, dict[str, list]]]:
    """(index, the worker's columns) of consecutive batches, a flagged bad record and a blank text in them."""
    for index, start in enumerate(range(0, len(items), size)):
        part = items[start : start + size]
        lines = list(range(start + 1, start + len(part) + 1))
        yield (
            index,
            {
                "line": lines,
                "id": [f"t{line}" for line in lines],
                "text": ["  " if line == 5 else text for line, (text, _) in zip(lines, part, strict=True)],
                "text_pair": [pair for _, pair in part],
                "error": ["invalid JSON" if line == 2 else None for line in lines],
            },
        )


def same(one: pa.Table, two: pa.Table) -> bool:
    """Equal tables, a bad row's NaN statistics included (Arrow's equals holds NaN unequal to itself)."""

    def values(table: pa.Table) -> dict[str, list]:
        return {
            name: [[None if v != v else v for v in x] if isinstance(x, list) else x for x in column]
            for name, column in table.to_pydict().items()
        }

    return one.schema == two.schema and values(one) == values(two)


def test_pipelined_gives_the_workers_tables(minilm: AttentionModel) -> None:
    """The accelerator's loop (next batches prepared in a thread, batch k + 1 computed before batch k is
    finished) answers each batch with the table the worker gives it alone, in order."""
    worker = CorpusWorker(minilm)
    items = texts(22)
    alone = [(key, worker(batch)) for key, batch in batches(items, 5)]
    overlapped = list(pipelined(worker, batches(items, 5)))
    assert [key for key, _ in overlapped] == [key for key, _ in alone] == list(range(5))
    for (_, got), (_, want) in zip(overlapped, alone, strict=True):
        assert same(got, want)
    assert alone[0][1]["error"][1].as_py() == "invalid JSON"  # the premise: bad rows among them


def test_prepare_compute_finish_is_the_worker(minilm: AttentionModel) -> None:
    """A batch without a good record (no forward, nothing to copy) and one with: the three steps give
    the worker's table."""
    worker = CorpusWorker(minilm, words=True)
    bad = {"line": [1, 2], "id": ["a", "b"], "text": ["", None], "text_pair": [None, None]}
    for batch in (bad, next(batches(texts(6), 6))[1]):
        computed = worker.compute(worker.prepare(batch))
        assert (computed.values is None) == (batch is bad)
        assert same(worker.finish(computed), worker(batch))


def test_a_run_on_the_accelerators_loop_writes_the_same_files(
    minilm: AttentionModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run() through pipelined (what a GPU gets) writes every file of a run through the CPU's in_order,
    byte for byte: resuming or mixing engines never mixes two sets of numbers."""
    source = tmp_path / "corpus.jsonl"
    write_jsonl(source, texts(14))
    run(source, minilm, tmp_path / "cpu", batch=4, shard_size=10)
    monkeypatch.setattr(local_engine, "_on_accelerator", lambda worker: True)
    run(source, minilm, tmp_path / "loop", batch=4, shard_size=10)
    for name in ("per_text", "per_head", "examples"):
        one, two = (pq.read_table(tmp_path / d / f"{name}.parquet") for d in ("cpu", "loop"))
        assert one.equals(two), name
    names = sorted(p.name for p in shard_directory(tmp_path / "cpu").iterdir())
    assert names == sorted(p.name for p in shard_directory(tmp_path / "loop").iterdir())
    for name in names:
        one, two = (shard_directory(tmp_path / d) / name for d in ("cpu", "loop"))
        assert one.read_bytes() == two.read_bytes(), name


def test_prefetched_keeps_the_order_and_runs_at_most_ahead() -> None:
    started: list[int] = []
    lock = threading.Lock()

    def square(x: int) -> int:
        with lock:
            started.append(x)
        return x * x

    seen = []
    for key, value in prefetched(square, ((k, k) for k in range(10)), ahead=2):
        with lock:  # what had been taken when item `key` came back: at most two more
            assert max(started) <= key + 2
        seen.append((key, value))
    assert seen == [(k, k * k) for k in range(10)]
    assert started == list(range(10))  # one thread, in order


def test_prefetched_passes_an_error_on_and_stops_there() -> None:
    """The error comes out with its item, in order; the items behind it were not taken past `ahead`, and
    the loop's thread has ended (the generator's with-block waited for it)."""
    started: list[int] = []

    def fails_on_three(x: int) -> int:
        started.append(x)
        if x == 3:
            raise ValueError("three")
        return x

    answers = prefetched(fails_on_three, ((k, k) for k in range(100)), ahead=2)
    assert [next(answers) for _ in range(3)] == [(0, 0), (1, 1), (2, 2)]
    with pytest.raises(ValueError, match="three"):
        next(answers)
    assert max(started) <= 3 + 2
    assert not any(t.name.startswith("prefetch") for t in threading.enumerate())
    with pytest.raises(ValueError, match="ahead"):
        next(prefetched(fails_on_three, [], ahead=0))


def test_heap_releaser_releases_once_memory_grew_past_the_slack(monkeypatch: pytest.MonkeyPatch) -> None:
    """Released at the first call; the level is taken one call later (a batch's working memory in it);
    then released only past level + slack, and the level taken again after."""
    resident = iter([100, 120, 140, 150, 151, 60, 85, 91, 70])
    released: list[int] = []
    monkeypatch.setattr(_memory, "resident_bytes", lambda: next(resident))
    monkeypatch.setattr(_memory, "release_free_memory", lambda: released.append(1))
    release = _memory.HeapReleaser(slack=30)
    answers = [release() for _ in range(9)]
    # level 120 (second call): released at 151, not at 150; level 60 (sixth): released at 91
    assert answers == [True, False, False, False, True, False, False, True, False]
    assert len(released) == 3


def test_heap_releaser_releases_every_call_without_proc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_memory, "resident_bytes", lambda: None)
    monkeypatch.setattr(_memory, "release_free_memory", lambda: None)
    release = _memory.HeapReleaser(slack=1 << 30)
    assert [release() for _ in range(3)] == [True, True, True]


def test_resident_bytes_reads_this_process() -> None:
    resident = _memory.resident_bytes()
    if Path("/proc/self/statm").exists():
        assert resident is not None and resident > 1 << 20  # a Python with torch holds more than a MiB
    else:
        assert resident is None


def test_transfers_on_the_cpu_are_plain_copies() -> None:
    x = torch.arange(6.0)
    assert torch.equal(to_device(x, torch.device("cpu")), x)
    copy = to_host(x)
    assert copy.event is None and copy.ready() is x


@CUDA
def test_transfers_to_and_from_cuda_are_queued() -> None:
    x = torch.arange(1 << 20, dtype=torch.float32)
    device = torch.device("cuda")
    torch.cuda.set_sync_debug_mode("error")  # any wait for the device raises
    try:
        on_device = to_device(x, device)
        copy = to_host(on_device * 2)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert copy.tensor.is_pinned() and copy.event is not None
    assert torch.equal(copy.ready(), x * 2)


@CUDA
def test_the_worker_queues_a_batch_without_waiting_for_the_device() -> None:
    """On CUDA, prepare and compute never wait for the device (a forward per group, its statistics, and
    one copy of the batch's values to pinned memory, all queued); finish waits for that copy, and the
    loop's tables equal the worker's batch by batch."""
    worker = CorpusWorker(load_pretrained(device="cuda"))
    items = list(batches(texts(12), 6))
    prepared = worker.prepare(items[0][1])
    torch.cuda.set_sync_debug_mode("error")
    try:
        computed = worker.compute(prepared)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert computed.values is not None and computed.values.tensor.is_pinned()
    assert same(worker.finish(computed), worker(items[0][1]))
    overlapped = list(pipelined(worker, iter(items)))
    assert all(isinstance(table, pa.Table) for _, table in overlapped)
    for (_, got), (_, batch) in zip(overlapped, items, strict=True):
        assert same(got, worker(batch))


def test_examples_candidates_equal_a_full_sort() -> None:
    """aggregate's per-column k smallest (partition, then a sort of those alone) against np.lexsort on
    whole columns: ties to the lower line, NaN last, -0.0 equal to 0.0, ties past the k-th key."""
    generator = np.random.default_rng(0)
    for trial in range(400):
        rows, columns, k = (int(generator.integers(1, n)) for n in (40, 6, 8))
        choices = [[0.0, -0.0, 1.0, -1.0, np.nan], [0.25, 0.5, 0.75], list(generator.random(50))][trial % 3]
        keys = generator.choice(choices, (rows, columns))
        lines = np.broadcast_to(generator.permutation(rows)[:, None], (rows, columns))
        want = np.lexsort((lines, keys), axis=0)[:k]
        assert np.array_equal(_smallest(keys, lines, k), want), trial
