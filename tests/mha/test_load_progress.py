"""A load's progress (mha.loading.load_progress): one rising bar over its stages, told to a plain callable as
the load goes, for a checkpoint folder, a GGUF's first load (its conversion) and its cached one."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf_files import write_gguf

from mha import load_pretrained
from mha.loading.gguf import folders as model_cache
from mha.loading.load_progress import Stages


def _rises_to_the_end(seen: list[tuple[int, int]]) -> None:
    steps = {total for _, total in seen}
    assert len(steps) == 1, seen  # one bar: its length never changes mid-load
    done = [step for step, _ in seen]
    assert done == sorted(set(done)), seen  # rising, each step told once
    assert done[-1] == seen[-1][1]  # and it ends full


def test_stages_share_the_bar_by_weight() -> None:
    seen: list[tuple[int, int]] = []
    stages = Stages(lambda step, steps: seen.append((step, steps)), {"a": 30, "b": 70})
    first, second = stages.stage("a"), stages.stage("b")
    assert first is not None and second is not None
    first(1, 3)
    first(3, 3)
    second(1, 2)
    second(0, 2)  # late: never moves the bar back
    stages.finish()
    assert seen == [(10, 100), (30, 100), (65, 100), (100, 100)]


def test_a_stage_that_never_reported_leaves_the_bar_to_the_others() -> None:
    seen: list[tuple[int, int]] = []
    stages = Stages(lambda step, steps: seen.append((step, steps)), {"convert": 60, "rest": 40})
    stages.drop_if_silent("convert")
    rest = stages.stage("rest")
    assert rest is not None
    rest(1, 2)
    assert seen == [(20, 40)]


def test_without_a_callback_no_stage_reports() -> None:
    stages = Stages(None, {"a": 1})
    assert stages.stage("a") is None
    stages.finish()  # nothing to tell, nothing raised


def test_a_folder_load_reports_as_it_goes(tiny_checkpoints: dict[str, Path]) -> None:
    seen: list[tuple[int, int]] = []
    load_pretrained(tiny_checkpoints["llama"], device="cpu", progress=lambda *told: seen.append(told))
    assert len(seen) > 3  # the weight files, the build and each weight's finite check: more than one step
    _rises_to_the_end(seen)


def test_a_gguf_load_reports_its_conversion_then_its_tensors(
    tiny_checkpoints: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(model_cache.CACHE_ENV, str(tmp_path / "cache"))
    file = write_gguf(tiny_checkpoints["llama"], tmp_path / "tiny.gguf", qtype="Q8_0")
    first: list[tuple[int, int]] = []
    load_pretrained(file, device="cpu", progress=lambda *told: first.append(told))
    _rises_to_the_end(first)
    cached: list[tuple[int, int]] = []
    load_pretrained(file, device="cpu", progress=lambda *told: cached.append(told))
    _rises_to_the_end(cached)
    # The first load's bar has the conversion's share besides; the cached one's is the tensors' alone.
    assert first[-1][1] > cached[-1][1]
    # Per tensor: the tiny Llama's weights (2 layers of 9, norms and embeddings) each move the bar.
    assert len(cached) > 10
