"""A model's long computation (its trace, its head effects) wrapped for the tests of its stream: how many
ran, how each ended, and a hook run before each layer from inside the computation's cancel callback."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any

import mha


class Counting:
    """Wraps `model.<method>` (trace, head_effects): counts its calls (`forwards`), records how each ended
    (`ended`), and runs `before_layer(i)`, when set, before each layer i (from the cancel callback)."""

    def __init__(self, model: mha.AttentionModel, method: str) -> None:
        self.original = getattr(model, method)
        self.forwards = 0
        self.ended: list[str] = []  # "ok" or the exception's name, per call
        self.before_layer: Callable[[int], None] | None = None
        setattr(model, method, self)

    def __call__(self, *args: Any, cancel: Callable[[], bool] | None = None, **kwargs: Any) -> Any:
        self.forwards += 1
        layer = itertools.count()

        def hooked() -> bool:
            if self.before_layer is not None:
                self.before_layer(next(layer))
            return cancel() if cancel is not None else False

        try:
            value = self.original(*args, cancel=hooked, **kwargs)
        except Exception as exc:
            self.ended.append(type(exc).__name__)
            raise
        self.ended.append("ok")
        return value

    def wait_ended(self, seconds: float) -> list[str]:
        """`ended` once a call has ended, or after `seconds` (the computation stops in its own thread, a
        moment after its client hung up)."""
        pause = threading.Event()
        for _ in range(int(seconds * 100)):
            if self.ended:
                break
            pause.wait(0.01)
        return self.ended
