"""The transformers built from the core: encoders and decoders (``model``), encoder-decoders
(``seq2seq``), what a forward returns (``result``), greedy continuation (``continuation``) and
translation (``translate``).

May import: ``mha.core``, ``mha.text``, ``mha.errors``, ``mha.devices`` and ``mha``'s private helpers.
Never a loader, the trace, analysis or web code.
"""

from mha.networks.translate import DEFAULT_NEW_TOKENS

__all__ = ["DEFAULT_NEW_TOKENS"]
