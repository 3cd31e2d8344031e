"""mha: our MultiHeadAttention, a small transformer built from it, and pretrained weights.

Pure PyTorch; never imports the web app.
"""

from mha.errors import (
    CheckpointError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    EmptyInputError,
    InputError,
    TokenizerNotFoundError,
    UnsupportedCheckpointError,
)
from mha.model import Transformer, TransformerConfig
from mha.multihead import MultiHeadAttention
from mha.pretrained import (
    DEFAULT_MODEL_NAME,
    AttentionModel,
    AttentionResult,
    ModelInfo,
    check_checkpoint,
    load_pretrained,
    random_model,
)

__all__ = [
    "DEFAULT_MODEL_NAME",
    "AttentionModel",
    "AttentionResult",
    "CheckpointError",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "EmptyInputError",
    "InputError",
    "ModelInfo",
    "MultiHeadAttention",
    "TokenizerNotFoundError",
    "Transformer",
    "TransformerConfig",
    "UnsupportedCheckpointError",
    "check_checkpoint",
    "load_pretrained",
    "random_model",
]
