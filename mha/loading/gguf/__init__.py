"""GGUF files (llama.cpp's format: ollama, LM Studio) as checkpoints: found, their header read once,
their config and tokenizer cached, their tensors read in place.

- ``locate``: which file a path names as a GGUF (``find_gguf``), the bundled LLM, a model's name.
- ``bounds``: the one walk over a header's bytes, every count and length held to the file first.
- ``header``: ``read_header`` -> ``Header`` (metadata, tensor table, digest), its config checked.
- ``cache``: ``cached_config``: the config, tensor names and tokenizer transformers reads from the file,
  kept between runs in ``folders`` (content-addressed folders under $HEADSCOPE_CACHE_DIR);
  ``reading``: gguf's readers shared within that one reading.
- ``weights``: the tensors read from the file into our network; ``packed``: quantized matrices kept as
  their ggml blocks, dequantized in the forward.
- ``memory``: what a GGUF's load and its model take, from its Header.

A load reads the header once (read_header) and hands the Header on. Only this package imports gguf (the
llama.cpp reader package). May import: ``mha.loading.convert``, ``mha.loading.checkpoint_files``,
``mha.loading.config_snapshot``, ``mha.loading.load_progress``, ``mha.networks``, ``mha.errors``; nothing
above loading.
"""

from mha.loading.gguf.bounds import MAX_LAYERS, MAX_TENSORS, MAX_VOCAB, check_bounds
from mha.loading.gguf.cache import CACHE_KIND, CachedConfig, cached_config, cached_directory
from mha.loading.gguf.folders import CACHE_ENV
from mha.loading.gguf.header import (
    Header,
    architecture,
    header_digest,
    read_header,
    supported_architectures,
)
from mha.loading.gguf.locate import BUNDLED_LLM_NAME, GGUF_SUFFIX, bundled_llm_file, find_gguf, source_name
from mha.loading.gguf.memory import held_nbytes, load_need
from mha.loading.gguf.packed import DEFAULT_DEQUANT_CACHE_BYTES

__all__ = [
    "BUNDLED_LLM_NAME",
    "CACHE_ENV",
    "CACHE_KIND",
    "DEFAULT_DEQUANT_CACHE_BYTES",
    "GGUF_SUFFIX",
    "MAX_LAYERS",
    "MAX_TENSORS",
    "MAX_VOCAB",
    "CachedConfig",
    "Header",
    "architecture",
    "bundled_llm_file",
    "cached_config",
    "cached_directory",
    "check_bounds",
    "find_gguf",
    "header_digest",
    "held_nbytes",
    "load_need",
    "read_header",
    "source_name",
    "supported_architectures",
]
