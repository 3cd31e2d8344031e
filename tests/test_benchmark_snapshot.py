"""benchmarks/snapshot.py without its minutes of work: the script imports, its argument parser takes what
its docstring says, and it hands bertviz the result's own maps in bertviz's form. Nothing is timed, no
browser starts and bertviz is not installed here."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "snapshot.py"


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    """The script as a module, benchmarks/ on sys.path as when it runs (it imports timing from there);
    registered in sys.modules while the tests run, as an import would (its dataclass looks itself up)."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        spec = importlib.util.spec_from_file_location("bench_snapshot", SCRIPT)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("bench_snapshot", None)
        sys.path.remove(str(SCRIPT.parent))


def test_help_runs_as_a_script() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0, done.stderr
    for flag in ("--sizes", "--opens", "--no-llm", "--open-max-mb", "--open-timeout-s"):
        assert flag in done.stdout
    assert "bertviz" in done.stdout and "head_view" in done.stdout


def test_the_parser_takes_its_flags(bench: ModuleType) -> None:
    defaults = bench.parser().parse_args([])
    assert defaults.sizes == [32, 128, 512] and not defaults.no_llm and defaults.opens == 4
    args = bench.parser().parse_args(
        ["--sizes", "32", "128", "--opens", "2", "--no-llm", "--open-max-mb", "5"]
    )
    assert args.sizes == [32, 128] and args.opens == 2 and args.no_llm and args.open_max_mb == 5
    with pytest.raises(SystemExit):
        bench.parser().parse_args(["--opens", "two"])


def test_bertviz_gets_the_same_maps_one_layer_each(bench: ModuleType) -> None:
    maps = torch.rand(3, 4, 5, 5).softmax(dim=-1)
    layers = bench.bertviz_attention(maps)
    assert len(layers) == 3
    for index, layer in enumerate(layers):
        assert layer.shape == (1, 4, 5, 5)
        assert torch.equal(layer[0], maps[index])  # the values themselves, not a copy rounded on the way


def test_bertviz_is_installed_only_under_the_benchmarks_own_ignored_folder(bench: ModuleType) -> None:
    folder = bench.BERTVIZ_DIR.relative_to(ROOT).as_posix()
    assert folder.startswith("benchmarks/.cache/")
    ignored = (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
    assert "benchmarks/.cache/" in ignored, f"{folder} is not git-ignored"
    assert bench.BERTVIZ == "bertviz==1.4.1"
