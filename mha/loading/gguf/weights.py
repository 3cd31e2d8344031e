"""A GGUF file's tensors read into our network without converting them: quantized matrices stay as their
ggml blocks (mha.loading.gguf.packed), float ones are used as they are.

The file is memory-mapped (copy-on-write: a page is read when a forward first touches it, and nothing
writes to the file) and each tensor read where the header's tensor table puts it (mha.loading.gguf.header).
Each tensor gets transformers' name for it (transformers' GGUF name map, kept in the cache beside the
config: mha.loading.gguf.cache) and goes through transformers' tensor processor for
its architecture, as transformers' from_pretrained(gguf_file=...) does: on the values of a float tensor
(Gemma's norms stored as 1 + w), and on the row indices of a block tensor, whose answer is the order its
rows take (llama.cpp's rotary permutation of q and k), or a transpose (GPT-2's Conv1D weights, which our
converter transposes back, so its blocks stay as they are). A processor that changes values of a block
tensor cannot be followed on blocks: that tensor is dequantized at load.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple, cast

import numpy as np
import torch
from torch import nn

from mha.errors import CheckpointNotFoundError
from mha.loading.checkpoint_files import Checked
from mha.loading.convert import Converter, check_shapes
from mha.loading.convert.base import NetworkConfig, build_network, strip_prefix
from mha.loading.gguf.header import Header, TensorEntry
from mha.loading.gguf.packed import Blocks, DequantBudget, PackedEmbedding, PackedLinear, dequantize
from mha.loading.load_progress import Progress, report
from mha.networks.model import Transformer
from mha.networks.seq2seq import EncoderDecoder

__all__ = ["Names", "Tensor", "gguf_network", "hf_shapes", "load_network", "read_tensors"]

Tensor = torch.Tensor | Blocks
_FLOATS = {0: torch.float32, 1: torch.float16, 30: torch.bfloat16}  # ggml's F32, F16, BF16
# Where each ggml type's float16 scales sit in its block (the offsets transformers' dequantizer reads
# them at): a NaN or infinite scale makes its block's values so. IQ1_M spreads its scale over four
# fields, which the forward's output check catches instead.
_SCALES = {
    2: (0,),  # Q4_0
    3: (0, 2),  # Q4_1
    6: (0,),  # Q5_0
    7: (0, 2),  # Q5_1
    8: (0,),  # Q8_0
    10: (80, 82),  # Q2_K
    11: (108,),  # Q3_K
    12: (0, 2),  # Q4_K
    13: (0, 2),  # Q5_K
    14: (208,),  # Q6_K
    16: (0,),  # IQ2_XXS
    17: (0,),  # IQ2_XS
    18: (0,),  # IQ3_XXS
    19: (0,),  # IQ1_S
    20: (0,),  # IQ4_NL
    21: (0,),  # IQ3_S
    22: (0,),  # IQ2_S
    23: (0,),  # IQ4_XS
}


class Names(NamedTuple):
    """What the cache keeps for reading the tensors as transformers does (read_tensors): the cache
    folder's gguf_names.json (mha.loading.gguf.cache)."""

    names: dict[str, str]  # llama.cpp's tensor name -> transformers'
    processor_config: dict[str, Any]  # load_gguf_checkpoint's config, which its tensor processor reads


def load_network(
    header: Header,
    names: Names,
    checked: Checked,
    budget: DequantBudget,
    *,
    reading: Progress | None = None,
    building: Progress | None = None,
) -> tuple[Transformer | EncoderDecoder, Callable[[], torch.Tensor | None]]:
    """Our network holding the file's tensors as they are in it (read_tensors, then gguf_network), and
    what reads its LM head (dequantized when asked: only a continuation needs it). `reading` and
    `building` are told the progress of each."""
    theirs = read_tensors(header, names.processor_config, names.names, progress=reading)
    network = gguf_network(
        checked.config, checked.converter, theirs, budget, source=header.file, progress=building
    )
    head = theirs.get(checked.converter.lm_head)

    def read() -> torch.Tensor | None:
        return head.dense() if isinstance(head, Blocks) else head

    return network, read


def read_tensors(
    header: Header,
    hf_config: Mapping[str, Any],
    names: Mapping[str, str],
    *,
    progress: Progress | None = None,
) -> dict[str, Tensor]:
    """transformers' name -> the tensor (float) or its Blocks, of every tensor `names` maps (llama.cpp's
    name -> transformers'); tensors it does not map are skipped, as transformers skips them. progress(i, n)
    as each of the n tensors is read."""
    processor = _processor(header.architecture, hf_config)
    blob = np.memmap(header.file, mode="c", dtype=np.uint8)  # copy-on-write: nothing ever reaches the file
    out: dict[str, Tensor] = {}
    entries = header.tensors
    for i, entry in enumerate(entries):
        report(progress, i, len(entries))
        raw = blob[entry.start : entry.start + entry.nbytes]
        value: Tensor
        if entry.ggml_type in _FLOATS:
            name, value = _float_tensor(processor, entry, raw)
        else:
            name, value = _block_tensor(processor, entry, raw)
        _keep(out, names, name, value)
    return out


