"""A checkpoint that cannot load fails at load_pretrained, clearly, and check_checkpoint says so first.

check_checkpoint(path) looks at the files alone (no weights read, no tokenizer built), so a service can
check every registered checkpoint at startup; for each broken directory below it must raise exactly what
load_pretrained raises.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from broken_checkpoints import shard_checkpoint
from safetensors.torch import load_file, save_file

import mha.loading.checkpoint
from mha import (
    CheckpointError,
    CheckpointNotFoundError,
    TokenizerNotFoundError,
    UnsupportedCheckpointError,
    check_checkpoint,
    load_pretrained,
)
from mha.loading.checkpoint import default_model_path

TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "vocab.txt", "special_tokens_map.json")


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _without_tokenizer_files(src: Path, dst: Path) -> Path:
    """A copy of the checkpoint with no tokenizer file at all, its tokenizer_config.json included."""
    directory = _copy(src, dst)
    for name in (*TOKENIZER_FILES, "tokenizer_config.json"):
        (directory / name).unlink(missing_ok=True)
    return directory


def _edit_json(path: Path, **changes: object) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _raises_the_same(directory: Path, error: type[Exception], match: str) -> None:
    """check_checkpoint and load_pretrained raise the same class with the same message."""
    with pytest.raises(error, match=match) as checked:
        check_checkpoint(directory)
    with pytest.raises(error, match=match) as loaded:
        load_pretrained(directory, device="cpu")
    assert type(checked.value) is type(loaded.value) and str(checked.value) == str(loaded.value)
    assert isinstance(checked.value, CheckpointError) and isinstance(checked.value, ValueError)


# ------------------------------------------------------------------------------ no tokenizer of its own


def test_gpt2_with_tokenizer_config_but_no_vocabulary_fails_at_load(
    tmp_path: Path, tiny_checkpoints: dict[str, Path]
) -> None:
    # As a real GPT-2 directory: tokenizer_config.json names GPT2Tokenizer. Without its vocabulary
    # transformers builds a one-token tokenizer that turns every text into no tokens at all.
    directory = _copy(tiny_checkpoints["gpt2"], tmp_path / "gpt2")
    _edit_json(directory / "tokenizer_config.json", tokenizer_class="GPT2Tokenizer")
    for name in TOKENIZER_FILES:
        (directory / name).unlink(missing_ok=True)
    _raises_the_same(directory, TokenizerNotFoundError, r"no tokenizer vocabulary in .*gpt2")
    with pytest.raises(TokenizerNotFoundError) as caught:
        load_pretrained(directory, device="cpu")
    message = str(caught.value)
    assert "tokenizer.json" in message and "vocab.json + merges.txt" in message
    assert "found only tokenizer_config.json" in message


def test_half_a_vocabulary_names_the_missing_file(tmp_path: Path, tiny_checkpoints: dict[str, Path]) -> None:
    directory = _copy(tiny_checkpoints["gpt2"], tmp_path / "gpt2")
    (directory / "tokenizer.json").unlink()
    (directory / "vocab.json").write_text("{}")
    # vocab.json is half of the byte-level pair and a third of Marian's files: both are named.
    expected = r"\(vocab.json without merges.txt; vocab.json without source.spm \+ target.spm\)"
    _raises_the_same(directory, TokenizerNotFoundError, expected)


def test_config_and_weights_without_tokenizer_files_fail_at_load(
    tmp_path: Path, tiny_checkpoints: dict[str, Path]
) -> None:
    # transformers would build BERT's tokenizer from nothing: 5 special tokens, every word [UNK].
    directory = _without_tokenizer_files(tiny_checkpoints["bert"], tmp_path / "bert")
    _raises_the_same(directory, TokenizerNotFoundError, r"no tokenizer files at all")


def test_a_stand_in_tokenizer_far_smaller_than_the_model_fails_at_load(
    tmp_path: Path, tiny_checkpoints: dict[str, Path]
) -> None:
    # The files are there but hold transformers' 5-token stand-in: only loading can tell.
    from transformers import BertTokenizer

    directory = _without_tokenizer_files(tiny_checkpoints["bert"], tmp_path / "bert")
    stand_in = BertTokenizer()
    assert len(stand_in) == 5  # the premise
    stand_in.save_pretrained(directory)
    check_checkpoint(directory)  # the files alone look complete
    with pytest.raises(
        TokenizerNotFoundError, match=r"has 5 tokens but the model has 30522 token embeddings"
    ):
        load_pretrained(directory, device="cpu")


def test_tokenizer_files_that_cannot_be_read_fail_at_load(
    tmp_path: Path, tiny_checkpoints: dict[str, Path]
) -> None:
    directory = _copy(tiny_checkpoints["roberta"], tmp_path / "roberta")
    (directory / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerNotFoundError, match=r"tokenizer files in .*roberta could not be loaded"):
        load_pretrained(directory, device="cpu")


# --------------------------------------------------------------------------------- check_checkpoint


def test_good_checkpoints_pass_the_check_without_reading_weights(
    tiny_checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("check_checkpoint must not read weights or build a tokenizer")

    monkeypatch.setattr(mha.loading.checkpoint, "load_weights", refuse)
    monkeypatch.setattr(mha.loading.checkpoint, "load_tokenizer", refuse)
    monkeypatch.setattr(mha.loading.checkpoint, "fetch", refuse)
    for directory in tiny_checkpoints.values():
        assert check_checkpoint(directory) is None
        assert check_checkpoint(str(directory)) is None
    assert check_checkpoint(mha.DEFAULT_MODEL_NAME) is None
    assert check_checkpoint(default_model_path()) is None
    # A name that is not a directory but may be a hub id is fetched only when loaded: not checked.
    assert check_checkpoint("someone/some-model") is None
    assert check_checkpoint("bert-base-uncased") is None


def _remove(name: str) -> Callable[[Path], None]:
    return lambda directory: (directory / name).unlink()


def _write(name: str, text: str) -> Callable[[Path], None]:
    return lambda directory: (directory / name).write_text(text)


def _unsupported(directory: Path) -> None:
    _edit_json(directory / "config.json", model_type="xlnet")


def _sharded_without_a_shard(directory: Path) -> None:
    weights = load_file(directory / "model.safetensors")
    (directory / "model.safetensors").unlink()
    keys = sorted(weights)
    save_file({k: weights[k] for k in keys[:5]}, directory / "model-00001-of-00002.safetensors")
    index = {"weight_map": {k: f"model-0000{1 + (i >= 5)}-of-00002.safetensors" for i, k in enumerate(keys)}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))


BROKEN = {
    "no config.json": (_remove("config.json"), CheckpointNotFoundError, r"no config.json in "),
    "config.json not JSON": (
        _write("config.json", "{oops"),
        CheckpointNotFoundError,
        r"config.json is unreadable",
    ),
    "config.json a list": (_write("config.json", "[1, 2]"), CheckpointNotFoundError, r"is not a JSON object"),
    "unsupported model_type": (
        _unsupported,
        UnsupportedCheckpointError,
        r"'xlnet'.*supported: bart, bert, distilbert",
    ),
    "no weights": (_remove("model.safetensors"), CheckpointNotFoundError, r"no weights in .*expected model"),
    "a shard missing": (
        _sharded_without_a_shard,
        CheckpointNotFoundError,
        r"names 1 shard\(s\) that are not there: model-00002-of-00002.safetensors",
    ),
    "index unreadable": (
        lambda d: (_remove("model.safetensors")(d), _write("model.safetensors.index.json", "{}")(d)),
        CheckpointNotFoundError,
        r"index.json is unreadable \(no weight_map",
    ),
    "no tokenizer": (
        lambda d: [(d / name).unlink(missing_ok=True) for name in TOKENIZER_FILES],
        TokenizerNotFoundError,
        r"no tokenizer vocabulary",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_check_raises_what_loading_raises(
    case: str, tmp_path: Path, tiny_checkpoints: dict[str, Path]
) -> None:
    breaks, error, match = BROKEN[case]
    directory = _copy(tiny_checkpoints["bert"], tmp_path / "broken")
    breaks(directory)
    _raises_the_same(directory, error, match)


def test_missing_directories_and_files_are_not_checkpoints(tmp_path: Path) -> None:
    _raises_the_same(
        tmp_path / "does" / "not" / "exist", CheckpointNotFoundError, r"no checkpoint directory at"
    )
    file = tmp_path / "model.safetensors"
    file.write_bytes(b"")
    _raises_the_same(file, CheckpointNotFoundError, r"is a file, not a checkpoint directory")


def test_sharded_weights_load_as_one_file(tmp_path: Path, tiny_checkpoints: dict[str, Path]) -> None:
    directory = _copy(tiny_checkpoints["bert"], tmp_path / "sharded")
    shard_checkpoint(directory)
    check_checkpoint(directory)
    text = "The cat sat on the mat."
    sharded = load_pretrained(directory, device="cpu").attend(text).attentions
    whole = load_pretrained(tiny_checkpoints["bert"], device="cpu").attend(text).attentions
    # The same weights through the same code: exactly equal.
    torch.testing.assert_close(sharded, whole, atol=0, rtol=0)


def test_the_family_table_names_what_it_cannot_convert() -> None:
    from mha.loading.convert import CONVERTERS, for_model_type
    from mha.loading.convert.gpt2 import GPT2

    assert for_model_type("gpt2") is GPT2
    supported = [
        "bart",
        "bert",
        "distilbert",
        "gemma2",
        "gemma3",
        "gpt2",
        "llama",
        "marian",
        "mistral",
        "mt5",
        "phi3",
        "qwen2",
        "qwen3",
        "roberta",
        "t5",
    ]
    assert sorted(CONVERTERS) == supported
    for model_type in ("xlnet", None):
        with pytest.raises(UnsupportedCheckpointError) as caught:
            for_model_type(model_type, source="x/config.json")
        # with the model_types a family reads besides its own name (Gemma 3's text model)
        named = ", ".join(sorted([*supported, "gemma3_text"]))
        assert str(caught.value) == (
            f"model_type {model_type!r} in x/config.json is not supported; supported: {named}"
        )
