"""Fixtures shared by the library's tests: every family's tiny checkpoint loaded as our model."""

from __future__ import annotations

from pathlib import Path

import pytest
from checkpoints import FAMILIES

from mha import AttentionModel, load_pretrained


@pytest.fixture(scope="module")
def models(tiny_checkpoints: dict[str, Path]) -> dict[str, AttentionModel]:
    """family -> our model of its tiny checkpoint (tests/checkpoints.py), on the CPU, loaded once a module."""
    return {family: load_pretrained(tiny_checkpoints[family], device="cpu") for family in FAMILIES}
