"""A GGUF's quantized matrices kept as the file's ggml blocks, dequantized layer by layer in the forward.

- `Blocks`: one tensor of the file as its rows of ggml blocks, (rows, bytes a row) uint8, a view of the
  file's memory map (no copy), with the row order transformers' GGUF loader gives it (llama.cpp permutes
  the rotary q and k rows; transformers' tensor processor says how, and the rows are gathered so).
- `PackedLinear` and `PackedEmbedding` stand in for nn.Linear and nn.Embedding. Their `weight` is a
  property that dequantizes on demand, so everything that reads a layer's weight (the single-sequence
  path, value norms, head ablation, the LM head) works unchanged; the blocks are uint8 buffers, so
  `.to(device)` moves them and `.to(float16)` leaves them, and the layer dequantizes to the dtype the
  model runs in. A fused projection whose parts have different ggml types (Q4_K_M's Q6_K attn_v beside
  Q4_K q and k) dequantizes each part into its rows of one float matrix: no concatenation copy. A
  PackedLinear that is not kept multiplies its weight a chunk of rows at a time, as each is dequantized,
  and never makes the whole float weight.
- `DequantBudget`: the bytes of dequantized weights a model keeps between forwards
  (HEADSCOPE_DEQUANT_CACHE_BYTES in the service). A layer keeps its float weight while the budget has
  room and dequantizes anew on each use when it has none. Layers are kept in the order first used, and a
  kept one stays until the model is unloaded or moved: a forward walks the layers in order, where
  least-recently-used eviction would drop each layer just before its next use.

The dequantizer is transformers' (`transformers.integrations.gguf.dequant.dequantize`, torch ops, on the
device the blocks are on); for a type its torch code lacks (Q5_0, Q5_1), gguf's numpy one. It runs a
chunk of rows at a time, on the CPU a chunk small enough that its dozen passes stay in cache (what decides
its speed: _CPU_CHUNK_VALUES). `compiled` (opt-in, HEADSCOPE_DEQUANT_COMPILE) runs it under torch.compile
instead, one compile per ggml type (10-40 s cold), shapes dynamic, the same values. Inductor fuses the
steps into one loop, which pays for Q5_K and Q4_1, is even for Q4_K and Q2_K, and is 3-5x slower for Q6_K
and the IQ types, whose byte reinterpretations (`view(torch.int8)`, a float16 field read from the
blocks) it turns into scalar gathers: docs/design.md. Where inductor cannot compile (no C++ compiler),
the eager code runs, with one warning.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "DEFAULT_DEQUANT_CACHE_BYTES",
    "Blocks",
    "DequantBudget",
    "PackedEmbedding",
    "PackedLinear",
    "dequantize",
]

logger = logging.getLogger(__name__)

# What a model keeps dequantized by default: the bundled SmolLM2's layers and tied head in float32
# (0.54 GB) fit, a 1 B model's (4 GB) do not, so those dequantize on every forward within file + 1 layer.
DEFAULT_DEQUANT_CACHE_BYTES = 768 << 20
# Values dequantized at once. The dequantizer runs each of a K-quant's dozen steps as its own torch op,
# a pass over a chunk and its temporaries (a few times its float32 output). On the CPU a chunk of 2^19
# values (2 MiB out, ~8 MiB with temporaries) keeps those passes in cache: Q4_K and Q6_K dequantize 2.5-4x
# faster than in chunks of 2^23, whose passes go to memory (docs/design.md). On a GPU the cache is not what
# limits, kernel launches are: 2^23 values, temporaries bounded to ~100 MB.
_CPU_CHUNK_VALUES = 1 << 19
_CHUNK_VALUES = 1 << 23


@dataclass(frozen=True)
class Blocks:
    """One tensor of a GGUF as its rows of ggml blocks: `data` (rows, bytes a row) uint8 in the file's
    order, `rows` the order transformers gives them in (None: the file's), `shape` the (rows, columns)
    of values, `transposed` where transformers' processor transposes it (GPT-2's Conv1D weights: our
    converter transposes them back, so the blocks never move)."""

    data: torch.Tensor
    ggml_type: int
    shape: tuple[int, int]
    rows: torch.Tensor | None = None
    transposed: bool = False

    def t(self) -> Blocks:
        """The transpose, as convert.base applies it to a Conv1D weight: only the shape it reports turns."""
        return replace(self, transposed=not self.transposed)

    @property
    def hf_shape(self) -> tuple[int, ...]:
        """The shape transformers' tensor has (what a converter's key map checks)."""
        return self.shape[::-1] if self.transposed else self.shape

    def dense(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """All of it dequantized, (rows, columns) of `dtype`."""
        out = torch.empty(self.shape, dtype=dtype, device=self.data.device)
        self.dequantize_into(out)
        return out

    def dequantize_into(self, out: torch.Tensor, *, compiled: bool = False) -> None:
        """Fill `out` (rows, columns) with the values, a chunk of rows at a time (`compiled`: see
        dequantize)."""
        for start, values in self.chunks(compiled=compiled):
            out[start : start + values.shape[0]] = values

    def chunks(self, *, compiled: bool = False) -> Iterator[tuple[int, torch.Tensor]]:
        """(first row, those rows' float32 values), a chunk of rows at a time, in transformers' row order
        (`compiled`: see dequantize)."""
        rows, columns = self.shape
        at_once = _CPU_CHUNK_VALUES if self.data.device.type == "cpu" else _CHUNK_VALUES
        step = max(1, at_once // columns)
        for start in range(0, rows, step):
            chunk = (
                self.data[start : start + step]
                if self.rows is None
                else self.data[self.rows[start : start + step]]
            )
            yield start, dequantize(chunk, self.ggml_type, columns, compiled=compiled)


def dequantize(blocks: torch.Tensor, ggml_type: int, columns: int, *, compiled: bool = False) -> torch.Tensor:
    """(rows, bytes a row) uint8 blocks -> (rows, columns) float32, on their device: transformers' torch
    dequantizer (under torch.compile where `compiled` and inductor can: _compiled), or gguf's numpy one
    for a type the former lacks."""
    from transformers.integrations.gguf.dequant import GGML_BLOCK
    from transformers.integrations.gguf.dequant import dequantize as torch_dequantize

    rows = blocks.shape[0]
    if ggml_type in GGML_BLOCK:
        run = (_compiled(ggml_type, blocks.device) if compiled else None) or torch_dequantize
        return run(blocks.reshape(-1), ggml_type, torch.float32).view(rows, columns)
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as numpy_dequantize

    values = numpy_dequantize(blocks.cpu().numpy(), GGMLQuantizationType(ggml_type))
    return torch.from_numpy(values.reshape(rows, columns)).to(blocks.device)


_COMPILE_LOCK = threading.Lock()
_COMPILED: dict[
    tuple[int, str], Callable[..., torch.Tensor] | None
] = {}  # (type, device type) -> its dequantizer


def _compiled(ggml_type: int, device: torch.device) -> Callable[..., torch.Tensor] | None:
    """transformers' dequantizer under torch.compile for `ggml_type` on `device`'s kind, compiled on first
    use; None where inductor could not (the eager one then runs: the same values, slower).

    dynamic=True: one compile a type serves every tensor's shape (a static compile would compile again
    for each matrix size and chunk). The first call of each type runs under a lock, as dynamo's compiling
    is not safe from two threads at once; once compiled, calls run in parallel."""
    key = (ggml_type, device.type)
    if key in _COMPILED:
        return _COMPILED[key]
    with _COMPILE_LOCK:
        if key not in _COMPILED:
            from transformers.integrations.gguf.dequant import GGML_BLOCK
            from transformers.integrations.gguf.dequant import dequantize as torch_dequantize

            run: Callable[..., torch.Tensor] | None = torch.compile(torch_dequantize, dynamic=True)
            # Seconds to a minute in which a forward shows no progress: the log says why.
            logger.info("compiling the GGUF dequantizer for ggml type %d on %s, once", ggml_type, device.type)
            began = time.perf_counter()
            try:
                # Compiled here, on two blocks of zeros: a finite, real block of every type.
                assert run is not None
                run(torch.zeros(2 * GGML_BLOCK[ggml_type][1], dtype=torch.uint8, device=device), ggml_type)
            except Exception as exc:  # noqa: BLE001 - inductor's failures have no common type
                logger.warning(
                    "torch.compile of the GGUF dequantizer failed for ggml type %d on %s, so it runs "
                    "uncompiled (about 3x slower): %s: %s",
                    ggml_type,
                    device.type,
                    type(exc).__name__,
                    str(exc).splitlines()[0][:200] if str(exc) else "",
                )
                run = None
            else:
                logger.info("compiled it in %.1f s", time.perf_counter() - began)
            _COMPILED[key] = run
    return _COMPILED[key]


class DequantBudget:
    """Bytes of dequantized weights a model may keep; shared by its packed layers, thread-safe.
    `compiled`: its layers dequantize under torch.compile (dequantize)."""

    def __init__(self, limit: int, *, compiled: bool = False) -> None:
        if limit < 0:
            raise ValueError(f"the dequantized-weight budget ({limit}) must be 0 or more bytes")
        self.limit = limit
        self.used = 0
        self.compiled = compiled
        self._lock = threading.Lock()

    def has_room(self, nbytes: int) -> bool:
        """Whether `nbytes` more would fit now (a hint: take decides)."""
        return self.used + nbytes <= self.limit

    def take(self, nbytes: int) -> bool:
        with self._lock:
            if self.used + nbytes > self.limit:
                return False
            self.used += nbytes
            return True

    def give(self, nbytes: int) -> None:
        with self._lock:
            self.used -= nbytes


class _Packed(nn.Module):
    """What PackedLinear and PackedEmbedding share: parts (Blocks or float tensors) filling the rows of one
    float weight, held as buffers; the dtype it dequantizes to, followed through .to() and .half(); the
    float weight kept while the budget allows."""

    def __init__(self, parts: list[Blocks | torch.Tensor], columns: int, budget: DequantBudget) -> None:
        super().__init__()
        self.kinds: list[int | None] = []
        self.row_counts: list[int] = []
        for i, part in enumerate(parts):
            if isinstance(part, Blocks):
                self.register_buffer(f"blocks{i}", part.data, persistent=False)
                self.register_buffer(f"order{i}", part.rows, persistent=False)
                self.kinds.append(part.ggml_type)
                self.row_counts.append(part.shape[0])
            else:
                self.register_buffer(f"blocks{i}", part, persistent=False)
                self.kinds.append(None)
                self.row_counts.append(part.shape[0])
        self.columns = columns
        self.budget = budget
        self.dtype = torch.float32
        self._kept: torch.Tensor | None = None
        self._lock = threading.Lock()

    @property
    def dequantized_nbytes(self) -> int:
        """The bytes its float weight takes when kept (what it may take of the budget), in float32 at
        most: the count of a model's bytes is the same on every device and dtype (mha._memory)."""
        return sum(self.row_counts) * self.columns * 4

    @property
    def weight(self) -> torch.Tensor:
        """(rows, columns): every part dequantized into its rows, in the model's dtype and device."""
        kept = self._kept
        if kept is not None:
            return kept
        device = self._buffer("blocks", 0).device
        out = torch.empty(sum(self.row_counts), self.columns, dtype=self.dtype, device=device)
        for start, values in self._chunks():
            out[start : start + values.shape[0]] = values
        with self._lock:
            if self._kept is None and self.budget.take(out.numel() * out.element_size()):
                self._kept = out
        return out

    def _chunks(self) -> Iterator[tuple[int, torch.Tensor]]:
        """(first row, those rows of the weight in the model's dtype), a chunk of rows at a time: each
        part's blocks in Blocks.chunks' chunks, a float part whole."""
        start = 0
        for i, (kind, count) in enumerate(zip(self.kinds, self.row_counts, strict=True)):
            data = self._buffer("blocks", i)
            if kind is None:
                yield start, data.to(self.dtype)
            else:
                blocks = Blocks(data, kind, (count, self.columns), self._buffers.get(f"order{i}"))
                for first, values in blocks.chunks(compiled=self.budget.compiled):
                    yield start + first, values.to(self.dtype)
            start += count

    def _buffer(self, prefix: str, i: int) -> torch.Tensor:
        found = self._buffers[f"{prefix}{i}"]
        assert found is not None  # every part registers its blocks
        return found

    def forget(self) -> None:
        """Drop the kept float weight (its dtype or device changed), giving its bytes back."""
        with self._lock:
            if self._kept is not None:
                self.budget.give(self._kept.numel() * self._kept.element_size())
                self._kept = None

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Any:
        super()._apply(fn, recurse)
        # The dtype a float weight now gets: what fn makes of one (.to(device, dtype), .half(), .float()).
        probe = fn(torch.empty(0, dtype=self.dtype))
        if probe.is_floating_point():
            self.dtype = probe.dtype
        self.forget()
        return self


