"""Fixtures shared by every test directory, and how `make test` spreads the tests over xdist workers."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from checkpoints import FAMILIES, build_tiny_checkpoints

__all__ = ["FAMILIES"]

# `make test` runs the suite on pytest-xdist workers, handing out one group of tests at a time: a file (its
# module-scoped models load once, and tests/app/test_fuzz.py's last test reads what its others recorded),
# or the whole of tests/browser/ (one app server and one Chromium for every page test). The slowest groups
# (pytest --durations) go first, so that none is left to run alone at the end; the rest keep their order.
# The browser tests keep theirs, after tests/app/: Playwright's sync API leaves an asyncio loop running in
# its process until the session ends, where a later asyncio.run() (tests/app/test_insight_api.py) fails.
BROWSER = "tests/browser"
SLOWEST = ("tests/app/test_fuzz.py", "tests/mha/test_corpus_ray.py")


def group_of(nodeid: str) -> str:
    """The group of a test, by its id (relative to the repository root): its file, or tests/browser."""
    path = nodeid.split("::", 1)[0]
    return BROWSER if path.startswith(BROWSER + "/") else path


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: unused without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """--dist loadfile, with tests/browser/ as one file."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class GroupScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return GroupScheduling(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """On an xdist worker, the slowest groups first (the scheduler hands groups out in collection order
    under --no-loadscope-reorder); a plain run keeps pytest's order."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        first = {group: rank for rank, group in enumerate(SLOWEST)}
        items.sort(key=lambda item: first.get(group_of(item.nodeid), len(SLOWEST)))


@pytest.fixture(scope="session")
def conversion_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder for converted GGUF files (HEADSCOPE_CACHE_DIR) of the whole run, never ~/.cache. Under
    xdist it is the workers' common parent folder, so that the bundled LLM's 98 MB are converted once, not
    once a worker; two workers converting one file at once is safe (a conversion is published by a rename)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's folder, above each worker's popen-gwN
    return base / "headscope-cache"


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """family -> a tiny random Hugging Face checkpoint directory, for every family of FAMILIES."""
    return build_tiny_checkpoints(tmp_path_factory.mktemp("checkpoints"))


@pytest.fixture(scope="session")
def seq2seq_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """family -> a tiny random encoder-decoder checkpoint (T5, BART, Marian: tests/seq2seq_checkpoints.py)."""
    from seq2seq_checkpoints import build_seq2seq_checkpoint

    root = tmp_path_factory.mktemp("seq2seq")
    return {family: build_seq2seq_checkpoint(family, root / family) for family in ("t5", "bart", "marian")}
