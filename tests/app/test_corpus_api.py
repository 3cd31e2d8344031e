"""The corpus routes: finished runs of HEADSCOPE_RUNS_DIR listed by name, read back to the contract,
and never a path from a request."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from corpus_fixture import STATS, random_values, sentences, write_demo_runs, write_run
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from tests.app.started import serving

LAYERS, HEADS, TEXTS = 2, 3, 12


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    runs = write_demo_runs(tmp_path_factory.mktemp("runs"), layers=LAYERS, heads=HEADS, texts=TEXTS, seed=1)
    root, texts = runs["root"], runs["texts"]
    write_run(root / "unfinished", texts[:3], random_values(3, LAYERS, HEADS, seed=3), complete=False)
    (root / "notes.txt").write_text("not a run")
    (root / "empty").mkdir()
    outside = write_run(tmp_path_factory.mktemp("outside") / "secret", texts[:3], random_values(3, 1, 1))
    (root / "linked-out").symlink_to(outside, target_is_directory=True)
    return runs


@pytest.fixture(scope="module")
def client(runs: dict[str, object], make_settings: Callable[..., Settings]) -> Iterator[TestClient]:
    with serving(create_app(make_settings(runs_dir=runs["root"]))) as test_client:
        yield test_client


def test_the_list_names_finished_runs_only(client: TestClient) -> None:
    answer = client.get("/api/corpus/runs").json()
    assert answer["configured"] is True and answer["hint"] is None
    # unfinished (complete: false), a file, an empty folder and a link out of the folder are not runs.
    assert [run["name"] for run in answer["runs"]] == ["minilm-demo", "unserved"]
    demo = answer["runs"][0]
    assert demo["model"] == "all-MiniLM-L6-v2" and demo["served"] is True
    assert (demo["layers"], demo["heads"], demo["kind"], demo["words"]) == (LAYERS, HEADS, "self", False)
    assert demo["weighting"] == "weight"  # its run.json names none, as runs before --weighting
    assert demo["counts"]["texts"] == TEXTS and demo["stats"] == list(STATS)
    assert answer["runs"][1]["served"] is False  # "not-served-here" is no model of this server


def test_a_run_gives_its_per_head_table(client: TestClient, runs: dict[str, object]) -> None:
    values = runs["values"]
    assert isinstance(values, dict)
    answer = client.get("/api/corpus/runs/minilm-demo").json()
    assert answer["run"]["complete"] is True and answer["name"] == "minilm-demo"
    table = answer["per_head"]
    assert table["layer"] == [0, 0, 0, 1, 1, 1] and table["head"] == [0, 1, 2, 0, 1, 2]
    assert table["count"] == [TEXTS] * (LAYERS * HEADS)
    # Exact: the fixture wrote these very float64 numbers, and JSON carries a float64 round trip.
    expected = [values["entropy"][:, layer, head].mean() for layer in range(LAYERS) for head in range(HEADS)]
    assert table["entropy_mean"] == expected
    labels = [key for key in table if key.startswith("label_")]
    assert "label_previous_token" in labels and "label_mixed" in labels
    assert all(sum(table[key][i] for key in labels) == TEXTS for i in range(LAYERS * HEADS))


def test_a_head_gives_each_texts_value_and_its_examples(client: TestClient, runs: dict[str, object]) -> None:
    values, texts = runs["values"], runs["texts"]
    assert isinstance(values, dict) and isinstance(texts, list)
    answer = client.get("/api/corpus/runs/minilm-demo/heads/1/2", params={"stat": "previous"}).json()
    column = values["previous"][:, 1, 2]
    assert answer["values"] == column.tolist()  # exact: float64 through Parquet and JSON
    assert answer["ids"] == [text["id"] for text in texts]
    assert answer["lines"] == list(range(1, TEXTS + 1))
    top = np.argsort(-column, kind="stable")[:5]
    assert [example["line"] for example in answer["top"]] == [texts[t]["line"] for t in top]
    assert [example["rank"] for example in answer["top"]] == [1, 2, 3, 4, 5]
    assert answer["top"][0]["value"] == column.max() and answer["bottom"][0]["value"] == column.min()
    first = answer["top"][0]
    assert (first["snippet"], first["snippet_pair"]) == (texts[top[0]]["text"], texts[top[0]]["text_pair"])
    assert first["cut"] is False  # short texts: the snippet is the whole


@pytest.mark.parametrize("run_format", [2, 1])
def test_an_example_is_a_snippet_and_its_line_opens_it_whole(
    run_format: int, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    """An example carries its text's first SNIPPET_CHARS characters (its pair's too) and its line; the texts
    route gives the whole. A run of the first format kept whole texts in examples.parquet: it is still
    read, its snippets cut on the way out."""
    texts = sentences(3)
    texts[1] = {**texts[1], "text": "long " * 200, "text_pair": "pair " * 100}  # 1,000 and 500 characters
    values = random_values(3, 1, 1, seed=2)
    values["entropy"][:, 0, 0] = [0.1, 2.9, 0.2]  # the long text ranks first
    write_run(tmp_path / "run", texts, values, format=run_format)
    with serving(create_app(make_settings(runs_dir=tmp_path))) as client:
        answer = client.get("/api/corpus/runs/run/heads/0/0", params={"stat": "entropy"}).json()
        first, second = answer["top"][:2]
        assert first["line"] == 2 and first["cut"] is True
        assert (first["snippet"], first["snippet_pair"]) == ("long " * 60, "pair " * 60)  # 300 characters
        assert (second["snippet"], second["snippet_pair"]) == (texts[2]["text"], texts[2]["text_pair"])
        assert second["cut"] is False
        whole = client.get("/api/corpus/runs/run/texts/2").json()
        assert (whole["text"], whole["text_pair"]) == (texts[1]["text"], texts[1]["text_pair"])


def test_a_text_opens_by_its_line(client: TestClient, runs: dict[str, object]) -> None:
    texts = runs["texts"]
    assert isinstance(texts, list)
    for record in (texts[0], texts[2], texts[-1]):  # a pair on every third
        answer = client.get(f"/api/corpus/runs/minilm-demo/texts/{record['line']}").json()
        assert answer == {"name": "minilm-demo", **record}


def test_a_bad_record_or_a_shard_gone_is_no_text(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    texts = sentences(4)
    del texts[1]  # line 2: a bad record, so in no shard's texts
    write_run(tmp_path / "holed", texts, random_values(3, 1, 1))
    write_run(tmp_path / "run", sentences(3), random_values(3, 1, 1))
    (tmp_path / "run" / "shards" / "00000.texts.parquet").unlink()
    # A shard's texts linked from outside the run are not read, as a run's files linked from outside.
    outside = write_run(tmp_path.parent / f"{tmp_path.name}-outside", sentences(3), random_values(3, 1, 1))
    write_run(tmp_path / "linked", sentences(3), random_values(3, 1, 1))
    (tmp_path / "linked" / "shards" / "00000.texts.parquet").unlink()
    (tmp_path / "linked" / "shards" / "00000.texts.parquet").symlink_to(
        outside / "shards" / "00000.texts.parquet"
    )
    with serving(create_app(make_settings(runs_dir=tmp_path))) as client:
        response = client.get("/api/corpus/runs/holed/texts/2")
        assert response.status_code == 404 and "line 2 of corpus run 'holed' is a bad record" in response.text
        for name in ("run", "linked"):
            response = client.get(f"/api/corpus/runs/{name}/texts/2")
            assert response.status_code == 409 and "shards/00000.texts.parquet is missing" in response.text


@pytest.mark.parametrize(
    ("path", "status", "words"),
    [
        ("/api/corpus/runs/nope", 404, "finished runs: minilm-demo, unserved"),
        ("/api/corpus/runs/unfinished", 404, "unknown corpus run 'unfinished'"),
        ("/api/corpus/runs/linked-out", 404, "unknown corpus run 'linked-out'"),
        ("/api/corpus/runs/notes.txt", 404, "unknown corpus run"),
        ("/api/corpus/runs/..", 404, ""),  # a client normalises it away: no such route
        ("/api/corpus/runs/%2e%2e", 404, "unknown corpus run '..'"),
        # "/" decoded before routing: no route takes a name with one.
        ("/api/corpus/runs/%2e%2e%2fminilm-demo", 404, "Not Found"),
        ("/api/corpus/runs/%2Fetc", 404, "Not Found"),
        (
            "/api/corpus/runs/minilm-demo/heads/2/0?stat=entropy",
            422,
            "layer 2 out of range: the run's model has 2",
        ),
        (
            "/api/corpus/runs/minilm-demo/heads/0/3?stat=entropy",
            422,
            "head 3 out of range: the run's model has 3",
        ),
        # A path's integer is digits only: no sign, space, point, underscore or other script's digit.
        ("/api/corpus/runs/minilm-demo/heads/-1/0?stat=entropy", 422, "layer: Input should be a non-neg"),
        ("/api/corpus/runs/minilm-demo/heads/1.0/0?stat=entropy", 422, "layer: Input should be a non-neg"),
        ("/api/corpus/runs/minilm-demo/heads/0/%201?stat=entropy", 422, "head: Input should be a non-neg"),
        ("/api/corpus/runs/minilm-demo/heads/0/+1?stat=entropy", 422, "written in the digits 0-9"),
        ("/api/corpus/runs/minilm-demo/texts/%201", 422, "line: Input should be a non-negative whole"),
        ("/api/corpus/runs/minilm-demo/texts/1.0", 422, "written in the digits 0-9"),
        ("/api/corpus/runs/minilm-demo/texts/1_0", 422, "written in the digits 0-9"),
        ("/api/corpus/runs/minilm-demo/texts/%D9%A1", 422, "written in the digits 0-9"),  # Arabic-Indic 1
        ("/api/corpus/runs/minilm-demo/texts/" + "9" * 5000, 422, "line: "),
        (
            "/api/corpus/runs/minilm-demo/heads/0/0?stat=nope",
            422,
            "unknown statistic 'nope'; this run has: entropy",
        ),
        ("/api/corpus/runs/minilm-demo/heads/0/0", 422, "stat: Field required"),
        ("/api/corpus/runs/unfinished/heads/0/0?stat=entropy", 404, "unknown corpus run"),
        ("/api/corpus/runs/minilm-demo/texts/13", 404, "has 12 records; there is no line 13"),
        ("/api/corpus/runs/minilm-demo/texts/0", 422, "line"),
        ("/api/corpus/runs/minilm-demo/texts/x", 422, "line"),
        ("/api/corpus/runs/unfinished/texts/1", 404, "unknown corpus run"),
    ],
)
def test_what_is_no_run_is_refused_clearly(client: TestClient, path: str, status: int, words: str) -> None:
    response = client.get(path)
    assert response.status_code == status, response.text
    assert words in response.json()["detail"]


def test_without_a_runs_dir_the_list_says_how_to_set_it(make_settings: Callable[..., Settings]) -> None:
    with serving(create_app(make_settings())) as client:
        answer = client.get("/api/corpus/runs").json()
        assert answer == {"configured": False, "hint": answer["hint"], "runs": []}
        assert "HEADSCOPE_RUNS_DIR" in answer["hint"]
        response = client.get("/api/corpus/runs/minilm-demo")
        assert response.status_code == 404 and "HEADSCOPE_RUNS_DIR" in response.json()["detail"]


def test_a_norm_run_says_so_in_the_list_and_its_detail(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    """A --weighting norm run: the list and the run's answer name its weighting, as the page shows it."""
    write_run(tmp_path / "by-norm", sentences(3), random_values(3, 1, 2), weighting="norm")
    write_run(tmp_path / "by-weight", sentences(3), random_values(3, 1, 2), weighting="weight")
    with serving(create_app(make_settings(runs_dir=tmp_path))) as client:
        listed = {run["name"]: run["weighting"] for run in client.get("/api/corpus/runs").json()["runs"]}
        assert listed == {"by-norm": "norm", "by-weight": "weight"}
        detail = client.get("/api/corpus/runs/by-norm").json()
        assert detail["weighting"] == "norm" and detail["run"]["settings"]["weighting"] == "norm"


