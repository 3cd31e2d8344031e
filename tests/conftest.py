"""Fixtures shared by every test directory."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# pytest puts tests/ first on sys.path for this file; there tests/mha (a folder without __init__.py) would
# shadow the real `mha` of an editable install, so the repository root goes in front of it.
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
if str(ROOT / "tests") not in sys.path:
    sys.path.insert(1, str(ROOT / "tests"))

from checkpoints import FAMILIES, build_tiny_checkpoints  # noqa: E402

__all__ = ["FAMILIES"]


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """family -> a tiny random Hugging Face checkpoint directory ("bert", "roberta", "distilbert", "gpt2")."""
    return build_tiny_checkpoints(tmp_path_factory.mktemp("checkpoints"))
