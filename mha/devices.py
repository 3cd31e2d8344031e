"""Devices and dtypes by name: 'auto' / 'cpu' / 'cuda:N' / 'mps' and 'float32' / 'float16' / 'bfloat16'
checked and resolved, and a dtype's name as results report it.

Below every package: loading resolves what a caller asks for, and a network's results name the dtype
they ran in, without either reaching into the other. ``to_host`` (mha._transfer's) is the copy of a
result to the host that the service uses too.
"""

from __future__ import annotations

import re

import torch

from mha._transfer import to_host

__all__ = ["dtype_name", "resolve_device", "resolve_dtype", "to_host"]

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """'auto' (CUDA when available, else CPU), 'cpu', 'cuda', 'cuda:N' or 'mps' -> an existing device."""
    text = str(device)
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not re.fullmatch(r"cpu|mps|cuda(:\d+)?", text):
        raise ValueError(f"device ({text!r}) must be one of 'auto', 'cpu', 'cuda', 'cuda:N', 'mps'")
    if text.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"device ({text!r}) asked for, but CUDA is not available")
        index = int(text.split(":")[1]) if ":" in text else 0
        if index >= torch.cuda.device_count():
            raise ValueError(
                f"device ({text!r}) asked for, but only {torch.cuda.device_count()} CUDA device(s)"
            )
    if text == "mps" and not torch.backends.mps.is_available():
        raise ValueError("device ('mps') asked for, but MPS is not available")
    return torch.device(text)


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """None (float32), 'float32', 'float16', 'bfloat16' or the torch dtype; half precision on a GPU only."""
    if dtype is None:
        return torch.float32
    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise ValueError(f"dtype ({dtype!r}) must be one of {sorted(_DTYPES)}")
        dtype = _DTYPES[dtype]
    if dtype not in _DTYPES.values():
        raise ValueError(f"dtype ({dtype}) must be one of {sorted(_DTYPES)}")
    if dtype != torch.float32 and device.type == "cpu":
        raise ValueError(f"dtype ({dtype}) is only allowed on a GPU; device is {device}")
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
