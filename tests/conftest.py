"""Fixtures shared by every test directory."""

from __future__ import annotations

from pathlib import Path

import pytest
from checkpoints import FAMILIES, build_tiny_checkpoints

__all__ = ["FAMILIES"]


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
