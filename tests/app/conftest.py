"""Fixtures for the service tests: one app with the embedded default model, shared per module."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from tests.app.started import serving


def make_settings(**overrides: object) -> Settings:
    # Explicit values, not the environment, so a developer's HEADSCOPE_* variables cannot change a test.
    # "testserver" is the Host header of Starlette's TestClient.
    values: dict[str, object] = {
        "device": "cpu",
        "threads": 1,
        "log_level": "warning",
        "models": {},
        "allowed_hosts": ["testserver"],
        # Only tests/app/test_bundled_llm.py asks for it: the model lists elsewhere stay those named.
        "bundled_llm": False,
        # No store found by itself: a test that wants one passes discover=True and its own tmp folders.
        "discover": False,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


@pytest.fixture(name="make_settings", scope="session")
def make_settings_fixture() -> Callable[..., Settings]:
    return make_settings


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with serving(create_app(make_settings())) as test_client:  # the default loaded, as the tests assume
        yield test_client
