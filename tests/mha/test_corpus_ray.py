"""The Ray engine (mha.corpus.ray_engine) against the local engine: the same files, bit for bit, from a
local 2-CPU cluster, and from a running cluster joined through RAY_ADDRESS; a resumed Ray run skips the
finished shards; a cluster it starts, it stops; one it joins, it leaves running."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
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


@pytest.fixture(scope="module")
def on_ray(corpus: Path) -> Iterator[Path]:
    """The Ray engine's run on a local 2-CPU cluster that the test starts (the engine uses it as it is)."""
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env=ray_engine.runtime_env(),
    )
    try:
        out = corpus.parent / "ray"
        run(corpus, None, out, engine="ray", **SETTINGS)
        assert ray.is_initialized(), "the engine shut down a Ray it did not start"
    finally:
        ray.shutdown()
    yield out


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
def test_the_ray_engine_writes_the_local_engines_files(local: Path, on_ray: Path) -> None:
    assert_same_files(on_ray, local)
    # the shards too, byte for byte (what a later resume reads)
    names = sorted(p.name for p in shard_directory(local).iterdir())
    assert sorted(p.name for p in shard_directory(on_ray).iterdir()) == names
    for name in names:
        assert (shard_directory(on_ray) / name).read_bytes() == (shard_directory(local) / name).read_bytes()
    # the corpus exercises what could differ: bad rows, several shards, truncated texts
    counts = json.loads((local / "run.json").read_text())["counts"]
    assert counts["records"] == 32 and counts["errors"] == 6 and counts["shards"] == 4
    assert counts["truncated"] > 0
    # and the detection scores, null where a text repeats no token (equal nulls are part of equals above)
    scores = pq.read_table(local / "per_text.parquet", columns=list(SCORES))
    assert 0 < scores["induction"].null_count < scores.num_rows


@pytest.mark.slow
def test_a_resumed_ray_run_skips_finished_shards_and_ends_with_the_same_files(
    corpus: Path, local: Path, on_ray: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run killed after shards 0 and 3 were written (1 and 2 lost) resumes on a local cluster that the
    engine starts itself and stops after."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    out = tmp_path / "resumed"
    shutil.copytree(on_ray, out)
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


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
def test_a_cluster_joined_through_ray_address_writes_the_local_engines_files(
    corpus: Path, tmp_path: Path
) -> None:
    """A cluster already running in processes of its own (`ray start --head`, as on a real cluster's head
    node), joined by `headscope corpus --engine ray` through RAY_ADDRESS: the driver's mha shipped to the
    workers (py_modules), the local engine's files, the cluster still up after. With words: the word-level
    maps, merged on the workers."""
    local_words = tmp_path / "local-words"
    run(corpus, None, local_words, words=True, **SETTINGS)
    port = _free_port()
    # Ray's token authentication guards clusters on a network; here the head and the driver agree to go
    # without (an earlier ray.init in this process left RAY_AUTH_MODE=token in its environment).
    environment = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_ADDRESS": f"127.0.0.1:{port}"}
    head = subprocess.Popen(
        [str(Path(sys.executable).with_name("ray")), "start", "--head", f"--port={port}", "--num-cpus=2"]
        + ["--node-ip-address=127.0.0.1", "--include-dashboard=false", "--disable-usage-stats", "--block"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={k: v for k, v in environment.items() if k != "RAY_ADDRESS"},
        start_new_session=True,  # its own process group: the head's processes, stopped together below
    )
    try:
        assert head.stdout is not None
        said = []
        for line in head.stdout:  # --block prints this once the head's processes are up
            said.append(line)
            if "Ray runtime started" in line:
                break
        assert _listening(port), "".join(said[-20:])
        settings = [f"--{key.replace('_', '-')}={value}" for key, value in SETTINGS.items()]
        done = subprocess.run(
            [sys.executable, "-m", "app.cli", "corpus", str(corpus), "--out", str(tmp_path / "joined")]
            + ["--engine=ray", "--words", *settings],
            env=environment,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert head.poll() is None and _listening(port), "the engine stopped a cluster it joined"
        assert_same_files(tmp_path / "joined", local_words)
    finally:
        # The cluster is the test's own: killed whole (its agents are in the group; the reaper `--block`
        # starts stops the rest), not stopped gracefully, which waited ~30 s after a job on its agents.
        os.killpg(head.pid, signal.SIGKILL)
        head.wait(timeout=60)


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
