"""Broken weights are named by check_checkpoint from the files' headers, before any tensor is read.

For each way a checkpoint's weights (or its config against them) can be broken, check_checkpoint raises
exactly what load_pretrained raises, without reading a tensor: safetensors headers (and a zip
pytorch_model.bin's pickled names, with its data mapped, not read) give every weight's name and shape, which
are checked against the file's size and against the family's key map.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from broken_checkpoints import BROKEN_WEIGHTS, QUERY, WEIGHTS, break_checkpoint, shard_checkpoint
from safetensors.torch import load_file

import mha.loading.checkpoint
import mha.loading.checkpoint_files
from mha import (
    CheckpointError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    check_checkpoint,
    checkpoint_architecture,
    load_pretrained,
)
from mha.loading.convert import families_of
from mha.loading.weight_headers import SAFETENSORS_MAX_HEADER, weight_shapes


def _raises_the_same(
    directory: Path, error: type[Exception], match: str, monkeypatch: pytest.MonkeyPatch
) -> CheckpointError:
    """check_checkpoint (reading no tensor) and load_pretrained raise the same class and message."""

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the check must not read a tensor or build the tokenizer")

    with monkeypatch.context() as patched:
        patched.setattr(mha.loading.checkpoint, "load_weights", refuse)
        patched.setattr(mha.loading.checkpoint, "load_tokenizer", refuse)
        with pytest.raises(error, match=match) as checked:
            check_checkpoint(directory)
        with pytest.raises(error, match=match):  # what the service's startup check calls
            checkpoint_architecture(directory)
    with pytest.raises(error, match=match) as loaded:
        load_pretrained(directory, device="cpu")
    assert type(checked.value) is type(loaded.value) and str(checked.value) == str(loaded.value)
    assert isinstance(checked.value, CheckpointError)
    return checked.value


@pytest.mark.parametrize("variant", list(BROKEN_WEIGHTS))
def test_each_broken_checkpoint_is_named_before_loading(
    variant: str, tmp_path: Path, tiny_checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    _breaks, error, match = BROKEN_WEIGHTS[variant]
    directory = break_checkpoint(tiny_checkpoints["bert"], tmp_path / "broken", variant)
    _raises_the_same(directory, error, match, monkeypatch)


def test_a_header_past_the_limit_is_refused_unread(
    tmp_path: Path, tiny_checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A file larger than the limit (sparse: no disk used) whose length field is past it but within the
    # file: only the limit refuses it, and neither safetensors nor the message reads the 150 MB.
    directory = break_checkpoint(tiny_checkpoints["bert"], tmp_path / "big", "huge header")
    length = SAFETENSORS_MAX_HEADER * 3 // 2
    with (directory / WEIGHTS).open("wb") as f:
        f.write(length.to_bytes(8, "little"))
        f.truncate(2 * SAFETENSORS_MAX_HEADER)
    match = r"header of 150,000,000 bytes, past safetensors' limit of 100 MB: damaged, or not safetensors"
    _raises_the_same(directory, CheckpointNotFoundError, match, monkeypatch)


def test_extra_bytes_and_a_header_that_is_not_json(
    tmp_path: Path, tiny_checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    longer = break_checkpoint(tiny_checkpoints["bert"], tmp_path / "longer", "missing keys")
    size = (longer / WEIGHTS).stat().st_size
    with (longer / WEIGHTS).open("ab") as f:
        f.write(b"\0" * 10)
    match = rf"the tensors' data up to byte {size:,} but the file has {size + 10:,} bytes$"
    _raises_the_same(longer, CheckpointNotFoundError, match, monkeypatch)

    not_json = tmp_path / "not-json"
    shutil.copytree(tiny_checkpoints["bert"], not_json)
    body = b"{not json}"
    (not_json / WEIGHTS).write_bytes(len(body).to_bytes(8, "little") + body)
    match = r"its 10-byte header is not a safetensors header: damaged, or not safetensors"
    _raises_the_same(not_json, CheckpointNotFoundError, match, monkeypatch)


def test_a_truncated_shard_is_named(
    tmp_path: Path, tiny_checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "sharded"
    shutil.copytree(tiny_checkpoints["bert"], directory)
    names = shard_checkpoint(directory)
    # The shards together are the whole checkpoint: every name and shape, as one file gives them.
    whole = weight_shapes([tiny_checkpoints["bert"] / WEIGHTS])
    assert weight_shapes(mha.loading.checkpoint_files.weight_files(directory)) == whole
    check_checkpoint(directory)
    data = (directory / names[1]).read_bytes()
    (directory / names[1]).write_bytes(data[: len(data) // 2])
    _raises_the_same(
        directory, CheckpointNotFoundError, rf"{names[1]} is not a readable .* cut short", monkeypatch
    )


def _as_bin(directory: Path, weights: dict[str, torch.Tensor], *, legacy: bool = False) -> None:
    (directory / WEIGHTS).unlink()
    torch.save(weights, directory / "pytorch_model.bin", _use_new_zipfile_serialization=not legacy)


def test_pytorch_bin_names_and_shapes_are_read_without_the_data(
    tmp_path: Path, tiny_checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    good = tiny_checkpoints["bert"]
    weights = load_file(good / WEIGHTS)

    zipped = tmp_path / "zip"
    shutil.copytree(good, zipped)
    _as_bin(zipped, weights)
    assert weight_shapes([zipped / "pytorch_model.bin"]) == weight_shapes([good / WEIGHTS])
    check_checkpoint(zipped)

    misshaped = tmp_path / "misshaped"
    shutil.copytree(good, misshaped)
    _as_bin(misshaped, {**weights, QUERY: torch.zeros(16, 32)})
    _raises_the_same(
        misshaped, CheckpointMismatchError, rf"mis-shaped keys \(1\): {QUERY} \(16, 32\)", monkeypatch
    )

    cut = tmp_path / "cut"
    shutil.copytree(zipped, cut)
    data = (cut / "pytorch_model.bin").read_bytes()
    (cut / "pytorch_model.bin").write_bytes(data[: len(data) // 2])
    match = r"pytorch_model.bin is a zip archive cut short or damaged"
    _raises_the_same(cut, CheckpointNotFoundError, match, monkeypatch)

    garbage = tmp_path / "garbage"
    shutil.copytree(zipped, garbage)
    (garbage / "pytorch_model.bin").write_bytes(b"<html>404</html>")
    match = r"pytorch_model.bin is neither a PyTorch zip checkpoint nor a pickle"
    _raises_the_same(garbage, CheckpointNotFoundError, match, monkeypatch)


def test_a_legacy_pickle_is_left_to_loading(tmp_path: Path, tiny_checkpoints: dict[str, Path]) -> None:
    # torch.save before 1.6 wrote one pickle, whose names only unpickling it all can give: the check
    # passes it, and loading reads it (and names it when it is damaged).
    good = tiny_checkpoints["bert"]
    legacy = tmp_path / "legacy"
    shutil.copytree(good, legacy)
    _as_bin(legacy, load_file(good / WEIGHTS), legacy=True)
    assert weight_shapes([legacy / "pytorch_model.bin"]) is None
    check_checkpoint(legacy)
    text = "The cat sat on the mat."
    loaded = load_pretrained(legacy, device="cpu").attend(text).attentions
    # The same weights through the same code: exactly equal.
    torch.testing.assert_close(
        loaded, load_pretrained(good, device="cpu").attend(text).attentions, atol=0, rtol=0
    )
    data = (legacy / "pytorch_model.bin").read_bytes()
    (legacy / "pytorch_model.bin").write_bytes(data[: len(data) // 2])
    check_checkpoint(legacy)
    with pytest.raises(CheckpointNotFoundError, match=r"pytorch_model.bin could not be read: "):
        load_pretrained(legacy, device="cpu")


# (checkpoint family, the model_type its config is made to say, the families its weights are named as)
MISMATCHES = [
    ("bert", "t5", "bert or roberta"),
    ("gpt2", "bert", "gpt2"),
    ("llama", "gpt2", "gemma2 or gemma3 or llama or mistral or qwen2 or qwen3"),
    ("distilbert", "llama", "distilbert"),
    ("phi3", "qwen2", "phi3"),
]


@pytest.mark.parametrize(("family", "says", "weights"), MISMATCHES)
def test_a_config_of_another_family_than_the_weights_names_both(
    family: str,
    says: str,
    weights: str,
    tmp_path: Path,
    tiny_checkpoints: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    directory = tmp_path / family
    shutil.copytree(tiny_checkpoints[family], directory)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "model_type": says}))
    match = rf"says model_type '{says}', but the weights \(model.safetensors\) are a {weights} checkpoint's"
    _raises_the_same(directory, CheckpointMismatchError, match, monkeypatch)


def test_each_family_knows_its_own_weights(
    tiny_checkpoints: dict[str, Path], seq2seq_checkpoints: dict[str, Path]
) -> None:
    # Families that name their weights alike are told apart by config.json alone; the others by their names.
    alike = [
        {"bert", "roberta"},
        {"llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3"},
        {"t5", "mt5"},
        {"bart", "marian"},
    ]
    for family, directory in {**tiny_checkpoints, **seq2seq_checkpoints}.items():
        shapes = weight_shapes(mha.loading.checkpoint_files.weight_files(directory))
        assert shapes is not None
        group = next((g for g in alike if family in g), {family})
        assert set(families_of(shapes)) == group, family


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (
            {"hidden_act": 3},
            r"StrictDataclassFieldValidationError: Validation error for field 'hidden_act': ",
        ),
        ({"hidden_size": 30}, r"ValueError: embed_dim \(30\) is not divisible by num_heads \(4\)$"),
    ],
)
def test_a_config_that_its_family_cannot_read_is_a_checkpoint_error(
    change: dict[str, object],
    why: str,
    tmp_path: Path,
    tiny_checkpoints: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # transformers' own validation, then ours: either is the operator's config, named in one line.
    directory = tmp_path / "odd"
    shutil.copytree(tiny_checkpoints["bert"], directory)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **change}))
    match = rf"config.json in .*odd is not a usable bert config: {why}"
    error = _raises_the_same(directory, CheckpointNotFoundError, match, monkeypatch)
    assert "\n" not in str(error)