def _process(processor: Any, name: str, weights: np.ndarray) -> tuple[str | None, np.ndarray]:
    """transformers' processor on one tensor: (its name after, its values after). GPT-2's moves its
    output weight into parsed_parameters under its transformers name and returns no name: that name is
    returned marked "@" (see _keep)."""
    parsed: dict[str, dict[str, Any]] = {"tensors": {}}
    result = processor.process(weights=weights, name=name, tensor_key_mapping={}, parsed_parameters=parsed)
    if result.name is None and len(parsed["tensors"]) == 1:
        moved, tensor = next(iter(parsed["tensors"].items()))
        return f"@{moved}", tensor.numpy()
    return result.name, result.weights


def _float_tensor(processor: Any, entry: TensorEntry, raw: np.ndarray) -> tuple[str | None, torch.Tensor]:
    """A float tensor, in float32 as transformers' loader gives it; F32 left unprocessed stays a view of
    the file's map."""
    with warnings.catch_warnings():  # a copy-on-write map is writable; torch warns for read-only ones
        warnings.simplefilter("ignore", UserWarning)
        stored = torch.from_numpy(raw.view(np.uint8)).view(_FLOATS[entry.ggml_type]).view(entry.shape)
    values = stored.float().numpy()
    name, processed = _process(processor, entry.name, values)
    if processed is values:
        return name, torch.from_numpy(values)
    return name, torch.from_numpy(np.ascontiguousarray(processed, dtype=np.float32))


class _Rows(NamedTuple):
    """What transformers' processor does to a 2-D tensor's rows, found from their indices alone."""

    name: str | None  # the tensor's name after it
    order: np.ndarray | None  # the rows' order (None: as stored); with `transposed`, as stored
    transposed: bool


def _rows(processor: Any, name: str, rows: int) -> _Rows | None:
    """How the processor moves the rows of a tensor of `rows` rows: run on their indices, it reorders
    them (llama.cpp's rotary permutation), transposes them (GPT-2's Conv1D weights) or leaves them; None
    where it does anything else (a tensor it changes the values of)."""
    index = np.arange(rows, dtype=np.float64)
    renamed, probe = _process(processor, name, index.reshape(rows, 1))
    if probe.shape == (rows, 1) and np.array_equal(np.sort(probe[:, 0]), index):
        order = probe[:, 0].astype(np.int64)
        return _Rows(renamed, None if (order == index).all() else order, False)
    if probe.shape == (1, rows) and np.array_equal(probe[0], index):
        return _Rows(renamed, None, True)
    return None


def _block_tensor(processor: Any, entry: TensorEntry, raw: np.ndarray) -> tuple[str | None, Tensor]:
    """A block tensor as Blocks, its rows in the order transformers' processor gives them; dequantized
    here where the processor does more than reorder rows or transpose."""
    rows = entry.shape[0]
    columns = int(np.prod(entry.shape[1:]))
    data = torch.from_numpy(raw).view(rows, -1)
    moved = _rows(processor, entry.name, rows) if len(entry.shape) == 2 else None
    if moved is not None:
        order = None if moved.order is None else torch.from_numpy(moved.order)
        return moved.name, Blocks(data, entry.ggml_type, (rows, columns), order, moved.transposed)
    values = dequantize(data, entry.ggml_type, columns).view(entry.shape).numpy()
    name, processed = _process(processor, entry.name, values)
    return name, torch.from_numpy(np.ascontiguousarray(processed, dtype=np.float32))


def hf_shapes(
    header: Header, processor_config: Mapping[str, Any], names: Mapping[str, str]
) -> dict[str, tuple[int, ...]]:
    """transformers' name -> shape of each tensor read_tensors would give, from the header alone (no
    tensor read), so a cache folder is published only for a file whose tensors our key map takes."""
    processor = _processor(header.architecture, processor_config)
    shapes: dict[str, tuple[int, ...]] = {}
    for entry in header.tensors:
        moved = _rows(processor, entry.name, entry.shape[0]) if len(entry.shape) == 2 else None
        name = entry.name if moved is None else moved.name
        shape = entry.shape[::-1] if moved is not None and moved.transposed else entry.shape
        _keep(shapes, names, name, shape)
    return shapes