class PackedLinear(_Packed):
    """nn.Linear whose weight stays as ggml blocks (or float parts beside them), dequantized when used."""

    def __init__(
        self,
        parts: list[Blocks | torch.Tensor],
        in_features: int,
        bias: torch.Tensor | None,
        budget: DequantBudget,
    ) -> None:
        super().__init__(parts, in_features, budget)
        self.in_features = in_features
        self.out_features = sum(self.row_counts)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        nbytes = self.out_features * self.in_features * torch.finfo(self.dtype).bits // 8
        if self._kept is not None or self.budget.has_room(nbytes):
            return F.linear(x, self.weight, self.bias)  # kept, or about to be
        # Not kept: each chunk of rows is multiplied while it is still in cache, and the whole float weight
        # is never made. Writing it would cost as much again as the dequantizing: its fresh memory faults
        # in page by page (docs/design.md).
        bias = self.bias
        outs = [
            F.linear(x, values, None if bias is None else bias[start : start + values.shape[0]])
            for start, values in self._chunks()
        ]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, ggml_types={self.kinds}"


class PackedEmbedding(_Packed):
    """nn.Embedding whose table stays as ggml blocks: a forward dequantizes only the rows it looks up."""

    def __init__(self, blocks: Blocks, budget: DequantBudget) -> None:
        super().__init__([blocks], blocks.shape[1], budget)
        self.num_embeddings, self.embedding_dim = blocks.shape

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self._kept is not None:
            return F.embedding(input_ids, self._kept)
        flat = input_ids.reshape(-1)
        order = self._buffers.get("order0")
        rows = flat if order is None else order[flat]
        data = self._buffer("blocks", 0).index_select(0, rows)
        assert self.kinds[0] is not None  # an embedding is packed only when its table is blocks
        values = dequantize(data, self.kinds[0], self.embedding_dim, compiled=self.budget.compiled)
        values = values.to(self.dtype)
        return values.view(*input_ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, ggml_type={self.kinds[0]}"
