"""Checkpoints edited for the tests of what a checkpoint's values can break (issue 33 item 4): a copy of a
tiny checkpoint with its weights or config.json changed."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file


def edited(
    source: Path,
    folder: Path,
    *,
    weights: Callable[[dict[str, torch.Tensor]], None] | None = None,
    config: Callable[[dict[str, Any]], None] | None = None,
) -> Path:
    """A copy of the checkpoint at `source`, its weights and config.json edited in place."""
    shutil.copytree(source, folder)
    if weights is not None:
        tensors = load_file(folder / "model.safetensors")
        weights(tensors)
        save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    if config is not None:
        data = json.loads((folder / "config.json").read_text())
        config(data)
        (folder / "config.json").write_text(json.dumps(data))
    return folder


def overflowing(source: Path, folder: Path) -> Path:
    """Finite weights whose attention scores overflow float32: every query and key weight x 1e30."""

    def scale(tensors: dict[str, torch.Tensor]) -> None:
        for name in tensors:
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                tensors[name] = tensors[name] * 1e30

    return edited(source, folder, weights=scale)
