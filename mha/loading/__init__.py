"""Everything from a file to a network.

- ``checkpoint``: checkpoint folders (config.json, safetensors / bin) checked and read.
- ``gguf_checkpoint``: GGUF files through transformers' GGUF utilities; ``model_cache``,
  ``config_snapshot``: the conversion cache and the config kept beside it.
- ``weight_headers``: weight names and shapes read from file headers, no tensor loaded.
- ``convert/``: one converter per family, Hugging Face names -> ours.
- ``pretrained``: ``load_pretrained`` -> ``AttentionModel``, the one object the service holds.

May import: ``mha.networks``, ``mha.core``, ``mha.text``, ``mha.trace.blocked``, ``mha.analysis``,
``mha.errors``, ``mha.devices`` and ``mha``'s private helpers. Never web code.
"""
