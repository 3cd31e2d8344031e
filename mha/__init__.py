"""mha: our MultiHeadAttention, the transformers built from it (encoders, decoders, encoder-decoders), and
pretrained weights.

Pure PyTorch; never imports the web app. The packages, from the bottom floor up (each may import only
those below it; its docstring says which):

- the bottom: ``errors``, ``devices`` and the private helpers ``_memory``, ``_threads``, ``_transfer``;
- ``text``: tokenizing, chat templates (bounded); ``core``: MultiHeadAttention and its parts, the blocks;
- ``networks``: encoders, decoders, encoder-decoders, results, continuation and translation;
- ``trace``: long inputs, never n x n; ``analysis``: pure functions over attention maps, head ablation;
- ``loading``: files -> networks (``LoadedNetwork``);
- ``model``: the facade over the above: ``load_pretrained`` -> ``AttentionModel`` (attend, trace, effects);
- ``corpus``: the corpus job, one model loaded per worker.
"""

from mha.core.multihead import MultiHeadAttention
from mha.errors import (
    CheckpointError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    EmptyInputError,
    InputError,
    TargetNotSupportedError,
    TokenizerNotFoundError,
    UnsupportedCheckpointError,
)
from mha.loading.facts import CheckpointFacts, describe_checkpoint
from mha.loading.gguf.locate import BUNDLED_LLM_NAME
from mha.loading.pretrained import DEFAULT_MODEL_NAME, check_checkpoint, checkpoint_architecture
from mha.model import AttentionModel, HeadProbe, load_pretrained, random_model
from mha.networks.model import Transformer, TransformerConfig
from mha.networks.result import AttentionResult, ModelInfo, Seq2SeqResult

__all__ = [
    "BUNDLED_LLM_NAME",
    "DEFAULT_MODEL_NAME",
    "AttentionModel",
    "AttentionResult",
    "CheckpointError",
    "CheckpointFacts",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "EmptyInputError",
    "HeadProbe",
    "InputError",
    "ModelInfo",
    "MultiHeadAttention",
    "Seq2SeqResult",
    "TargetNotSupportedError",
    "TokenizerNotFoundError",
    "Transformer",
    "TransformerConfig",
    "UnsupportedCheckpointError",
    "check_checkpoint",
    "checkpoint_architecture",
    "describe_checkpoint",
    "load_pretrained",
    "random_model",
]
