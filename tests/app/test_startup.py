"""The start and the loads (issue 33 items 1 and 2): the server answers before its startup work ends, and
no model's load holds another model's answers.

Every wait below is on an Event that the test sets; the bounds (STARTUP_S) only turn a hang into a failure.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi.testclient import TestClient

from app.main import create_app
from app.registry import Registry
from app.settings import Settings
from tests.app.started import STARTUP_S, serving

TEXT = "The cat sat on the mat."
DEFAULT = "all-MiniLM-L6-v2"


def _held(loader: Callable[[], Any], entered: threading.Event, release: threading.Event) -> Callable[[], Any]:
    """A loader that says it has started, then waits for `release` before it loads."""
    loads: list[int] = []

    def held() -> Any:
        loads.append(1)
        entered.set()
        release.wait(STARTUP_S)
        return loader()

    held.loads = loads  # type: ignore[attr-defined]
    return held


def _entry(app: Any, name: str) -> Any:
    return next(entry for entry in app.state.service.models.registry if entry.name == name)


def test_the_server_answers_while_the_default_model_loads_and_checks_run(
    make_settings: Callable[..., Settings],
) -> None:
    """The lifespan returns with the default model's load and a startup check both held: /api/health
    answers 200 "loading" and names them, /api/models says "loading" and "checking", another model
    answers, and a request for the default waits for its load and then answers."""
    app = create_app(make_settings())
    service = app.state.service
    loading, release_load = threading.Event(), threading.Event()
    checking, release_check = threading.Event(), threading.Event()
    default = _entry(app, DEFAULT)
    default.loader = _held(default.loader, loading, release_load)

    def held_check() -> str:
        checking.set()
        release_check.wait(STARTUP_S)
        return "encoder"

    service.models.registry = Registry(
        {entry.name: entry.loader for entry in service.models.registry},
        default=DEFAULT,
        checks={"random": held_check},
    )
    with TestClient(app) as client, ThreadPoolExecutor(2) as pool:
        try:
            assert loading.wait(STARTUP_S) and checking.wait(STARTUP_S)
            health = client.get("/api/health")
            assert health.status_code == 200, health.text
            assert health.json() == {
                "status": "loading",
                "model": DEFAULT,
                "device": None,
                "loading": [DEFAULT],
                "checking": ["random"],
            }
            states = {m["name"]: m["state"] for m in client.get("/api/models").json()["models"]}
            assert states == {DEFAULT: "loading", "random": "checking"}
            waiting = pool.submit(client.post, "/api/attention", json={"text": TEXT})
            release_check.set()  # "random" checked: it loads and answers while the default still loads
            other = client.post("/api/attention", json={"text": TEXT, "model": "random"})
            assert other.status_code == 200 and other.json()["model"] == "random"
            assert not waiting.done() and not service.models.loads.started.is_set()
        finally:
            release_check.set()
            release_load.set()
        answer = waiting.result(timeout=STARTUP_S)
        assert answer.status_code == 200 and answer.json()["model"] == DEFAULT
        assert service.models.loads.started.wait(STARTUP_S)
        health = client.get("/api/health").json()
        assert (health["status"], health["device"], health["loading"], health["checking"]) == (
            "ok",
            "cpu",
            [],
            [],
        )
    assert default.loader.loads == [1]  # the startup's load and the request's were one


def test_a_held_load_holds_only_its_own_model(make_settings: Callable[..., Settings]) -> None:
    """Issue 33 item 2: while one model's load is held, requests for it (an attention, a trace's token
    count, which once waited for the load in an encoding thread) wait, and the loaded default answers
    /api/attention, with a single encoding thread (max_concurrency 1). Released, the held requests answer."""
    app = create_app(make_settings(max_concurrency=1))
    entered, release = threading.Event(), threading.Event()
    random = _entry(app, "random")
    random.loader = _held(random.loader, entered, release)
    with serving(app) as client, ThreadPoolExecutor(3) as pool:
        try:
            held = [
                pool.submit(client.post, "/api/trace/tokens", json={"text": TEXT, "model": "random"}),
                pool.submit(client.post, "/api/attention", json={"text": TEXT, "model": "random"}),
            ]
            assert entered.wait(STARTUP_S)
            # Bounded only so that a held encoding thread fails the test instead of hanging it.
            answer = pool.submit(client.post, "/api/attention", json={"text": TEXT}).result(timeout=STARTUP_S)
            assert answer.status_code == 200 and answer.json()["model"] == DEFAULT
            assert not any(request.done() for request in held)
        finally:
            release.set()
        tokens, attention = (request.result(timeout=STARTUP_S) for request in held)
        assert tokens.status_code == 200 and tokens.json()["n"] > 0, tokens.text
        assert attention.status_code == 200 and attention.json()["model"] == "random"
    assert random.loader.loads == [1]


def _poll_health(client: TestClient, status: str) -> dict[str, Any]:
    """/api/health's body once it says `status`, asking nothing else of the server (a monitor's view)."""
    deadline = time.monotonic() + STARTUP_S
    while (body := client.get("/api/health").json())["status"] != status:
        assert time.monotonic() < deadline, f"health never said {status!r}: {body}"
        time.sleep(0.02)
    return body


def test_a_failed_default_load_is_tried_again_by_itself(make_settings: Callable[..., Settings]) -> None:
    """Issue 48 E1: once the default's load failed, health said 503 "unavailable" until some request came
    after the back-off: a monitor that only polls health (a HEALTHCHECK, a load balancer) never brought it
    back. Now the default is loaded again by itself once its back-off has passed."""
    app = create_app(make_settings(load_retry_seconds=0.1, load_retry_max_seconds=0.1))
    default = _entry(app, DEFAULT)
    loader, tries = default.loader, []

    def fails_once() -> Any:
        tries.append(1)
        if len(tries) == 1:
            raise OSError("the disk is not mounted yet")
        return loader()

    default.loader = fails_once
    with serving(app) as client:
        assert _poll_health(client, "ok")["device"] == "cpu"
    assert tries == [1, 1]


def test_health_says_unloaded_once_the_budget_unloaded_the_default(
    make_settings: Callable[..., Settings], minilm: Any
) -> None:
    """Issue 48 E5: a budget that holds one model at a time; the random model's request unloads the default.
    Health then said "loading" with nothing loading; it says "unloaded" (200), and the default's next request
    loads it again."""
    from mha import describe_checkpoint

    facts = describe_checkpoint(None)
    assert facts is not None
    # Room for the default (what it holds, or its weights on disk, the registry's estimate, whichever is
    # more) and a MiB: the random model's ~13 MB of weights never fit beside it.
    app = create_app(make_settings(models_max_bytes=max(minilm.nbytes, facts.size_bytes) + 2**20))
    with serving(app) as client:
        assert client.post("/api/attention", json={"text": TEXT, "model": "random"}).status_code == 200
        health = client.get("/api/health")
        assert health.status_code == 200
        assert health.json() == {
            "status": "unloaded",
            "model": DEFAULT,
            "device": None,
            "loading": [],
            "checking": [],
        }
        assert client.post("/api/attention", json={"text": TEXT}).status_code == 200
        assert client.get("/api/health").json()["status"] == "ok"


def test_a_load_waiting_for_the_imports_is_loading_everywhere(make_settings: Callable[..., Settings]) -> None:
    """Issue 48 E1: every load first waits for transformers' one-time warm imports. While the startup holds
    them, the default's load and a request's load of another model are in flight but not yet in the
    registry: health and /api/models both say "loading" for them, never "checking" or "available", and both
    requests answer once the imports are done."""
    app = create_app(make_settings())
    service = app.state.service
    warming, release = threading.Event(), threading.Event()
    warm = service.models.loads._prepare

    def held() -> None:
        warming.set()
        release.wait(STARTUP_S)
        warm()

    service.models.loads._prepare = held
    with TestClient(app) as client, ThreadPoolExecutor(1) as pool:
        try:
            assert warming.wait(STARTUP_S)
            other = pool.submit(client.post, "/api/attention", json={"text": TEXT, "model": "random"})
            wait_for = time.monotonic() + STARTUP_S
            while "random" not in (health := client.get("/api/health").json())["loading"]:
                assert time.monotonic() < wait_for, health
                time.sleep(0.01)
            assert (health["status"], health["loading"]) == ("loading", [DEFAULT, "random"])
            states = {m["name"]: m["state"] for m in client.get("/api/models").json()["models"]}
            assert states == {DEFAULT: "loading", "random": "loading"}
        finally:
            release.set()
        assert other.result(timeout=STARTUP_S).status_code == 200
        assert client.post("/api/attention", json={"text": TEXT}).status_code == 200
