"""The model facade: ``AttentionModel``, the one object the service and a corpus job hold, and what makes
one: ``load_pretrained`` (a checkpoint folder or a GGUF file) and ``random_model`` (an untrained baseline).

It stands above loading, analysis and trace: ``mha.loading`` turns a file into a network
(``LoadedNetwork``), and the facade asks every question of it (attend, trace, head effects, continuation).

May import: ``mha.loading``, ``mha.analysis``, ``mha.trace``, ``mha.networks``, ``mha.core``, ``mha.text``,
``mha.errors``, ``mha.devices`` and ``mha``'s private helpers. Never web code, nor ``mha.corpus`` (above it).
"""

from mha.model.attention_model import AttentionModel
from mha.model.pretrained import load_pretrained, random_model
from mha.model.probe import HeadProbe

__all__ = ["AttentionModel", "HeadProbe", "load_pretrained", "random_model"]
