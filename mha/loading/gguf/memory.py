"""The memory model of a GGUF file's first load (issue 33 item 5): what load_pretrained of a GGUF adds to
the process's peak resident memory, as a fixed part, a part per vocabulary entry and a part per weight.

The one place it is stated (docs/memory-and-load.md quotes it): tests/mha/test_load_memory.py loads a
GGUF of 2^17 vocabulary entries in a fresh process and holds its peak to `load_nbytes`. A change to how
GGUF weights load changes WEIGHT_BYTES here, per ggml type.

Where the bytes go in a first load (mha.loading.gguf.cache: the config, the tensor names and the
tokenizer, cached; then the network built from the file itself, mha.loading.gguf.weights): gguf's reader
of the metadata (mha.loading.gguf.reading.lean_reader); transformers' conversion of the vocabulary into a
fast tokenizer, then that tokenizer read back; the file's pages that loading touches (memory-mapped,
copy-on-write); float tensors copied to float32; quantized matrices kept as their ggml blocks (the
dequantized layers a forward keeps come later, bounded by HEADSCOPE_DEQUANT_CACHE_BYTES).

Measured here (docs/benchmarks.md, "A GGUF file's first load"): tiny Llama GGUFs of 2^17 and 2^18
vocabulary entries at width 16 and of 2^17 at width 128, each loaded in a fresh process. The line through
them: 94 MiB fixed, 983 bytes an entry, 7.5 bytes an F16 weight; at width 128 an F32 weight took 3.5 bytes,
a Q8_0 or Q4_0 one 0.8. Each constant below is its measured value rounded up.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from mha.loading.gguf.header import Header

__all__ = [
    "FIXED_BYTES",
    "VOCAB_ENTRY_BYTES",
    "WEIGHT_BYTES",
    "held_nbytes",
    "load_nbytes",
    "load_need",
    "load_shape",
]

# transformers' model and tokenizer code imported on the way, the meta skeleton, the cache's files
# (measured 94 MiB).
FIXED_BYTES = 128 * 2**20
# One token of tokenizer.ggml.tokens: ~450 bytes in gguf's reader (its length and bytes as two numpy
# views), the fast tokenizer transformers builds and the one read back from the cache, the token lists
# load_gguf_checkpoint parses (measured 983).
VOCAB_ENTRY_BYTES = 1_024
# One weight, by its ggml type ("*": any type not named, the quantized ones): F16 and BF16 read from the
# file's pages (2 bytes) and copied to float32 (4), with the conversion's transient beside it (measured 7.5);
# F32 read as it is (measured 3.5); a quantized type kept as its blocks (at most 1.0625 bytes, Q8_0's;
# measured 0.8 for Q8_0 and Q4_0).
WEIGHT_BYTES: Mapping[str, float] = {"F16": 8.0, "BF16": 8.0, "F32": 4.0, "*": 1.25}


def load_nbytes(vocab: int, weights: Mapping[str, int]) -> int:
    """The most a first load of a GGUF of `vocab` vocabulary entries and `weights` (ggml type name ->
    how many weights are of it) adds to the peak resident memory, by the model above."""
    per_weight = sum(count * WEIGHT_BYTES.get(kind, WEIGHT_BYTES["*"]) for kind, count in weights.items())
    return FIXED_BYTES + vocab * VOCAB_ENTRY_BYTES + int(per_weight)


def load_shape(header: Header) -> tuple[int, dict[str, int]]:
    """(vocabulary entries, ggml type name -> weights of it) of a GGUF, from its header alone."""
    return header.vocab, header.weights


def held_nbytes(header: Header, dequant_cache_bytes: int) -> int:
    """What a GGUF's model holds once loaded on the CPU, as AttentionModel.nbytes counts it (issue 48 E4),
    from its header alone: each float tensor as float32, each quantized one as its ggml blocks, and the
    dequantized-weight cache at what it can ever keep, the smaller of `dequant_cache_bytes` and every
    quantized matrix in float32. The registry refuses a model over the budget by this, before loading it.

    An upper bound, tight for a real model: it also counts the int64 row order a quantized tensor may keep
    (Llama's q and k rows, permuted back by transformers) for every quantized tensor (8 bytes a row), which
    for the bundled SmolLM2 is 1.6 MB over a count of 635 MB."""
    weights = quantized = 0
    for entry in header.tensors:
        values = math.prod(entry.shape)
        if entry.ggml_type in _FLOATS:
            weights += values * 4
        else:
            weights += entry.nbytes + 8 * (entry.shape[0] if entry.shape else 1)
            quantized += values * 4
    return weights + min(dequant_cache_bytes, quantized)


def load_need(header: Header, dequant_cache_bytes: int) -> int:
    """What loading a GGUF needs of the models' memory budget: the larger of its first load's peak
    (load_nbytes) and what its model holds once loaded (held_nbytes), which is never below what the budget
    counts for it afterwards."""
    return max(load_nbytes(*load_shape(header)), held_nbytes(header, dequant_cache_bytes))


_FLOATS = frozenset({0, 1, 30})  # ggml's F32, F16, BF16
