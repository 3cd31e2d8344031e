"""Errors a caller can map to a response: all are ValueError subclasses, except `Cancelled`."""

from __future__ import annotations

__all__ = [
    "Cancelled",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "EmptyInputError",
    "UnsupportedCheckpointError",
]


class UnsupportedCheckpointError(ValueError):
    """The checkpoint's architecture (or one of its options) is not one we can run exactly."""


class CheckpointMismatchError(ValueError):
    """The checkpoint's weights do not fit the architecture: missing, unexpected or mis-shaped keys."""


class CheckpointNotFoundError(ValueError):
    """No checkpoint directory at the given path, and it could not be fetched."""


class EmptyInputError(ValueError):
    """The text (or the pair) is empty or gives no tokens."""


class Cancelled(Exception):
    """A forward stopped between layers because its `cancel` callback said nobody wants the result."""
