"""Fixtures shared by every test directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from checkpoints import FAMILIES, build_tiny_checkpoints

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
