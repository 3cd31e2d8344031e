"""A converted GGUF keeps its config as a snapshot (mha.loading.config_snapshot): a later load reads our
config from it, the same as from transformers' config class, without importing that class; a snapshot it
cannot use leaves config.json to decide."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from gguf_files import build_gpt2, build_qwen3, write_gguf

from mha import load_pretrained
from mha.loading import checkpoint_files, config_snapshot, gguf
from mha.loading.config_snapshot import SNAPSHOT, NotKept, Snapshot
from mha.loading.gguf import folders as cache

TEXT = "The cat sat on the mat."
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "phi3", "gpt2")
# Modules that only transformers' config classes (and its model code) import: a second load needs none
MODEL_CODE = (
    "transformers.models.auto.configuration_auto",
    "transformers.core_model_loading",
    "torch.distributed.tensor",
)


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv(cache.CACHE_ENV, str(folder))
    return folder


@pytest.fixture(scope="module")
def files(tiny_checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """family -> a Q8_0 GGUF of its tiny random checkpoint."""
    root = tmp_path_factory.mktemp("snapshot-sources")
    sources = tiny_checkpoints | {"qwen3": build_qwen3(root / "qwen3"), "gpt2": build_gpt2(root / "gpt2")}
    return {f: write_gguf(sources[f], root / f"tiny-{f}.gguf", qtype="Q8_0") for f in FAMILIES}


def _refuse(*_: object, **__: object) -> None:
    raise AssertionError("AutoConfig read config.json")


@pytest.mark.parametrize("family", FAMILIES)
def test_a_later_load_reads_the_snapshot_to_the_same_config(
    family: str, files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoConfig

    first = load_pretrained(files[family], device="cpu")
    folder = gguf.cached_directory(files[family])
    assert folder is not None and (folder / SNAPSHOT).is_file()
    _, converter, _ = checkpoint_files.check_directory(folder)
    hf_config = AutoConfig.from_pretrained(str(folder))
    kept, ours = checkpoint_files.read_config(folder, converter)
    assert isinstance(kept, Snapshot)
    assert ours == converter.config_from_hf(hf_config)
    assert kept.to_dict() == hf_config.to_dict()
    for name in kept._values:  # every value it kept, eos_token_id and tie_word_embeddings among them
        assert getattr(kept, name) == getattr(hf_config, name), name
    assert {"eos_token_id", "tie_word_embeddings"} <= set(kept._values)  # what loading reads besides

    monkeypatch.setattr(AutoConfig, "from_pretrained", _refuse)
    again = load_pretrained(files[family], device="cpu")
    assert (again.attend(TEXT).attentions == first.attend(TEXT).attentions).all()


def test_a_later_load_in_a_new_process_imports_no_model_code(files: dict[str, Path], cache_dir: Path) -> None:
    load_pretrained(files["llama"], device="cpu")
    script = (
        "import sys, mha\n"
        f"mha.load_pretrained({str(files['llama'])!r}, device='cpu').attend({TEXT!r})\n"
        f"print([m for m in {MODEL_CODE!r} if m in sys.modules])\n"
    )
    env = {**os.environ, cache.CACHE_ENV: str(cache_dir)}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    assert run.stdout.strip() == "[]", run.stderr


def test_a_name_whose_value_was_not_kept_is_not_taken_as_absent(files: dict[str, Path]) -> None:
    load_pretrained(files["llama"], device="cpu")
    folder = gguf.cached_directory(files["llama"])
    assert folder is not None
    snapshot = config_snapshot.read(folder)
    assert snapshot is not None
    with pytest.raises(NotKept):
        getattr(snapshot, "get_text_config", None)  # a method of the config: not a default's None
    assert getattr(snapshot, "no_such_field", "default") == "default"  # the config had none either
    rope = snapshot.rope_parameters
    rope["rope_theta"] = 0.0  # a reader's copy
    assert snapshot.rope_parameters["rope_theta"] != 0.0


def _reads_a_method(config_from_hf: Any) -> Any:
    def read(cfg: Any) -> Any:
        cfg.get_text_config()
        return config_from_hf(cfg)

    return read


@pytest.mark.parametrize(
    "damage",
    ["another transformers", "not JSON", "a converter that reads what was not kept"],
)
def test_a_snapshot_it_cannot_use_leaves_config_json_to_decide(damage: str, files: dict[str, Path]) -> None:
    from transformers import PreTrainedConfig

    load_pretrained(files["qwen2"], device="cpu")
    folder = gguf.cached_directory(files["qwen2"])
    assert folder is not None
    _, converter, _ = checkpoint_files.check_directory(folder)
    file = folder / SNAPSHOT
    if damage == "another transformers":
        taken = json.loads(file.read_text())
        taken["dict"]["transformers"] = "4.0.0"
        file.write_text(json.dumps(taken))
    elif damage == "not JSON":
        file.write_text(file.read_text()[:100])
    else:
        converter = replace(converter, config_from_hf=_reads_a_method(converter.config_from_hf))
    hf_config, ours = checkpoint_files.read_config(folder, converter)
    assert isinstance(hf_config, PreTrainedConfig)
    assert ours == converter.config_from_hf(hf_config)


def test_values_come_back_with_their_types() -> None:
    """Tuples stay tuples and id2label's int keys stay ints, or the value is not kept."""
    value = {"a": (1, 2.5, None), "b": [True, "x"], "id2label": {0: "LABEL_0"}, "nested": {"c": {"d": ()}}}
    assert config_snapshot._round_trips(value)
    assert not config_snapshot._round_trips({"x": {1, 2}})
    assert not config_snapshot._round_trips(float("nan"))  # never equal to itself: not kept
