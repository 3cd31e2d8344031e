"""Settings from the environment, and logs that a request cannot forge."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from app.settings import Settings


def test_settings_read_the_headscope_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HEADSCOPE_DEVICE", "cpu")
    monkeypatch.setenv("HEADSCOPE_DTYPE", "bfloat16")
    monkeypatch.setenv("HEADSCOPE_MODELS", f'{{"mine": "{tmp_path}"}}')
    monkeypatch.setenv("HEADSCOPE_MODELS_DIR", str(tmp_path))
    monkeypatch.setenv("HEADSCOPE_CORS_ORIGINS", '["https://a.example"]')
    monkeypatch.setenv("HEADSCOPE_MAX_TOKENS", "128")
    monkeypatch.setenv("HEADSCOPE_THREADS", "2")
    s = Settings()
    assert (s.device, s.dtype, s.max_tokens, s.threads) == ("cpu", "bfloat16", 128, 2)
    assert s.models == {"mine": tmp_path} and s.models_dir == tmp_path
    assert s.cors_origins == ["https://a.example"]
    assert Settings(_env_prefix="NOPE_").cors_origins == []  # CORS closed unless configured


def test_http_settings_read_the_environment_with_safe_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = Settings(_env_prefix="NOPE_")
    assert defaults.allowed_hosts == []  # local names and loopback only
    assert (defaults.header_timeout, defaults.body_timeout, defaults.max_connections) == (10.0, 30.0, 128)
    monkeypatch.setenv("HEADSCOPE_ALLOWED_HOSTS", '["Headscope.Example.org", "[::1]", "*.lab.example", "*"]')
    monkeypatch.setenv("HEADSCOPE_HEADER_TIMEOUT", "2.5")
    monkeypatch.setenv("HEADSCOPE_BODY_TIMEOUT", "4")
    monkeypatch.setenv("HEADSCOPE_MAX_CONNECTIONS", "16")
    s = Settings()
    assert s.allowed_hosts == ["headscope.example.org", "::1", "*.lab.example", "*"]
    assert (s.header_timeout, s.body_timeout, s.max_connections) == (2.5, 4.0, 16)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("dtype", "float64"),
        ("max_tokens", 1),
        ("max_concurrency", 0),
        ("log_level", "loud"),
        ("threads", 0),
        ("allowed_hosts", ["example.org:8000"]),
        ("allowed_hosts", ["a b"]),
        ("allowed_hosts", ["x.*.example"]),
        ("allowed_hosts", ["https://example.org"]),
        ("header_timeout", 0),
        ("body_timeout", -1),
        ("max_connections", 0),
    ],
)
def test_bad_settings_fail_at_startup_naming_the_value(field: str, value: object) -> None:
    with pytest.raises(ValidationError, match=field):
        Settings(**{field: value})  # type: ignore[arg-type]


def test_access_log_cannot_be_forged_and_never_holds_the_text(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "my private sentence"
    with caplog.at_level(logging.INFO, logger="app"):
        client.get("/api/health%0A2026-01-01 INFO app.access: GET '/admin' 200")
        client.post("/api/attention", json={"text": secret})
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("app")]
    assert lines, "requests are logged"
    assert all("\n" not in line for line in lines)
    assert any("\\n" in line for line in lines)  # the newline is shown escaped
    assert all(secret not in line for line in lines)
