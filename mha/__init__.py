"""mha: our MultiHeadAttention, a small transformer built from it, and pretrained weights.

Pure PyTorch; never imports the web app.
"""

from mha.errors import (
    CheckpointMismatchError,
    CheckpointNotFoundError,
    EmptyInputError,
    UnsupportedCheckpointError,
)
from mha.model import Transformer, TransformerConfig
from mha.multihead import MultiHeadAttention
from mha.pretrained import (
    DEFAULT_MODEL_NAME,
    AttentionModel,
    AttentionResult,
    ModelInfo,
    load_pretrained,
    random_model,
)

__all__ = [
    "DEFAULT_MODEL_NAME",
    "AttentionModel",
    "AttentionResult",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "EmptyInputError",
    "ModelInfo",
    "MultiHeadAttention",
    "Transformer",
    "TransformerConfig",
    "UnsupportedCheckpointError",
    "load_pretrained",
    "random_model",
]
