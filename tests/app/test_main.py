"""app/main.py: what create_app wires (CORS, the documented refusals, the registered names in the schema),
the lifespan, and the `app` that `uvicorn app.main:app` builds on first access."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

import app.main as main
from app.main import create_app
from app.settings import get_settings
from tests.app.started import serving

TEXT = "The cat sat on the mat because it was tired."


def test_cors_closed_by_default(client: TestClient) -> None:
    r = client.options(
        "/api/attention",
        headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in r.headers
    r = client.post("/api/attention", json={"text": TEXT}, headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in r.headers


def test_cors_opens_only_to_configured_origins(make_settings) -> None:  # type: ignore[no-untyped-def]
    app = create_app(make_settings(cors_origins=["https://ok.example"]))
    with serving(app) as c:
        ok = c.get("/api/health", headers={"Origin": "https://ok.example"})
        assert ok.headers["access-control-allow-origin"] == "https://ok.example"
        other = c.get("/api/health", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers


def test_the_schema_lists_the_registered_model_names(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    names = [m["name"] for m in client.get("/api/models").json()["models"]]
    schemas = spec["components"]["schemas"]
    for component in ("InputText", "AttentionRequest", "HeadRequest"):
        model = schemas[component]["properties"]["model"]
        assert model["anyOf"] == [{"type": "string", "enum": names}, {"type": "null"}], component
    assert "x-registered-model-name" not in str(spec)


def test_every_operation_documents_the_refusals_of_the_http_layer(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    for path, methods in spec["paths"].items():
        for method, operation in methods.items():
            assert {"400", "408", "413", "415"} <= set(operation["responses"]), f"{method} {path}"


def test_the_app_answers_after_a_lifespan_restart(make_settings) -> None:  # type: ignore[no-untyped-def]
    app = create_app(make_settings())
    for round_ in range(2):  # shutdown closes the workers; the next startup must get new ones
        with serving(app) as client:
            r = client.post("/api/attention/compact", json={"text": f"restart round {round_}"})
            assert r.status_code == 200


def test_uvicorn_builds_the_app_on_first_access_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "app" not in vars(main)  # importing the module built nothing
    monkeypatch.setenv("HEADSCOPE_ALLOWED_HOSTS", '["example.test"]')
    get_settings.cache_clear()
    try:
        application = main.app
        assert isinstance(application, FastAPI) and main.app is application  # built once
        assert application.state.service.settings.allowed_hosts == ["example.test"]
    finally:
        vars(main).pop("app", None)
        get_settings.cache_clear()
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        main.nothing  # noqa: B018
