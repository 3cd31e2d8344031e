"""The model facade: ``AttentionModel``, the one object the service and a corpus job hold, and what makes
one: ``load_pretrained`` (a checkpoint folder or a GGUF file) and ``random_model`` (an untrained baseline).
The head probe's result ``HeadProbe`` and its bounds (``PROBE_MAX_SEQUENCES``, ``probe_max_length(model)``)
come from ``mha.model.probe``.

It stands above loading, analysis and trace: ``mha.loading`` turns a file into a network
(``LoadedNetwork``), and the facade asks every question of it (attend, trace, head effects, continuation,
probes).

May import: ``mha.loading``, ``mha.analysis``, ``mha.trace``, ``mha.networks``, ``mha.core``, ``mha.text``,
``mha.errors``, ``mha.devices`` and ``mha``'s private helpers. Never web code, nor ``mha.corpus`` (above it).
"""

from mha.model.attention_model import AttentionModel
from mha.model.pretrained import load_pretrained, random_model
from mha.model.probe import MAX_SEQUENCES as PROBE_MAX_SEQUENCES
from mha.model.probe import HeadProbe
from mha.model.probe import max_length as probe_max_length

__all__ = [
    "PROBE_MAX_SEQUENCES",
    "AttentionModel",
    "HeadProbe",
    "load_pretrained",
    "probe_max_length",
    "random_model",
]
