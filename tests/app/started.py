"""The readiness wait of the service tests: the startup's checks and the default model's load run in the
background (app/service/loads.py), so a test that reads what they found waits for them first."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from fastapi import FastAPI
from fastapi.testclient import TestClient

# A bound on a wait that must end (loading the default on a busy 2-core machine takes seconds): a startup
# that never ends fails the test instead of hanging it.
STARTUP_S = 600


def started(client: TestClient) -> TestClient:
    """`client`, once its app's startup work has ended."""
    service = client.app.state.service  # type: ignore[attr-defined]
    assert service.models.loads.started.wait(STARTUP_S), "the startup's work never ended"
    return client


@contextmanager
def serving(app: FastAPI) -> Iterator[TestClient]:
    """`with TestClient(app)`, its lifespan run and its startup work ended."""
    with TestClient(app) as client:
        yield started(client)
