"""Everything from a file to a network.

- ``checkpoint_files``: a checkpoint folder (config.json, safetensors / bin, tokenizer files) checked from
  its files and weight headers alone, as loading and a GGUF's cache both check it.
- ``checkpoint``: where a checkpoint is (folder, GGUF, hub id), its weights and tokenizer read.
- ``gguf/``: GGUF files: found, their header read once, their config and tokenizer cached, their tensors
  read in place (the only importer of gguf); ``config_snapshot``: a config kept so a cached one loads
  without transformers' model code.
- ``weight_headers``: weight names and shapes read from file headers, no tensor loaded.
- ``facts``: ``describe_checkpoint``: family, parameters, quantization and size, from headers alone.
- ``sources/``: the one table of model sources (bundled, the operator's names, the models folder, ollama,
  LM Studio, the Hugging Face cache), each listed without reading a weight, under one rule for links.
- ``convert/``: one converter per family, Hugging Face names -> ours.
- ``pretrained``: ``load_network``, ``random_network`` -> ``LoadedNetwork`` (and ``checkpoint_architecture``):
  the loading API, which the model facade (``mha.model``) wraps; ``load_progress``: a load's progress as one
  bar over its stages, told to a plain callable.

May import: ``mha.networks``, ``mha.core``, ``mha.text``, ``mha.errors``, ``mha.devices`` and ``mha``'s
private helpers. Never ``mha.analysis``, ``mha.trace`` or ``mha.model`` (above it), nor web code.
"""

from mha.loading.load_progress import Progress

__all__ = ["Progress"]
