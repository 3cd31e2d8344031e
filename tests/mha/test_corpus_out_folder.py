"""Nothing outside ``out``, and nothing in it that is not a run's, is overwritten: a folder of other files,
an ``out`` that is a file or lies under one, and what a job killed while aggregating left; and an empty
CSV is an input error, not an empty run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from corpus_files import texts, write_jsonl

from mha.corpus import CorpusInputError, CorpusOutError, CorpusSettingsError, run
from mha.corpus.shards import shard_directory
from mha.corpus.source import count_records, read_records
from mha.model import AttentionModel

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    write_jsonl(path, texts(4))
    return path


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_folder_of_other_files_is_refused_with_their_names(source: Path, tmp_path: Path) -> None:
    """A per_head.parquet that is not ours (the file a run would replace) and a note: refused before the
    model loads, each named, nothing changed or added."""
    out = tmp_path / "theirs"
    out.mkdir()
    (out / "per_head.parquet").write_bytes(b"someone else's table")
    (out / "notes.txt").write_text("keep me")
    before = snapshot(out)
    with pytest.raises(
        CorpusOutError, match=r"holds files but no run\.json.*\(notes\.txt, per_head\.parquet\)"
    ):
        run(source, None, out)
    assert snapshot(out) == before


def test_many_files_are_named_ten_then_counted(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "theirs"
    (out / "shards").mkdir(parents=True)  # a folder counts: a run would write into it
    for k in range(11):
        (out / f"f{k:02d}.txt").write_text("x")
    with pytest.raises(CorpusOutError, match=r"\(f00\.txt, .*, f08\.txt, f09\.txt and 2 more\)"):
        run(source, None, out)


def test_a_run_json_that_is_not_a_runs_is_refused(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    out.mkdir()
    (out / "run.json").write_text("[1, 2]")
    with pytest.raises(CorpusSettingsError, match=r"run\.json is not a corpus run's \(a JSON list\)"):
        run(source, None, out)
    (out / "run.json").unlink()
    (out / "run.json").mkdir()  # not a file: a folder of that name is someone else's
    with pytest.raises(CorpusOutError, match=r"no run\.json.*\(run\.json\)"):
        run(source, None, out)


@pytest.mark.parametrize("below", ["", "sub", "sub/deeper"])
def test_out_that_is_a_file_or_lies_under_one_is_refused(source: Path, tmp_path: Path, below: str) -> None:
    file = tmp_path / "a-file"
    file.write_text("mine")
    out = file / below if below else file
    message = "is not a folder" if not below else f"lies under {file}, which is not a folder"
    with pytest.raises(CorpusOutError, match=message):
        run(source, None, out)
    assert file.read_text() == "mine"


def test_an_empty_existing_folder_is_used(source: Path, tmp_path: Path, minilm: AttentionModel) -> None:
    out = tmp_path / "empty"
    out.mkdir()
    summary = run(source, minilm, out)
    assert summary["complete"] is True and summary["counts"]["texts"] == 4


# Run in a subprocess with os.replace patched to die (os._exit: no `finally`, as under SIGKILL) when
# aggregation renames per_head.parquet into place: write_atomic's temporary file stays behind.
KILLED_WHILE_AGGREGATING = """
import os, sys
from mha.corpus import run
real = os.replace
def replace(source, target):
    if str(target).endswith("per_head.parquet"):
        os._exit(9)
    real(source, target)
os.replace = replace
run(sys.argv[1], None, sys.argv[2], batch=3, shard_size=3, device="cpu")
"""


@pytest.mark.slow
def test_a_rerun_removes_what_a_kill_while_aggregating_left(
    source: Path, tmp_path: Path, minilm: AttentionModel
) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-c", KILLED_WHILE_AGGREGATING, str(source), str(out)]
    assert subprocess.run(command, env=env, cwd=ROOT, timeout=600).returncode == 9
    left = [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
    assert len(left) == 1 and left[0].startswith(".per_head.parquet.")
    assert json.loads((out / "run.json").read_text())["complete"] is False
    stray = shard_directory(out) / ".00000.parquet.4242.tmp"  # a kill while writing a shard, too
    stray.write_bytes(b"half a file")

    summary = run(source, minilm, out, batch=3, shard_size=3)
    assert summary["complete"] is True
    assert not [p for p in out.rglob("*.tmp")]
    assert pq.read_table(out / "per_head.parquet").num_rows == 72
    assert sorted(p.name for p in out.iterdir()) == [
        "errors.jsonl",
        "examples.parquet",
        "per_head.parquet",
        "per_text.parquet",
        "run.json",
        "shards",
    ]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty CSV, no header row"),
        (b"\xef\xbb\xbf", "empty CSV, no header row"),  # a byte-order mark and nothing else
        (b"\n\n", "has no 'text' column"),  # no header: the first row is empty
        (b"title,id\n", "has no 'text' column"),
    ],
)
def test_an_empty_csv_is_an_input_error(content: bytes, message: str, tmp_path: Path) -> None:
    """Refused by the count (what a run reads first) as by the reader, before any folder is made."""
    path = tmp_path / "c.csv"
    path.write_bytes(content)
    with pytest.raises(CorpusInputError, match=message):
        count_records(path)
    with pytest.raises(CorpusInputError, match=message):
        list(read_records(path))
    with pytest.raises(CorpusInputError, match=message):
        run(path, None, tmp_path / "out")
    assert not (tmp_path / "out").exists()
