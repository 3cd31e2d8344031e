"""The first request after a start (issue 48 E1): `headscope serve` in a subprocess, a request for each kind
of model sent the moment /api/health first answers, all at once, is answered 200.

Before the fix, the startup thread warmed transformers' lazy imports while a request's load imported them on
another thread, and the load failed with "ImportError: cannot import name 'AutoConfig' from 'transformers'"
on every start (503; health then stayed 503 until some request came after the back-off). Nothing here
measures time: GUARD only keeps a broken server from hanging the suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from checkpoints import build_checkpoint
from gguf_files import write_gguf

from benchmarks.launch import free_port, stop

ROOT = Path(__file__).resolve().parents[2]
GUARD = 120.0  # seconds for the server to start and to answer
TEXT = "The cat sat on the mat."
# One of each kind the issue names: the embedded default, the random model, a checkpoint folder, a GGUF.
KINDS = ("all-MiniLM-L6-v2", "random", "tiny-bert", "tiny-llama-gguf")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("first-request")
    llama = build_checkpoint("llama", root / "llama")
    return {
        "tiny-bert": str(build_checkpoint("bert", root / "bert")),
        "tiny-llama-gguf": str(write_gguf(llama, root / "tiny.gguf", qtype="Q8_0")),
    }


def _request(base: str, path: str, body: dict[str, object] | None = None) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{base}{path}", data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=GUARD) as response:  # noqa: S310 (loopback)
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.fixture()
def started(models: dict[str, str], tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A fresh `headscope serve`, returned the moment /api/health first answers (any status)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("HEADSCOPE_")}
    env |= {
        "HEADSCOPE_MODELS": json.dumps(models),
        "HEADSCOPE_BUNDLED_LLM": "false",
        "HEADSCOPE_DISCOVER": "false",
        "HEADSCOPE_DEVICE": "cpu",
        "HEADSCOPE_CACHE_DIR": str(tmp_path / "cache"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "server.log"
    command = [sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    with log.open("wb") as out:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + GUARD
        while True:
            try:
                _request(base, "/api/health")
                break
            except OSError:  # not listening yet
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"headscope serve did not start:\n{log.read_text(errors='replace')}")
                time.sleep(0.01)
        yield base, log
    finally:
        stop(process, timeout=30)


def test_the_first_request_for_each_kind_of_model_is_answered(started: tuple[str, Path]) -> None:
    # One start: the race it guards against met every start (10 of 10), and each start costs ~15 s of CPU.
    base, log = started
    with ThreadPoolExecutor(len(KINDS)) as pool:
        answers = dict(
            zip(
                KINDS,
                pool.map(lambda name: _request(base, "/api/attention", {"text": TEXT, "model": name}), KINDS),
                strict=True,
            )
        )
    failed = {name: answer for name, answer in answers.items() if answer[0] != 200}
    assert not failed, f"{failed}\n{log.read_text(errors='replace')[-3000:]}"
    assert {name: json.loads(body)["model"] for name, (_, body) in answers.items()} == {n: n for n in KINDS}
    status, body = _request(base, "/api/health")
    assert (status, json.loads(body)["status"]) == (200, "ok"), body
