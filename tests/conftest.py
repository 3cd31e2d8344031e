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