def _keep(out: dict[str, Any], names: Mapping[str, str], name: str | None, value: Any) -> None:
    """`value` under transformers' name for `name` (one the processor already gave, marked @, as is)."""
    if name is not None and name.startswith("@"):
        out[name[1:]] = value
    elif name is not None and name in names:
        out[names[name]] = value


def _processor(architecture: str, processor_config: Mapping[str, Any]) -> Any:
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    return TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=dict(processor_config))


def gguf_network(
    config: NetworkConfig,
    converter: Converter,
    theirs: Mapping[str, Tensor],
    budget: DequantBudget,
    *,
    source: Path,
    progress: Progress | None = None,
) -> Transformer | EncoderDecoder:
    """Our network for `config` holding `theirs` (read_tensors'): every key problem reported at once
    (convert.check_shapes), a linear layer or embedding with blocks in its weight a PackedLinear or
    PackedEmbedding, every float weight adopted as it is; a block tensor whose float16 scales hold NaN
    or an infinity refused (CheckpointNotFoundError naming it). progress(i, n) as each of our n weights
    is taken (checking a block tensor's scales reads all of its blocks: most of the time here)."""
    key_map = converter.key_map(config)
    shapes = {k: v.hf_shape if isinstance(v, Blocks) else tuple(v.shape) for k, v in theirs.items()}
    check_shapes(shapes, key_map, config, family=converter.family)
    inside, _heads = strip_prefix(theirs, key_map)
    dense: dict[str, torch.Tensor] = {}
    packed: dict[str, list[Blocks | torch.Tensor]] = {}
    for i, (our_key, their_keys) in enumerate(key_map.sources.items()):
        report(progress, i, len(key_map.sources))
        parts = [_transposed(inside[k]) if k in key_map.transposed else inside[k] for k in their_keys]
        if any(isinstance(p, Blocks) for p in parts):
            for their_key, part in zip(their_keys, parts, strict=True):
                if isinstance(part, Blocks):
                    _check_scales(part, their_key, source)
            packed[our_key] = parts
        else:
            floats = [p for p in parts if isinstance(p, torch.Tensor)]
            dense[our_key] = floats[0] if len(floats) == 1 else torch.cat(floats, dim=0)
    with torch.device("meta"):
        network = build_network(config)
    for our_key, parts in packed.items():
        module_name, _ = our_key.rsplit(".", 1)
        module = network.get_submodule(module_name)
        if isinstance(module, nn.Linear) and our_key.endswith(".weight"):
            bias = dense.pop(f"{module_name}.bias", None)
            network.set_submodule(module_name, PackedLinear(parts, module.in_features, bias, budget))
        elif isinstance(module, nn.Embedding) and len(parts) == 1 and isinstance(parts[0], Blocks):
            network.set_submodule(module_name, PackedEmbedding(parts[0], budget))
        else:  # a block tensor no packed module holds: dequantized once
            floats = [p.dense() if isinstance(p, Blocks) else p for p in parts]
            dense[our_key] = floats[0] if len(floats) == 1 else torch.cat(floats, dim=0)
    network.load_state_dict(dense, strict=False, assign=True)
    left = [name for name, t in [*network.named_parameters(), *network.named_buffers()] if t.is_meta]
    if left:  # a key map whose weights the checks above all passed leaves none: an invariant
        raise AssertionError(f"weights left unloaded: {left}")
    return cast("Transformer | EncoderDecoder", network.eval())


def _transposed(tensor: Tensor) -> Tensor:
    return tensor.t()


def _check_scales(blocks: Blocks, name: str, source: Path) -> None:
    """CheckpointNotFoundError where a float16 scale of `blocks` is NaN or infinite: its values would be."""
    from transformers.integrations.gguf.dequant import GGML_BLOCK

    offsets = _SCALES.get(blocks.ggml_type)
    if offsets is None:
        return
    width = (
        GGML_BLOCK[blocks.ggml_type][1] if blocks.ggml_type in GGML_BLOCK else _block_bytes(blocks.ggml_type)
    )
    every = blocks.data.reshape(-1, width)
    bad = 0
    for offset in offsets:
        scales = every[:, offset : offset + 2].contiguous().view(torch.float16)
        bad += int((~torch.isfinite(scales)).sum())
    if bad:
        raise CheckpointNotFoundError(
            f"{source}: its weight {name} holds {bad:,} NaN or infinite float16 scales of "
            f"{every.shape[0] * len(offsets):,}: damaged"
        )


def _block_bytes(ggml_type: int) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    return int(GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)][1])
