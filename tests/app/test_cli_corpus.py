"""`headscope corpus`: the thin CLI over mha.corpus.run (argument errors, model names, progress)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from broken_checkpoints import BROKEN_WEIGHTS, break_checkpoint
from corpus_files import texts, write_jsonl
from store_files import OLLAMA_MODEL, ollama_manifest

from app import corpus_cli
from app.cli import main
from app.settings import Settings
from mha import check_checkpoint
from mha.corpus.job import Job
from mha.corpus.runner import model_info


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        main(["corpus", *argv])
    except SystemExit as stop:
        return int(stop.code or 0), capsys.readouterr().err
    return 0, capsys.readouterr().err


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    source = tmp_path / "corpus.jsonl"
    write_jsonl(source, texts(6))
    return source


def test_a_registered_name_runs_with_plain_progress_lines(
    corpus: Path, tmp_path: Path, tiny_checkpoints, monkeypatch, capsys
) -> None:
    """HEADSCOPE_MODELS names the checkpoint as the service does; run.json carries that name; stderr
    (not a terminal here) gets plain progress lines and a one-line summary."""
    monkeypatch.setenv("HEADSCOPE_MODELS", json.dumps({"tiny-bert": str(tiny_checkpoints["bert"])}))
    out = tmp_path / "out"
    code, err = run_cli(
        [
            str(corpus),
            "--model",
            "tiny-bert",
            "--out",
            str(out),
            "--batch",
            "4",
            "--shard-size",
            "5",
            "--max-chars",
            "20",
            "--device",
            "cpu",
        ],
        capsys,
    )
    assert code == 0, err
    record = json.loads((out / "run.json").read_text())
    assert record["model"]["name"] == "tiny-bert" and record["complete"] is True
    settings = {
        "batch": 4,
        "words": False,
        "weighting": "weight",
        "shard_size": 5,
        "max_tokens": 512,
        "max_chars": 20,
    }
    assert record["settings"] == settings
    assert "corpus: 9/9 records (100%)" in err and "texts/s" in err
    # every record but "Short one. (5)" has a text or pair past 20 characters: cut and flagged truncated
    assert err.strip().splitlines()[-1] == f"headscope corpus: 6 texts, 3 bad records, 5 truncated -> {out}"


def test_a_checkpoint_directory_runs_under_its_name(corpus: Path, tmp_path: Path, tiny_checkpoints, capsys):
    code, err = run_cli(
        [
            str(corpus),
            "--model",
            str(tiny_checkpoints["gpt2"]),
            "--out",
            str(tmp_path / "o"),
            "--words",
            "--weighting",
            "norm",
            "--device",
            "cpu",
        ],
        capsys,
    )
    assert code == 0, err
    record = json.loads((tmp_path / "o" / "run.json").read_text())
    assert record["model"]["name"] == "gpt2" and record["settings"]["words"] is True
    assert record["settings"]["weighting"] == "norm"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["missing.jsonl", "--out", "o"], "input 'missing.jsonl' is not a file"),
        (["{corpus}", "--out", "o", "--batch", "0"], "argument --batch: '0' must be at least 1"),
        (["{corpus}", "--out", "o", "--shard-size", "x"], "argument --shard-size: 'x' is not an integer"),
        (["{corpus}", "--out", "o", "--max-chars", "0"], "argument --max-chars: '0' must be at least 1"),
        (["{corpus}", "--out", "o", "--engine", "spark"], "argument --engine: invalid choice: 'spark'"),
        (["{corpus}", "--out", "o", "--weighting", "size"], "argument --weighting: invalid choice: 'size'"),
        (["{corpus}", "--out", "o", "--model", "nosuch"], "model 'nosuch' is neither a registered name"),
        (["{corpus}.txt", "--out", "o"], "is not a file"),
        (["{corpus}"], "the following arguments are required: --out"),
    ],
)
def test_bad_arguments_exit_non_zero_with_one_line(
    argv: list[str], message: str, corpus: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    code, err = run_cli([a.replace("{corpus}", str(corpus)) for a in argv], capsys)
    assert code == 2
    last = err.strip().splitlines()[-1]
    assert message in last and last.startswith("headscope corpus: error:")
    assert not (tmp_path / "o").exists()


def test_another_runs_folder_is_refused(corpus: Path, tmp_path: Path, tiny_checkpoints, capsys) -> None:
    base = [
        str(corpus),
        "--model",
        str(tiny_checkpoints["bert"]),
        "--out",
        str(tmp_path / "o"),
        "--device",
        "cpu",
    ]
    assert run_cli(base, capsys)[0] == 0
    code, err = run_cli([*base, "--max-tokens", "16"], capsys)
    assert code == 2 and "settings.max_tokens 512 there, 16 now" in err
    code, err = run_cli([*base, "--weighting", "norm"], capsys)
    last = err.strip().splitlines()[-1]
    assert code == 2 and last.startswith("headscope corpus: error:")
    assert "settings.weighting 'weight' there, 'norm' now" in last


def test_the_ray_engine_without_ray_names_the_extra(
    corpus: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a)
    )
    code, err = run_cli([str(corpus), "--out", str(tmp_path / "o"), "--engine", "ray"], capsys)
    assert code == 2 and 'pip install "headscope[ray]"' in err
    assert not (tmp_path / "o").exists()


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_a_bar_on_a_terminal_and_lines_elsewhere(monkeypatch) -> None:
    terminal = Terminal()
    bar = corpus_cli.Progress(terminal)
    for done in (0, 50, 100):
        bar(done, 100)
    bar.close()
    assert "100/100" in terminal.getvalue() and "text/s" in terminal.getvalue()

    clock = iter([0.0, 20.0, 40.0])
    monkeypatch.setattr(corpus_cli.time, "monotonic", lambda: next(clock))
    plain = io.StringIO()
    lines = corpus_cli.Progress(plain)
    lines(0, 100)  # t = 0: the start
    lines(40, 100)  # t = 20: 2 texts/s, 60 left
    lines(100, 100)  # t = 40: done
    assert plain.getvalue().splitlines() == [
        "corpus: 0/100 records (0%), 0.0 texts/s",
        "corpus: 40/100 records (40%), 2.0 texts/s, ETA 30s",
        "corpus: 100/100 records (100%), 2.5 texts/s",
    ]


def test_resolve_model_prefers_registered_names(tmp_path: Path) -> None:
    (tmp_path / "scanned" / "a").mkdir(parents=True)
    (tmp_path / "scanned" / "a" / "config.json").write_text("{}")
    settings = Settings(models_dir=tmp_path / "scanned", models={"b": tmp_path / "elsewhere"})
    assert corpus_cli.resolve_model("a", settings) == (str(tmp_path / "scanned" / "a"), "a")
    assert corpus_cli.resolve_model("b", settings) == (str(tmp_path / "elsewhere"), "b")
    assert corpus_cli.resolve_model(None, settings) == (None, "all-MiniLM-L6-v2")
    assert corpus_cli.resolve_model(None, Settings(default_model="b", models=settings.models))[1] == "b"


def test_an_operator_entry_named_as_the_embedded_model_overrides_it(
    corpus: Path, tmp_path: Path, tiny_checkpoints, monkeypatch, capsys
) -> None:
    """HEADSCOPE_MODELS (or a HEADSCOPE_MODELS_DIR folder) naming all-MiniLM-L6-v2 is what the service
    serves under that name (app/service/offers.py), so the job measures it too, with or without --model."""
    tiny = tiny_checkpoints["bert"]
    settings = Settings(models={"all-MiniLM-L6-v2": tiny})
    assert corpus_cli.resolve_model("all-MiniLM-L6-v2", settings) == (str(tiny), "all-MiniLM-L6-v2")
    assert corpus_cli.resolve_model(None, settings) == (str(tiny), "all-MiniLM-L6-v2")
    scanned = tmp_path / "models" / "all-MiniLM-L6-v2"
    scanned.mkdir(parents=True)
    for file in Path(tiny).iterdir():
        (scanned / file.name).symlink_to(file)
    assert corpus_cli.resolve_model(None, Settings(models_dir=tmp_path / "models")) == (
        str(scanned),
        "all-MiniLM-L6-v2",
    )

    monkeypatch.setenv("HEADSCOPE_MODELS", json.dumps({"all-MiniLM-L6-v2": str(tiny)}))
    out = tmp_path / "out"
    argv = [str(corpus), "--model", "all-MiniLM-L6-v2", "--out", str(out), "--device", "cpu"]
    code, err = run_cli(argv, capsys)
    assert code == 0, err
    model = json.loads((out / "run.json").read_text())["model"]
    config = json.loads((Path(tiny) / "config.json").read_text())
    assert model["name"] == "all-MiniLM-L6-v2"  # the name the page opens, on the operator's checkpoint
    assert (model["layers"], model["heads"]) == (config["num_hidden_layers"], config["num_attention_heads"])
    assert (model["layers"], model["heads"]) != (6, 12)  # not the embedded MiniLM


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('{"text":"a \\ud800 b"}', "'text' holds a lone surrogate '\\\\ud800' at character 2"),
        (
            '{"text":"a","text_pair":"\\ud800"}',
            "'text_pair' holds a lone surrogate '\\\\ud800' at character 0",
        ),
        ('{"text":"a","id":"\\ud800"}', "'id' holds a lone surrogate '\\\\ud800' at character 0"),
        ("[" * 100_000 + "]" * 100_000, "invalid JSON: nested too deeply"),
    ],
)
def test_the_issues_bad_lines_are_errors_and_the_job_goes_on(
    line: str, reason: str, tmp_path: Path, capsys
) -> None:
    """The repros of issue 26 (a lone surrogate escape in each field, a line 100,000 deep) on the
    embedded MiniLM: one bad record each, the next line measured, exit 0."""
    source = tmp_path / "s.jsonl"
    source.write_text(f'{line}\n{{"text":"fine"}}\n', encoding="utf-8")
    out = tmp_path / "o"
    code, err = run_cli(
        [str(source), "--model", "all-MiniLM-L6-v2", "--out", str(out), "--device", "cpu"], capsys
    )
    assert code == 0, err
    assert err.strip().splitlines()[-1] == f"headscope corpus: 1 texts, 1 bad records, 0 truncated -> {out}"
    assert (out / "errors.jsonl").read_text(encoding="utf-8") == f'{{"line": 1, "reason": "{reason}"}}\n'


@pytest.mark.parametrize(
    ("setup", "out", "message"),
    [
        ("file", "a-file", "--out a-file is not a folder: choose another --out"),
        (
            "file",
            "a-file/sub",
            "--out a-file/sub lies under a-file, which is not a folder: choose another --out",
        ),
        (
            "foreign",
            "theirs",
            "theirs holds files but no run.json, so they are not a corpus run's and a run would overwrite "
            "them (per_head.parquet): choose a new or empty folder for --out",
        ),
        ("empty csv", "o", "input 'empty.csv': empty CSV, no header row"),
        ("headless csv", "o", "input 'empty.csv' has no 'text' column (columns: )"),
    ],
)
def test_an_out_that_is_not_ours_or_an_empty_csv_is_one_line(
    setup: str, out: str, message: str, corpus: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    """Exit 2 with one line and no traceback; the file, the other folder's file, stay as they were."""
    monkeypatch.chdir(tmp_path)
    Path("a-file").write_text("mine")
    Path("theirs").mkdir()
    Path("theirs/per_head.parquet").write_bytes(b"not ours")
    Path("empty.csv").write_bytes(b"" if setup == "empty csv" else b"\n")
    source = "empty.csv" if setup.endswith("csv") else str(corpus)
    code, err = run_cli([source, "--out", out], capsys)
    assert (code, err) == (2, f"headscope corpus: error: {message}\n")
    assert Path("a-file").read_text() == "mine"
    assert Path("theirs/per_head.parquet").read_bytes() == b"not ours"
    assert not Path("o").exists()


