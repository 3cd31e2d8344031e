"""The Ray engine (mha.corpus.ray_engine) against the local engine: the same files, bit for bit, from a
local 2-CPU cluster, and from that cluster joined through RAY_ADDRESS by another process; a resumed Ray run
skips the finished shards; a cluster it starts, it stops; one it joins, it leaves running."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from corpus_files import texts, write_jsonl

from mha.corpus import run
from mha.corpus.job import SCORES
from mha.corpus.shards import shard_directory

pytest.importorskip("ray.data", reason='the Ray engine needs Ray Data: pip install "headscope[ray]"')
import ray  # noqa: E402  (after the skip: Ray is an optional extra)

from mha.corpus import ray_engine  # noqa: E402

# 26 texts and 6 bad lines: 4 shards of 8 records, each in batches of 3, 3 and 2 (cut at the shard's end);
# max_tokens below the longer texts' length, so some are truncated; max_chars cuts the longest texts to
# fewer than max_tokens, so some are truncated by the reader alone (the flag must reach Ray's workers).
SHARD, BATCH, MAX_TOKENS, MAX_CHARS = 8, 3, 16, 40
ROOT = Path(__file__).resolve().parents[2]
SETTINGS = {
    "batch": BATCH,
    "shard_size": SHARD,
    "max_tokens": MAX_TOKENS,
    "max_chars": MAX_CHARS,
    "device": "cpu",
}
OUTPUTS = ("per_text", "per_head", "examples")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    write_jsonl(source, texts(26))
    return source


@pytest.fixture(scope="module")
def local(corpus: Path) -> Path:
    """The local engine's run on two torch threads: two batches at a time, each on one torch thread
    (mha._threads), as each Ray worker here (1 CPU each) runs torch: the same batches through the same
    kernels, so the same sums in the same order and equal bits."""
    out = corpus.parent / "local"
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        run(corpus, None, out, **SETTINGS)
    finally:
        torch.set_num_threads(threads)
    return out


@dataclass(frozen=True)
class OnRay:
    out: Path  # the engine's files from this process, on the cluster it had initialised
    joined: Path  # `headscope corpus --engine ray --words`'s, from a process that joined it (RAY_ADDRESS)
    cli: subprocess.CompletedProcess[str]  # that run
    left_running: bool  # after that run: the cluster still up, and this process still on it


@pytest.fixture(scope="module")
def on_ray(corpus: Path) -> Iterator[OnRay]:
    """The Ray engine's run on a local 2-CPU cluster that this process starts (the engine uses it as it is),
    then the CLI's run, in a process of its own, joining that cluster through RAY_ADDRESS as a driver joins a
    real cluster's head node. One cluster for both: a cluster's start (Ray's own processes, and Ray Data's
    actors, which a second job on it reuses) is ~20 CPU-s of a 2-core machine."""
    out, joined = corpus.parent / "ray", corpus.parent / "joined"
    # Ray's token authentication guards clusters on a network; here the two drivers agree to go without.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_AUTH_MODE", "disabled")
        context = ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env=ray_engine.runtime_env(),
        )
        try:
            run(corpus, None, out, engine="ray", **SETTINGS)
            assert ray.is_initialized(), "the engine shut down a Ray it did not start"
            address = context.address_info["gcs_address"]
            settings = [f"--{key.replace('_', '-')}={value}" for key, value in SETTINGS.items()]
            cli = subprocess.run(
                [sys.executable, "-m", "app.cli", "corpus", str(corpus), "--out", str(joined)]
                + ["--engine=ray", "--words", *settings],
                env={**os.environ, "RAY_ADDRESS": address},
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=600,
            )
            host, port = address.rsplit(":", 1)
            up = ray.is_initialized() and _listening(host, int(port))
            left_running = up and any(node["Alive"] for node in ray.nodes())
        finally:
            ray.shutdown()
    yield OnRay(out, joined, cli, left_running)


def assert_same_files(ours: Path, theirs: Path) -> None:
    for name in OUTPUTS:
        a, b = pq.read_table(ours / f"{name}.parquet"), pq.read_table(theirs / f"{name}.parquet")
        assert a.schema == b.schema and a.num_rows == b.num_rows, name
        assert a.equals(b), f"{name}.parquet differs between the engines"
    assert (ours / "errors.jsonl").read_bytes() == (theirs / "errors.jsonl").read_bytes()
    summary, reference = (json.loads((out / "run.json").read_text()) for out in (ours, theirs))
    assert summary["counts"] == reference["counts"]
    assert summary["complete"] and summary["engine"] == "ray" and "ray" in summary["versions"]


@pytest.mark.slow
def test_the_ray_engine_writes_the_local_engines_files(local: Path, on_ray: OnRay) -> None:
    assert_same_files(on_ray.out, local)
    # the shards too, byte for byte (what a later resume reads)
    ours, theirs = shard_directory(on_ray.out), shard_directory(local)
    names = sorted(p.name for p in theirs.iterdir())
    assert sorted(p.name for p in ours.iterdir()) == names
    for name in names:
        assert (ours / name).read_bytes() == (theirs / name).read_bytes()
    # the corpus exercises what could differ: bad rows, several shards, truncated texts
    counts = json.loads((local / "run.json").read_text())["counts"]
    assert counts["records"] == 32 and counts["errors"] == 6 and counts["shards"] == 4
    assert counts["truncated"] > 0
    # and the detection scores, null where a text repeats no token (equal nulls are part of equals above)
    scores = pq.read_table(local / "per_text.parquet", columns=list(SCORES))
    assert 0 < scores["induction"].null_count < scores.num_rows


@pytest.mark.slow
def test_a_resumed_ray_run_skips_finished_shards_and_ends_with_the_same_files(
    corpus: Path, local: Path, on_ray: OnRay, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run killed after shards 0 and 3 were written (1 and 2 lost) resumes on a local cluster that the
    engine starts itself and stops after."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    out = tmp_path / "resumed"
    shutil.copytree(on_ray.out, out)
    for k in (1, 2):
        for path in shard_directory(out).glob(f"{k:05d}.*"):
            path.unlink()
    for name in OUTPUTS:
        (out / f"{name}.parquet").unlink()
    summary = json.loads((out / "run.json").read_text())
    (out / "run.json").write_text(json.dumps({**summary, "complete": False}))
    kept = {p.name: p.stat().st_mtime_ns for p in shard_directory(out).iterdir()}
    seen: list[int] = []
    environment = dict(os.environ)

    run(corpus, None, out, engine="ray", progress=lambda done, _: seen.append(done), **SETTINGS)

    assert not ray.is_initialized(), "the engine left its own cluster running"
    # ray.init set RAY_AUTH_MODE=token here; left set, a later join of a cluster without tokens fails
    assert dict(os.environ) == environment, "the engine left its cluster's settings in the environment"
    assert {p.name: p.stat().st_mtime_ns for p in shard_directory(out).iterdir() if p.name in kept} == kept
    assert seen[0] == 2 * SHARD and seen[-1] == 4 * SHARD and seen == sorted(seen)
    assert_same_files(out, local)


def _listening(host: str, port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex((host, port)) == 0


@pytest.mark.slow
def test_a_cluster_joined_through_ray_address_writes_the_local_engines_files(
    corpus: Path, on_ray: OnRay, tmp_path: Path
) -> None:
    """A cluster already running in processes of its own, joined by `headscope corpus --engine ray` through
    RAY_ADDRESS: the driver's mha shipped to the workers (py_modules), the local engine's files, the cluster
    still up after. With words: the word-level maps, merged on the workers."""
    local_words = tmp_path / "local-words"
    run(corpus, None, local_words, words=True, **SETTINGS)
    assert on_ray.cli.returncode == 0, on_ray.cli.stderr[-3000:]
    assert on_ray.left_running, "the engine stopped a cluster it joined"
    assert_same_files(on_ray.joined, local_words)


def test_a_workers_error_is_told_in_one_line() -> None:
    """What Ray raises when a worker's __init__ fails (a model it cannot load, words on an encoder-decoder):
    the worker's own exception is the line the CLI shows."""
    message = (
        "The actor died because of an error raised in its creation task, \x1b[36mray::MapWorker("
        'MapBatches(_Worker)).__init__()\x1b[39m (pid=1, ip=10.0.0.2)\n  File "worker.py", line 76\n'
        "    raise ValueError(...)\nValueError: words are not available for an encoder-decoder ('t5')"
    )
    assert ray_engine.worker_error(message) == (
        "ValueError: words are not available for an encoder-decoder ('t5')"
    )
    assert ray_engine.worker_error("\x1b[36mthe node died\x1b[39m\n") == "the node died"


def test_a_local_clusters_worker_refuses_another_mha_than_the_drivers(tmp_path: Path) -> None:
    """The engine's own local cluster ships no code: its workers import mha as the driver does, and one
    that finds another directory (a driver run from a checkout its workers cannot see) says so by name."""
    with pytest.raises(RuntimeError, match="imports mha from .*, the driver from .*elsewhere"):
        ray_engine._Worker(expected_mha=str(tmp_path / "elsewhere"), model=None)
