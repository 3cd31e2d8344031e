"""Fixtures shared by every test directory."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from checkpoints import FAMILIES, build_tiny_checkpoints

if TYPE_CHECKING:
    from mha import AttentionModel

__all__ = ["FAMILIES"]

# No test looks at the developer's own ollama, LM Studio or Hugging Face store, and a fresh CI machine
# behaves the same: Settings() made anywhere in a test, and every server a test starts (it inherits this
# environment), discover nothing. Tests of the stores point HEADSCOPE_*-free Settings at tmp folders.
os.environ["HEADSCOPE_DISCOVER"] = "false"


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """family -> a tiny random Hugging Face checkpoint directory, for every family of FAMILIES."""
    return build_tiny_checkpoints(tmp_path_factory.mktemp("checkpoints"))


@pytest.fixture(scope="session")
def seq2seq_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """family -> a tiny random encoder-decoder checkpoint (T5, BART, Marian: tests/seq2seq_checkpoints.py)."""
    from seq2seq_checkpoints import build_seq2seq_checkpoint

    root = tmp_path_factory.mktemp("seq2seq")
    return {family: build_seq2seq_checkpoint(family, root / family) for family in ("t5", "bart", "marian")}


@pytest.fixture(scope="session")
def minilm() -> AttentionModel:
    """The embedded default (all-MiniLM-L6-v2) loaded by mha directly, once a session: the reference the
    service must match, and the corpus tests' model. Tests only read it (one that swaps a method of it
    does so through monkeypatch, undone after the test)."""
    from mha import load_pretrained

    return load_pretrained(device="cpu")
