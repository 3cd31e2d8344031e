"""The Ray engine: the corpus job on Ray Data, writing the local engine's shards (runner.py's ``process``).

- Read: one read task on the driver's node streams ``source.read_records``, so the records, their lines
  and the bad ones are the local engine's by construction, and the input need only be on that machine.
  Ray's own readers are not enough here: ``read_text`` loads a file whole into one block and also splits
  lines at the Unicode separators the local reader keeps, ``read_json`` and ``read_csv`` fail the read
  on the first bad row instead of reporting it, and none of them numbers records, which shards and
  ``errors.jsonl`` are keyed by. Each row is one of the local engine's batches (its records packed in
  lists): ``job.batch`` consecutive records of one shard, the last cut at the shard's end. Ray splits
  and merges blocks, never rows, so every padded forward is the local engine's and so are the numbers.
- Map: ``Dataset.map_batches`` with ``CorpusWorker`` as its callable class, a pool of actors that each
  load the model once (``num_gpus`` each where the cluster has GPUs).
- Write: the answers stream back to the driver, which writes each shard with ``shards.write_shard`` as
  soon as all its records are in: the same files as the local engine, and ``out`` need only be on the
  driver's machine. Finished shards are never read again (``todo`` skips them in the reader).
- Cluster: Ray already initialised in this process (a notebook, a test) is used as it is and left running;
  else ``RAY_ADDRESS`` names a cluster to join, whose workers import the driver's own ``mha`` (shipped as
  a runtime_env py_module), so every node needs headscope's dependencies and the model directory, not
  this checkout; else a local cluster starts for the job and stops after. Its workers are this machine's
  processes on this interpreter and environment, so they import the driver's ``mha`` without shipping it
  (any runtime_env costs each of them a fresh process: 1.5 s of a 2-core machine's start); each checks
  that its ``mha`` is the driver's directory and says so if not.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa
import ray
import torch
from ray.data import DataContext, Dataset
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask
from ray.data.exceptions import UserCodeException
from ray.exceptions import RayError

from mha.corpus.job import Job, Progress
from mha.corpus.shards import shard_of, write_shard
from mha.corpus.source import Record, read_records
from mha.corpus.worker import INPUT_COLUMNS, CorpusWorker, output_schema
from mha.networks.result import ModelInfo

__all__ = ["process", "runtime_env"]

logger = logging.getLogger(__name__)

# CorpusWorker's input columns, typed as it answers them; the reader packs each batch of records into one
# row of lists (PACKED).
RECORDS = pa.schema([output_schema(1).field(name) for name in (*INPUT_COLUMNS, "error", "truncated")])
PACKED = pa.schema([(field.name, pa.list_(field.type)) for field in RECORDS])
_COLOURS = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours the process names in its messages
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception): ")


def process(job: Job, todo: Sequence[int], progress: Progress | None, info: ModelInfo) -> None:
    """Write every shard of ``todo`` on Ray Data (the contract is in mha/corpus/runner.py)."""
    expected = {k: max(0, min(job.shard_size, job.records - k * job.shard_size)) for k in todo}
    done = job.records - sum(expected.values())
    held: dict[int, list[pa.Table]] = {}  # the rows of shards not complete yet
    counts: dict[int, int] = {}
    written: set[int] = set()
    try:
        with _cluster() as local:
            for batch in _dataset(
                job, todo, local, batches=sum(-(-n // job.batch) for n in expected.values())
            ).iter_batches(batch_size=None, batch_format="pyarrow"):
                rows = cast(pa.Table, batch)
                for index, part in _by_shard(rows, job.shard_size):
                    held.setdefault(index, []).append(part)
                    counts[index] = counts.get(index, 0) + part.num_rows
                    if counts[index] == expected[index]:
                        _write(job, index, held.pop(index), info.layers, info.heads)
                        written.add(index)
                done += rows.num_rows
                if progress is not None:
                    progress(done, job.records)
    except (RayError, UserCodeException) as error:  # a worker's own error, as one line (the CLI's)
        raise RuntimeError(f"a Ray worker failed: {worker_error(str(error))}") from error
    for index in todo:  # the shards the input ended before (it changed since it was counted), as they are
        if index not in written:
            _write(job, index, held.pop(index, []), info.layers, info.heads)


def _dataset(job: Job, todo: Sequence[int], local: bool, *, batches: int) -> Dataset:
    context = DataContext.get_current()
    context.enable_progress_bars = False  # the caller's progress callback reports instead
    resources = ray.cluster_resources()
    cpus, cluster_gpus = int(resources.get("CPU", 0)), resources.get("GPU", 0.0)
    gpus = job.num_gpus if job.num_gpus is not None else (1.0 if cluster_gpus >= 1 else 0.0)
    if gpus > cluster_gpus or cpus < 1:  # its workers would wait for resources forever
        raise RuntimeError(
            f"the Ray cluster has {cpus} CPUs and {cluster_gpus:g} GPUs: not enough for one worker "
            f"(1 CPU and {gpus:g} GPUs); lower --num-gpus or add nodes"
        )
    workers = min(cpus, int(cluster_gpus // gpus)) if gpus > 0 else cpus
    logger.info("ray: %d workers, %g GPUs and 1 CPU each", workers, gpus)
    records = ray.data.read_datasource(
        _RecordSource(job, todo),
        # No CPU of its own: reading is light, and the workers hold every CPU (a read task waiting for a
        # CPU that the actors hold would wait forever).
        num_cpus=0,
        override_num_blocks=max(1, batches),
    )
    return records.map_batches(
        _Worker,
        fn_constructor_kwargs={
            "model": job.model,
            # the local cluster's workers import mha as this process does: the same directory, checked
            "expected_mha": _mha_directory() if local else None,
            **job.worker_kwargs(),
        },
        batch_size=1,  # a row: one batch of the local engine's
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=workers),
        num_cpus=1,
        num_gpus=gpus,
    )


class _Worker:
    """map_batches' callable class: a CorpusWorker per actor (the model loads once); each row it is
    handed is one batch of records, run as one padded forward."""

    def __init__(self, *, expected_mha: str | None = None, **kwargs: Any) -> None:
        if expected_mha is not None and _mha_directory() != expected_mha:
            raise RuntimeError(
                f"this Ray worker imports mha from {_mha_directory()}, the driver from {expected_mha}: "
                "install headscope in the environment the driver runs in (pip install -e .), or start the "
                "cluster yourself with ray.init(runtime_env=mha.corpus.ray_engine.runtime_env())"
            )
        # torch on the CPUs Ray gave this worker, not on every core of the node (the other workers' too)
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1)
        torch.set_num_threads(max(1, int(cpus)))
        self.worker = CorpusWorker(**kwargs)

    def __call__(self, batches: pa.Table) -> pa.Table:
        packed = batches.to_pydict()
        rows = range(batches.num_rows)
        parts = [self.worker({name: packed[name][row] for name in RECORDS.names}) for row in rows]
        return pa.concat_tables(parts) if parts else self.worker.schema.empty_table()


class _RecordSource(Datasource):
    """The input's records in the shards of ``todo``, read in one task on the driver's node (records are
    numbered by reading the file in order), one row per batch."""

    def __init__(self, job: Job, todo: Sequence[int]) -> None:
        super().__init__()
        self.job = job
        self.todo = frozenset(todo)

    def estimate_inmemory_data_size(self) -> int | None:
        return self.job.source.stat().st_size

    @property
    def supports_distributed_reads(self) -> bool:
        return False  # Ray then runs the read task on the driver's node, where the input is

    def get_read_tasks(
        self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None
    ) -> list[ReadTask]:
        job, todo = self.job, self.todo
        files = (str(job.source),)
        metadata = BlockMetadata(num_rows=None, size_bytes=None, input_files=files, exec_stats=None)
        return [ReadTask(lambda: _blocks(job, todo), metadata, per_task_row_limit=per_task_row_limit)]


def _blocks(job: Job, todo: frozenset[int]) -> Iterator[pa.Table]:
    """A one-row block per batch of the local engine's, ``job.batch`` consecutive records of a shard of
    ``todo``, the last one cut at the shard's end. Ray may split and merge blocks; a row it never cuts, so
    each padded forward is the local engine's; small blocks share the work evenly among the workers."""
    held: list[Record] = []
    for record in read_records(job.source, max_chars=job.max_chars):
        index = shard_of(record.line, job.shard_size)
        if held and (len(held) == job.batch or shard_of(held[0].line, job.shard_size) != index):
            yield _block(held)
            held = []
        if index in todo:
            held.append(record)
    if held:
        yield _block(held)


