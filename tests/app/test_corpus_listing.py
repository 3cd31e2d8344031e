"""The list of corpus runs kept between requests (app/service/corpus_listing.py): what changes on disk
shows at the next listing, and what did not change is not read again."""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from pathlib import Path

import pytest
from corpus_fixture import random_values, sentences, write_run

import app.service.corpus_listing as corpus_listing
from app.service.corpus_listing import RunListing

SERVED = {"all-MiniLM-L6-v2"}


def write(root: Path, name: str, **kwargs: object) -> Path:
    return write_run(root / name, sentences(3), random_values(3, 1, 2), **kwargs)  # type: ignore[arg-type]


def listed(listing: RunListing, served: set[str] = SERVED) -> dict[str, dict[str, object]]:
    return {run["name"]: run for run in json.loads(listing.body(served))["runs"]}


def touch(path: Path, later: int) -> None:
    """A distinct mtime: two writes within one tick of a coarse file-system clock would share one."""
    stamp = path.stat().st_mtime_ns + later * 10**9
    os.utime(path, ns=(stamp, stamp))


def edit(folder: Path, later: int, **fields: object) -> None:
    """Rewrite run.json in place (same inode), some fields changed."""
    meta = json.loads((folder / "run.json").read_text())
    (folder / "run.json").write_text(json.dumps({**meta, **fields}))
    touch(folder / "run.json", later)


def test_a_new_run_appears_a_changed_one_is_read_again_a_removed_one_goes(tmp_path: Path) -> None:
    write(tmp_path, "a")
    listing = RunListing(tmp_path)
    assert list(listed(listing)) == ["a"]

    write(tmp_path, "b", model="other")
    assert list(listed(listing)) == ["a", "b"] and listed(listing)["b"]["served"] is False

    edit(tmp_path / "a", 1, finished="2027-01-01T00:00:00Z")  # run.json rewritten in place
    assert listed(listing)["a"]["finished"] == "2027-01-01T00:00:00Z"

    edit(tmp_path / "a", 2, complete=False)  # a run resumed: unfinished again
    assert list(listed(listing)) == ["b"]
    edit(tmp_path / "a", 3, complete=True)
    assert list(listed(listing)) == ["a", "b"]

    shutil.rmtree(tmp_path / "b")
    assert list(listed(listing)) == ["a"]

    # Replaced: another run renamed into its place (a new folder and run.json under the same name).
    write(tmp_path.parent / f"{tmp_path.name}-new", "a", model="replaced")
    shutil.rmtree(tmp_path / "a")
    (tmp_path.parent / f"{tmp_path.name}-new" / "a").rename(tmp_path / "a")
    assert listed(listing)["a"]["model"] == "replaced"
    assert listing.names() == ["a"]


def test_a_file_gone_or_linked_from_outside_takes_the_run_off_the_list(tmp_path: Path) -> None:
    write(tmp_path, "a")
    outside = write(tmp_path.parent / f"{tmp_path.name}-outside", "x")
    listing = RunListing(tmp_path)
    assert list(listed(listing)) == ["a"]
    (tmp_path / "a" / "examples.parquet").unlink()
    touch(tmp_path / "a", 1)  # the folder changed (its mtime within the same tick otherwise)
    assert listed(listing) == {}
    (tmp_path / "a" / "examples.parquet").symlink_to(outside / "examples.parquet")
    touch(tmp_path / "a", 2)
    assert listed(listing) == {}
    (tmp_path / "a" / "examples.parquet").unlink()
    shutil.copy(outside / "examples.parquet", tmp_path / "a" / "examples.parquet")
    touch(tmp_path / "a", 3)
    assert list(listed(listing)) == ["a"]


def test_an_unchanged_folder_is_not_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("a", "b", "c"):
        write(tmp_path, name)
    (tmp_path / "notes.txt").write_text("not a run")
    looked: list[str] = []
    find = corpus_listing.find

    def counted(root: Path, name: str, cache: object = None) -> object:
        looked.append(name)
        return find(root, name)

    monkeypatch.setattr(corpus_listing, "find", counted)
    listing = RunListing(tmp_path)
    first = listing.body(SERVED)
    assert sorted(looked) == ["a", "b", "c"]  # a file is no folder: not looked at
    assert listing.body(SERVED) is first and sorted(looked) == ["a", "b", "c"]  # nothing read, nor encoded
    edit(tmp_path / "b", 1, finished="later")
    assert json.loads(listing.body(SERVED))["runs"][1]["finished"] == "later"
    assert sorted(looked) == ["a", "b", "b", "c"]
    # Other served models: encoded again, nothing read.
    assert [run["served"] for run in json.loads(listing.body(set()))["runs"]] == [False] * 3
    assert len(looked) == 4


def test_a_run_json_that_breaks_the_format_is_left_out_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(tmp_path, "a")
    write(tmp_path, "b")
    edit(tmp_path / "b", 1, model={"name": "m", "layers": "2", "heads": 2})
    listing = RunListing(tmp_path)
    with caplog.at_level(logging.WARNING, logger="app.service.corpus_listing"):
        assert list(listed(listing)) == ["a"]
        assert list(listed(listing)) == ["a"]
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 1 and "model.layers: Input should be a valid integer" in warnings[0]


def test_a_runs_folder_gone_lists_nothing_and_back_lists_again(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    write(root, "a")
    listing = RunListing(root)
    assert list(listed(listing)) == ["a"]
    root.rename(tmp_path / "elsewhere")
    assert listed(listing) == {}
    (tmp_path / "elsewhere").rename(root)
    assert list(listed(listing)) == ["a"]


def test_listings_in_many_threads_while_runs_are_added(tmp_path: Path) -> None:
    write(tmp_path, "a")
    listing = RunListing(tmp_path)
    answers: list[list[str]] = []
    failures: list[BaseException] = []

    def list_often() -> None:
        try:
            for _ in range(30):
                answers.append(list(listed(listing)))
        except BaseException as error:  # reported by the assert below
            failures.append(error)

    threads = [threading.Thread(target=list_often) for _ in range(4)]
    for thread in threads:
        thread.start()
    for index in range(4):
        write(tmp_path, f"new-{index}")
    for thread in threads:
        thread.join()
    assert not failures
    # Every answer is a whole state: "a" and some of the new runs, in order.
    assert all(names[0] == "a" and names == sorted(names) for names in answers)
    assert list(listed(listing)) == ["a", "new-0", "new-1", "new-2", "new-3"]
