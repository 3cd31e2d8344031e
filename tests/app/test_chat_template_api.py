"""A model's chat template is untrusted (issue 33 item 3) through the HTTP API: a template that loops,
raises or is not Jinja answers 422 with a sentence naming the template on every route that renders one,
and while one loops to its time limit, another model's answers are not held up."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from mha.text import chat
from tests.app.started import serving

TEMPLATES = {
    "looping": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "raising": "{{ raise_exception('this model takes no user turns') }}",
    "broken": "{% for %}",
}
SAYS = {
    "looping": "chat template took longer than",
    "raising": "chat template refused this input: this model takes no user turns",
    "broken": "chat template is not valid Jinja",
}


@pytest.fixture(scope="module")
def client(
    tiny_checkpoints: dict[str, Path],
    make_settings: Callable[..., Settings],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[TestClient]:
    root = tmp_path_factory.mktemp("templates")
    models = {"llama": tiny_checkpoints["llama"]}
    for name, template in TEMPLATES.items():
        folder = shutil.copytree(tiny_checkpoints["llama"], root / name)
        (folder / "chat_template.jinja").write_text(template, encoding="utf-8")
        models[name] = folder
    with serving(create_app(make_settings(models=models, max_new_tokens=4))) as test_client:
        yield test_client


ROUTES = {
    "/api/attention": {},
    "/api/attention/compact": {},
    "/api/head-effects": {},
    "/api/trace/tokens": {},
}


# The looping template's render limit here: it never ends, so any limit stops it, and each render of it
# spins on a core until then (2 s at RENDER_SECONDS, the limit tests/mha/test_chat_template.py holds). The
# others keep RENDER_SECONDS: theirs must end within it, on a busy machine too.
LOOP_LIMIT_S = 0.25


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("model", list(TEMPLATES))
def test_a_failing_template_is_a_422_naming_it(
    client: TestClient, model: str, route: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if model == "looping":
        monkeypatch.setattr(chat, "RENDER_SECONDS", LOOP_LIMIT_S)
    answer = client.post(route, json={"text": "Hello there.", "model": model, "chat": True, **ROUTES[route]})
    assert answer.status_code == 422, answer.text
    assert SAYS[model] in answer.json()["detail"]
    # The model itself still answers without its template.
    plain = client.post("/api/attention", json={"text": "Hello there.", "model": model})
    assert plain.status_code == 200


def test_a_looping_template_holds_up_no_other_model(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two head-effects requests whose template loops (the render limit raised to 8 s, so they are still
    looping) do not keep another model's attention from being answered: their renders wait on their own
    threads, not in the encoding threads every model shares."""
    monkeypatch.setattr(chat, "RENDER_SECONDS", 8.0)
    answers: dict[int, int] = {}

    def looping(index: int) -> None:
        body = {"text": f"Loop {index}.", "model": "looping", "chat": True}
        answers[index] = client.post("/api/head-effects", json=body).status_code

    threads = [threading.Thread(target=looping, args=(index,)) for index in range(2)]
    for thread in threads:
        thread.start()
    other = client.post("/api/attention", json={"text": "The cat sat on the mat.", "model": "llama"})
    assert other.status_code == 200
    still = [thread.is_alive() for thread in threads]
    for thread in threads:
        thread.join()
    assert answers == {0: 422, 1: 422}
    assert all(still), "the other model's answer came only after a looping template's limit"
