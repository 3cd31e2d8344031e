"""Errors a caller can map to a response: all are ValueError subclasses except `Cancelled`.

Two families: a checkpoint that cannot be loaded (`CheckpointError`, the operator's problem) and an input
the model cannot run (`InputError`, the request's problem).
"""

from __future__ import annotations

__all__ = [
    "Cancelled",
    "CheckpointError",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "EmptyInputError",
    "InputError",
    "TokenizerNotFoundError",
    "UnsupportedCheckpointError",
]


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the subclass says why."""


class UnsupportedCheckpointError(CheckpointError):
    """The checkpoint's architecture (or one of its options) is not one we can run exactly."""


class CheckpointMismatchError(CheckpointError):
    """The checkpoint's weights do not fit the architecture: missing, unexpected or mis-shaped keys."""


class CheckpointNotFoundError(CheckpointError):
    """No checkpoint at the given path (and it could not be fetched), or a file it needs is missing or
    unreadable: config.json, the weights, the tokenizer."""


class TokenizerNotFoundError(CheckpointNotFoundError):
    """The checkpoint has no tokenizer of its own: its vocabulary files are missing, or the tokenizer they
    give is far smaller than the model's vocabulary (transformers would build a stand-in of a few tokens)."""


class InputError(ValueError):
    """The text (or the pair) cannot be run by this model."""


class EmptyInputError(InputError):
    """The text (or the pair) is empty or gives no tokens."""


class Cancelled(Exception):
    """A forward stopped between layers because its `cancel` callback said nobody wants the result."""
