"""The one check that no answer holds NaN or an infinity (issue 33 item 4): attend, head effects and a
trace's forward, windows, rows and overviews all refuse a non-finite result the same way."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mha.errors import NonFiniteOutputError


def refuse_non_finite(model: str, what: str, tensors: Sequence[torch.Tensor]) -> None:
    """NonFiniteOutputError when any of `tensors` holds NaN or an infinity: no answer may show one (a
    bare NaN is no JSON, and every statistic of it is NaN). One wait for a device's flags, not one each."""
    if tensors and not bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all()):
        raise NonFiniteOutputError(model=model, what=what)
