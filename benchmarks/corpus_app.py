"""The corpus routes in process, for corpus_listing.py and corpus_view.py: the app (no model) over a folder
of runs as HEADSCOPE_RUNS_DIR, and one GET timed. The runs come from tests/corpus_fixture.py.
"""

from __future__ import annotations

import time
from pathlib import Path

from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings


def runs_client(root: Path) -> TestClient:
    """A client of the app serving the runs in `root` (enter it: `with runs_client(root) as client`)."""
    settings = Settings(
        device="cpu",
        threads=1,
        log_level="warning",
        models={},
        runs_dir=root,
        allowed_hosts=["testserver"],  # the Host header of Starlette's TestClient
    )
    return TestClient(create_app(settings))


def get(client: TestClient, path: str) -> int:
    """GET `path`, refusing an error: the answer's bytes."""
    response = client.get(path)
    response.raise_for_status()
    return len(response.content)


def get_ms(client: TestClient, path: str) -> tuple[float, int]:
    """(ms, bytes) of one GET of `path`."""
    start = time.perf_counter()
    response = client.get(path)
    elapsed = time.perf_counter() - start
    response.raise_for_status()
    return elapsed * 1000, len(response.content)
