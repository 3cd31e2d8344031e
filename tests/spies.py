"""A spy shared by the test files: the calls to a module's function recorded while each still runs."""

from __future__ import annotations

from typing import Any

import pytest


def record_calls(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list[Any]:
    """The first argument of each call to `owner`'s function `name` from here on, in order (the list fills
    as the calls come); each call still runs."""
    calls: list[Any] = []
    original = getattr(owner, name)

    def recorded(first: Any, *rest: Any, **options: Any) -> Any:
        calls.append(first)
        return original(first, *rest, **options)

    monkeypatch.setattr(owner, name, recorded)
    return calls
