"""A model whose forward overflows (issue 33 item 4) through the HTTP API: every route that would show its
attention answers 422 naming the model, and no answer holds a bare NaN or Infinity."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from edited import overflowing
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from tests.app.started import serving

BODY = {"text": "The cat sat on the mat.", "model": "huge"}


@pytest.fixture(scope="module")
def huge(tiny_checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama with every query and key weight x 1e30: its attention scores overflow float32."""
    return overflowing(tiny_checkpoints["llama"], tmp_path_factory.mktemp("non-finite") / "huge")


@pytest.fixture(scope="module")
def client(
    huge: Path, tiny_checkpoints: dict[str, Path], make_settings: Callable[..., Settings]
) -> Iterator[TestClient]:
    settings = make_settings(models={"huge": huge, "llama": tiny_checkpoints["llama"]}, max_new_tokens=4)
    with serving(create_app(settings)) as test_client:
        yield test_client


ROUTES = {
    "/api/attention": {},
    "/api/attention/compact": {},
    "/api/attention/head": {"layer": 0, "head": 0},
    "/api/analysis": {},
    "/api/rollout": {},
    "/api/flow": {},
}


def _post(client: TestClient, route: str):  # type: ignore[no-untyped-def]
    if route == "/api/compare":  # two inputs, one of them the overflowing model's
        return client.post(route, json={"a": BODY, "b": {**BODY, "model": "llama"}})
    return client.post(route, json={**BODY, **ROUTES[route]})


@pytest.mark.parametrize("route", [*ROUTES, "/api/compare"])
def test_every_route_answers_422_naming_the_model(client: TestClient, route: str) -> None:
    answer = _post(client, route)
    assert answer.status_code == 422, answer.text[:300]
    assert "'huge' computed NaN or an infinity" in answer.json()["detail"]
    assert "NaN," not in answer.text and "Infinity" not in answer.text


def test_head_effects_end_their_stream_with_the_sentence(client: TestClient) -> None:
    """The ablations run after the stream began (its progress lines), so the failure is its last line."""
    answer = client.post("/api/head-effects", json=BODY)
    last = answer.text.strip().splitlines()[-1]
    assert answer.status_code == 200 and '"event":"error"' in last
    assert "'huge' computed NaN or an infinity in its head effects" in last
    assert "NaN," not in answer.text and "Infinity" not in answer.text


def test_a_trace_ends_its_stream_with_the_sentence(client: TestClient) -> None:
    """The forward runs after the stream began (its progress lines), so the failure is its last line, and
    nothing is kept: the overview, a window and a row of the same input answer 422 naming the model."""
    answer = client.post("/api/trace", json=BODY)
    last = answer.text.strip().splitlines()[-1]
    assert answer.status_code == 200 and '"event":"error"' in last
    assert "'huge' computed NaN or an infinity in its trace" in last
    assert "NaN," not in answer.text and "Infinity" not in answer.text


@pytest.mark.parametrize(
    ("route", "extra"),
    [
        ("/api/trace/overview", {}),
        ("/api/trace/window", {"layer": 0, "head": 0}),
        ("/api/trace/row", {"layer": 0, "head": 0, "q": 1}),
    ],
)
def test_a_trace_read_answers_422_naming_the_model(client: TestClient, route: str, extra: dict) -> None:  # type: ignore[type-arg]
    answer = client.post(route, json={**BODY, **extra})
    assert answer.status_code == 422, answer.text[:300]
    assert "'huge' computed NaN or an infinity in its trace" in answer.json()["detail"]


def test_the_other_model_answers(client: TestClient) -> None:
    assert client.post("/api/attention", json={**BODY, "model": "llama"}).status_code == 200
