"""POST /api/snapshot, the page's "Save as HTML": the file as an attachment, the view it opens on, its size
bounds, the refusals, and the service's parts reused (the page's forward, one build for identical requests
in flight). tests/app/test_snapshot.py tests the builder; tests/browser/test_snapshot.py opens a download."""

from __future__ import annotations

import base64
import gzip
import json
import re
import threading
from collections.abc import Hashable, Iterator
from concurrent.futures import ThreadPoolExecutor
from html import unescape
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.schemas.snapshot import MAX_MAX_BYTES, MIN_MAX_BYTES
from app.snapshot import served
from tests.app.conftest import make_settings
from tests.app.started import serving
from tests.seq2seq_checkpoints import build_seq2seq_checkpoint
from tests.spies import record_calls

MODEL = "all-MiniLM-L6-v2"
T5 = "t5-tiny"
TEXT = "The cat sat on the mat because it was tired."
LONG_TEXT = " ".join(["The quick brown fox jumps over the lazy dog while the cat sleeps."] * 12)
NAME = re.compile(r'attachment; filename="headscope-[A-Za-z0-9._-]+-[0-9a-f]{8}\.html"')


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    t5 = build_seq2seq_checkpoint("t5", tmp_path_factory.mktemp("t5"))
    with serving(create_app(make_settings(models={T5: t5}))) as test_client:
        yield test_client


def carried(html: str) -> dict[str, Any]:
    block = re.search(r'<script type="application/json" id="headscope-snapshot">(.*?)</script>', html, re.S)
    assert block is not None
    return json.loads(block.group(1))  # type: ignore[no-any-return]


def snapshot(client: TestClient, **body: Any) -> Any:
    return client.post("/api/snapshot", json={"text": TEXT, **body})


def test_the_file_is_an_attachment_opening_on_the_selected_head(client: TestClient) -> None:
    answer = snapshot(client, layer=2, head=5)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "text/html; charset=utf-8"
    assert answer.headers["content-encoding"] == "gzip"  # TestClient asks for it, and reads it unzipped
    assert NAME.fullmatch(answer.headers["content-disposition"])
    assert f"headscope-{MODEL}-" in answer.headers["content-disposition"]
    html = answer.text
    assert html.startswith("<!doctype html>")
    found = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">', html)
    policy = unescape(found.group(1)) if found else ""
    assert "connect-src 'none'" in policy and "script-src 'sha256-" in policy
    data = carried(html)
    assert data["state"] | {"layer": 2, "head": 5, "kind": "encoder"} == data["state"]
    assert data["input"]["text"] == TEXT and data["input"]["model"] == MODEL
    assert "head:encoder:2:5" in data["answers"]  # the head it opens on is carried exactly
    # A client that does not take gzip gets the same file, unzipped.
    plain = client.post(
        "/api/snapshot", json={"text": TEXT, "layer": 2, "head": 5}, headers={"Accept-Encoding": "identity"}
    )
    assert "content-encoding" not in plain.headers and plain.content == answer.content
    # Another input of the same model takes another name.
    other = snapshot(client, text="Another text.", layer=2, head=5)
    assert other.headers["content-disposition"] != answer.headers["content-disposition"]


def test_a_view_opens_as_the_page_asked_for_it(client: TestClient) -> None:
    """Words and weight × value norm as the page's run had them; a layer's mean; an encoder-decoder's kind."""
    data = carried(snapshot(client, words=True, weighting="norm", layer=3, head="mean").text)
    assert data["state"] | {"words": True, "weighting": "norm", "layer": 3, "head": "mean"} == data["state"]
    assert data["input"]["words"] is True and data["input"]["weighting"] == "norm"
    statistics = json.loads(gzip.decompress(base64.b64decode(data["answers"]["analysis:encoder"]["gzip"])))
    assert statistics["words"] is True
    assert "head:encoder:3:0" in data["answers"]  # the mean's exact neighbours start at its layer's head 0
    body = {"text": "The house is wonderful.", "target": "Das Haus ist wunderbar.", "model": T5}
    data = carried(snapshot(client, **body, kind="decoder", layer=1, head=2).text)
    assert (
        data["state"] | {"kind": "decoder", "layer": 1, "head": 2, "target": body["target"]} == data["state"]
    )
    assert next(iter(key for key in data["answers"] if key.startswith("head:"))) == "head:decoder:1:2"