def _block(records: Sequence[Record]) -> pa.Table:
    return pa.Table.from_pydict(
        {name: [[getattr(r, name) for r in records]] for name in RECORDS.names}, schema=PACKED
    )


def _by_shard(rows: pa.Table, shard_size: int) -> Iterator[tuple[int, pa.Table]]:
    shards = (rows["line"].to_numpy() - 1) // shard_size
    for index in np.unique(shards).tolist():
        yield index, rows.filter(pa.array(shards == index))


def _write(job: Job, index: int, parts: list[pa.Table], layers: int, heads: int) -> None:
    schema = output_schema(layers * heads)
    rows = pa.concat_tables([p.cast(schema) for p in parts]) if parts else schema.empty_table()
    # Workers answer in any order; a shard's rows go in line order, as the local engine writes them.
    rows = rows.sort_by("line")
    write_shard(job.out, index, rows, layers=layers, heads=heads)


def worker_error(message: str) -> str:
    """The worker's own exception in a Ray error's message (its last ``SomeError: why`` line, colours
    taken out), else the message's first line."""
    lines = [line.strip() for line in _COLOURS.sub("", message).splitlines() if line.strip()]
    errors = [line for line in lines if _EXCEPTION_LINE.match(line)]
    return errors[-1] if errors else (lines[0] if lines else "no reason given")


def runtime_env() -> dict[str, Any]:
    """What ``ray.init`` needs for the engine's workers to import this process's own ``mha`` (uploaded
    to the cluster), whatever headscope the nodes have installed, if any."""
    return {"py_modules": [_mha_directory()]}


def _mha_directory() -> str:
    return str(Path(__file__).resolve().parents[1])  # mha/corpus/ray_engine.py -> mha/


@contextmanager
def _cluster() -> Iterator[bool]:
    """Ray for the job; yields whether it is a local cluster started here (its workers import mha as this
    process does: nothing to ship)."""
    if ray.is_initialized():
        yield False
        return
    address = os.environ.get("RAY_ADDRESS")
    if address:
        logger.info("ray: joining the cluster at %s", address)
        ray.init(address=address, runtime_env=runtime_env(), log_to_driver=False)
    else:
        logger.info("ray: starting a local cluster (set RAY_ADDRESS to use an existing one)")
        before = dict(os.environ)
        ray.init(address="local", include_dashboard=False, log_to_driver=False)
        # ray.init sets RAY_AUTH_MODE to "token" (and PYTHONBREAKPOINT) in this process's environment: left
        # set, a later join of a cluster without tokens, from here or a child process, fails with
        # InvalidAuthToken. What it changed is put back after; what others change meanwhile is kept.
        changed = {k: before.get(k) for k in {*before, *os.environ} if os.environ.get(k) != before.get(k)}
    try:
        yield not address
    finally:
        ray.shutdown()
        if not address:
            for key, value in changed.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