@pytest.mark.parametrize("engine", ["local", "ray"])
@pytest.mark.parametrize("variant", sorted(BROKEN_WEIGHTS))
def test_a_broken_checkpoint_is_one_line_before_the_input_is_read(
    variant: str, engine: str, corpus: Path, tmp_path: Path, tiny_checkpoints, monkeypatch, capsys
) -> None:
    """The error load_pretrained (and the service's startup check) gives for each broken checkpoint, from
    its files and weight headers, before the input is read (Job.survey) and before any folder is made;
    the Ray engine refuses it in the driver (model_info reads the model's shape through the same check),
    not on a worker."""
    broken = break_checkpoint(tiny_checkpoints["bert"], tmp_path / "broken", variant)
    _, error, pattern = BROKEN_WEIGHTS[variant]

    def unread(source: Path) -> dict[str, Any]:
        raise AssertionError(f"{source} was read before the checkpoint was checked")

    monkeypatch.setattr(Job, "survey", staticmethod(unread))
    out = tmp_path / "o"
    code, err = run_cli([str(corpus), "--model", str(broken), "--out", str(out), "--engine", engine], capsys)
    assert code == 2
    with pytest.raises(error) as raised:
        check_checkpoint(broken)
    assert err == f"headscope corpus: error: {' '.join(str(raised.value).split())}\n"
    assert re.search(pattern, err)
    assert not out.exists()
    if engine == "ray":
        job = Job(
            corpus, out, str(broken), "broken", records=0, input_bytes=0, input_sha256="", engine=engine
        )
        with pytest.raises(error, match=pattern):
            model_info(job)


def test_a_broken_store_entry_gives_its_own_reason(corpus: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    """Issue 48 E8: `--model` naming a store entry the service refuses (an ollama manifest whose blob is
    missing) said "neither a registered name nor a checkpoint directory"; it gives the service's reason."""
    store = tmp_path / "ollama"
    layer = {"mediaType": OLLAMA_MODEL, "digest": "sha256:" + "b" * 64, "size": 1}
    ollama_manifest(store, ("registry.ollama.ai", "library", "ghost", "latest"), [layer])
    for key, folder in {"OLLAMA_MODELS": store, "LMSTUDIO_MODELS": tmp_path, "HF_CACHE": tmp_path}.items():
        monkeypatch.setenv(f"HEADSCOPE_{key}", str(folder))
    monkeypatch.setenv("HEADSCOPE_DISCOVER", "true")
    out = tmp_path / "o"
    code, err = run_cli([str(corpus), "--model", "ghost:latest", "--out", str(out)], capsys)
    assert code == 2 and not out.exists()
    last = err.strip().splitlines()[-1]
    assert last.startswith("headscope corpus: error: model 'ghost:latest' cannot be loaded: ollama's")
    assert f"its model blob sha256-{'b' * 64} is missing" in last and "neither" not in last