def test_max_bytes_is_bounded_and_past_it_the_grid_is_pooled(client: TestClient) -> None:
    # The floor fits the page's own assets and a short run, whole.
    small = snapshot(client, max_bytes=MIN_MAX_BYTES)
    assert small.status_code == 200 and len(small.text.encode()) <= MIN_MAX_BYTES
    assert "Every head is pooled" not in small.text
    # 128 tokens of MiniLM need 3.3 MB whole (docs/snapshots.md): at the floor they are pooled, and say so.
    pooled = snapshot(client, text=LONG_TEXT, max_bytes=MIN_MAX_BYTES)
    assert pooled.status_code == 200 and len(pooled.text.encode()) <= MIN_MAX_BYTES
    assert "Every head is pooled to" in pooled.text
    whole = snapshot(client, text=LONG_TEXT)
    assert "Every head is pooled" not in whole.text and len(whole.text.encode()) > MIN_MAX_BYTES
    for bad in (MIN_MAX_BYTES - 1, MAX_MAX_BYTES + 1, 0, 2.5, "32MiB", True):
        refused = snapshot(client, max_bytes=bad)
        assert refused.status_code == 422 and refused.json()["detail"].startswith("max_bytes: "), bad


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"layer": 6}, 422, "layer 6 is out of range"),
        ({"head": 12}, 422, "head 12 is out of range"),
        ({"head": "max"}, 422, "head.aggregate: Input should be 'mean'"),
        ({"head": -1}, 422, "head.index: Input should be greater than or equal to 0"),
        ({"kind": "cross"}, 422, 'kind "cross" needs an encoder-decoder model'),
        ({"target": "Ziel."}, 422, "only encoder-decoder models"),
        ({"model": "nope"}, 404, "unknown model 'nope'"),
        ({"text": "   "}, 422, "text: text is blank"),
        ({"max_new_tokens": 3}, 422, "encoder"),
        ({"surprise": 1}, 422, "surprise: Extra inputs are not permitted"),
        ({"model": T5, "words": True}, 422, "words: true is not available for an encoder-decoder"),
    ],
)
def test_bad_bodies_are_refused_with_what_to_fix(
    client: TestClient, body: dict[str, Any], status: int, says: str
) -> None:
    answer = snapshot(client, **body)
    assert answer.status_code == status and says in answer.json()["detail"], answer.text


def test_the_page_s_forward_is_the_one_the_file_is_built_from(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = client.app.state.service  # type: ignore[attr-defined]
    forwards = record_calls(monkeypatch, service.models.registry.loaded(MODEL), "attend_batch")
    text = "A text the page has just drawn."
    page = client.post("/api/attention/compact?scheme=abs-uint8-key-major&bits=auto", json={"text": text})
    assert page.status_code == 200 and len(forwards) == 1
    for layer, head in ((0, 0), (4, 7)):  # two files of the run, neither runs the model again
        assert snapshot(client, text=text, layer=layer, head=head).status_code == 200
    assert len(forwards) == 1


def test_identical_requests_in_flight_share_one_build(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first build waits until the second request has joined its flight; both get its one file."""
    flights = client.app.state.service.answers.flights  # type: ignore[attr-defined]
    joined, both = [], threading.Event()
    join = flights.join

    def counted_join(key: tuple[Hashable, ...], start: Any) -> Any:
        if key[0] == "snapshot.gz":
            joined.append(key)
            if len(joined) == 2:
                both.set()
        return join(key, start)

    builds: list[Any] = []
    build = served.build_view

    def held_build(*args: Any, **options: Any) -> Any:
        builds.append(args[0])
        assert both.wait(60), "the second request never joined the build in flight"
        return build(*args, **options)

    monkeypatch.setattr(flights, "join", counted_join)
    monkeypatch.setattr(served, "build_view", held_build)
    body = {"text": "Two clients save this run at once.", "layer": 1, "head": 3}
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda _: client.post("/api/snapshot", json=body), range(2)))
    assert [a.status_code for a in answers] == [200, 200] and answers[0].content == answers[1].content
    assert len(joined) == 2 and len(builds) == 1