def test_a_run_rewritten_in_place_is_read_afresh(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    texts = sentences(4)
    write_run(tmp_path / "run", texts, random_values(4, 1, 2, seed=5))
    with serving(create_app(make_settings(runs_dir=tmp_path))) as client:
        before = client.get("/api/corpus/runs/run/heads/0/1", params={"stat": "max"}).json()["values"]
        assert client.get("/api/corpus/runs/run/heads/0/1", params={"stat": "max"}).json()["values"] == before
        again = random_values(4, 1, 2, seed=6)
        write_run(tmp_path / "run", texts, again)
        stamp = time.time() + 10  # a new mtime even on a file system with coarse timestamps
        for file in (tmp_path / "run").iterdir():
            os.utime(file, (stamp, stamp))
        after = client.get("/api/corpus/runs/run/heads/0/1", params={"stat": "max"}).json()["values"]
        assert after == again["max"][:, 0, 1].tolist() != before


def test_a_damaged_run_is_a_clear_409(tmp_path: Path, make_settings: Callable[..., Settings]) -> None:
    write_run(tmp_path / "run", sentences(3), random_values(3, 1, 1))
    (tmp_path / "run" / "per_text.parquet").write_bytes(b"not parquet")
    (tmp_path / "run" / "per_head.parquet").write_bytes(b"PAR1")
    with serving(create_app(make_settings(runs_dir=tmp_path))) as client:
        for path in ("/api/corpus/runs/run", "/api/corpus/runs/run/heads/0/0?stat=entropy"):
            response = client.get(path)
            assert response.status_code == 409, response.text
            assert "corpus run 'run'" in response.json()["detail"]


# run.json with one field of the wrong type, by run name: (where in run.json, the value, what the 409 says).
WRONG_FIELDS = {
    "layers-a-string": (("model", "layers"), "2", "model.layers: Input should be a valid integer"),
    "layers-negative": (("model", "layers"), -1, "model.layers: Input should be greater than or equal to 1"),
    "heads-a-float": (("model", "heads"), 3.0, "model.heads: Input should be a valid integer"),
    "records-a-boolean": (("counts", "records"), True, "counts.records: Input should be a valid integer"),
    "shard-size-zero": (("settings", "shard_size"), 0, "settings.shard_size: Input should be greater"),
    "words-a-string": (("settings", "words"), "yes", "settings.words: Input should be a valid boolean"),
    "weighting-unknown": (("settings", "weighting"), "size", "settings.weighting: Input should be 'weight'"),
    "stat-a-number": (("stats",), ["entropy", 3], "stats.1: Input should be a valid string"),
    "model-null": (("model",), None, "model: Input should be"),
    "no-counts": (("counts",), ..., "counts: Field required"),
}


def test_a_run_json_field_of_the_wrong_type_is_a_409_naming_it(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    write_run(tmp_path / "fine", sentences(3), random_values(3, 1, 2))
    for name, (where, value, _) in WRONG_FIELDS.items():
        write_run(tmp_path / name, sentences(3), random_values(3, 1, 2))
        meta = json.loads((tmp_path / name / "run.json").read_text())
        parent = meta
        for key in where[:-1]:
            parent = parent[key]
        if value is ...:
            del parent[where[-1]]
        else:
            parent[where[-1]] = value
        (tmp_path / name / "run.json").write_text(json.dumps(meta))
    with serving(create_app(make_settings(runs_dir=tmp_path))) as client:
        for name, (_, _, says) in WRONG_FIELDS.items():
            for path in ("", "/heads/0/0?stat=entropy", "/texts/1"):
                response = client.get(f"/api/corpus/runs/{name}{path}")
                assert response.status_code == 409, response.text
                detail = response.json()["detail"]
                assert (
                    detail.startswith(f"corpus run {name!r}: run.json breaks the format: ") and says in detail
                )
        # The list names the runs it can describe; the others are logged (test_corpus_listing.py).
        assert [run["name"] for run in client.get("/api/corpus/runs").json()["runs"]] == ["fine"]


def test_the_corpus_page_and_the_main_pages_link_to_it(client: TestClient) -> None:
    page = client.get("/corpus")
    assert page.status_code == 200 and 'id="corpus-grid"' in page.text and "js/corpus.js" in page.text
    assert 'href="corpus"' in client.get("/?text=").text
    # The main page's view parameter leads there, the rest of the link kept.
    moved = client.get("/?view=corpus&run=minilm-demo&stat=entropy&layer=2", follow_redirects=False)
    assert moved.status_code == 303
    assert moved.headers["location"] == "/corpus?run=minilm-demo&stat=entropy&layer=2"


def test_an_unchanged_run_is_read_once(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    path = "/api/corpus/runs/minilm-demo/heads/0/1"
    first = client.get(path, params={"stat": "local"})

    def unreadable(*args: object, **kwargs: object) -> None:
        raise OSError("read again")

    monkeypatch.setattr("app.service.corpus.pq.read_table", unreadable)
    assert client.get(path, params={"stat": "local"}).content == first.content  # kept
    assert client.get(path, params={"stat": "first"}).status_code == 409  # another head is read: it fails
