"""A trace's memory is what mha.trace.blocked declares it to be (mha/trace/memory.py): `Trace.nbytes` counts
every buffer the trace holds, and its forward never holds more than `peak_nbytes` (the trace plus its
scratch).

The forward's allocations are measured with a TorchDispatchMode that sees every tensor an operator returns
and counts its storage from its first appearance until it is freed (a weakref finalizer on the storage):
the live bytes at every step, on every thread the forward's row blocks run on, and the trace's own buffer
(a memory map, which no operator makes). Only an operator's internal workspace (a BLAS kernel's packing
buffers, kilobytes) is out of its sight.
"""

from __future__ import annotations

import gc
import threading
import weakref
from typing import Any

import pytest
import torch
from checkpoints import FAMILIES
from spies import record_calls
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from mha import AttentionModel, _threads
from mha.trace import blocked as trace_module
from mha.trace.blocked import expected_nbytes, peak_nbytes, trace_forward
from mha.trace.memory import objects_nbytes, python_nbytes

# ~60 tokens for every tokenizer here (as tests/mha/test_trace.py), run in row blocks of 8: many blocks,
# dealt out to two threads where the test asks for two.
TEXT = (
    "The animal didn't cross the street because it was too tired. Attention heads look at tokens; some "
    "look at the previous token, some at punctuation, and some at the first token of all."
)
ROW_BLOCK = 8


class LiveBytes(TorchDispatchMode):
    """The bytes of the storages operators returned that are still alive, and their peak (module
    docstring). A storage an operator's output shares with one of its inputs (a view, an in-place or out=
    result) is not new; nor is one already counted."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self._sizes: dict[int, int] = {}
        self._lock = threading.Lock()

    def _freed(self, address: int) -> None:
        with self._lock:
            self.live -= self._sizes.pop(address)

    def track(self, tensor: torch.Tensor) -> None:
        """Count `tensor`'s storage until it is freed, unless it is counted already."""
        storage = tensor.untyped_storage()
        address, size = storage.data_ptr(), storage.nbytes()
        with self._lock:
            if size == 0 or address in self._sizes:
                return
            self._sizes[address] = size
            self.live += size
            self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._freed, address)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        inputs = {
            t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)
        }
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor) and tensor.untyped_storage().data_ptr() not in inputs:
                self.track(tensor)
        return out


def measured_peak(
    model: AttentionModel, threads: int, monkeypatch: pytest.MonkeyPatch, fused: bool | None = None
) -> tuple[int, int]:
    """(n, the peak bytes of tensors alive during trace_forward of TEXT on `threads` torch threads): the
    row blocks that run on worker threads, the blocked path's and the fused path's overview, are measured
    there too (a dispatch mode is per thread)."""
    ids = torch.tensor([model.encoder.encode_batch([(TEXT, None)], model.info.max_tokens)[0].ids])
    meter = LiveBytes()

    def measured(work: Any) -> Any:
        def run(self: Any, *args: Any) -> None:
            if threading.current_thread() is threading.main_thread():
                work(self, *args)  # the mode is already on in this thread
                return
            with meter:
                work(self, *args)

        return run

    for worker in ("_blocks", "_pool_blocks"):
        monkeypatch.setattr(trace_module._Recorder, worker, measured(getattr(trace_module._Recorder, worker)))
    kept_buffers = trace_module.kept_buffers

    def measured_buffers(*args: Any) -> Any:  # the trace's buffer is a memory map: no operator makes it
        layers, overview = kept_buffers(*args)
        meter.track(layers[0][0])
        return layers, overview

    monkeypatch.setattr(trace_module, "kept_buffers", measured_buffers)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode(), meter:
            trace_forward(model.network, ids, fused=fused)
    finally:
        torch.set_num_threads(before)
    return ids.shape[1], meter.peak


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("family", FAMILIES)
def test_a_forward_holds_at_most_its_declared_peak(
    models: dict[str, AttentionModel], family: str, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every tensor the forward allocates, the trace's own and its scratch, alive at once, stays within
    peak_nbytes: what the service admits a trace by. (peak_nbytes also budgets the trace's Python objects,
    PYTHON_BYTES_PER_TOKEN a token, which no tensor takes: taken off here.)"""
    monkeypatch.setattr(trace_module, "ROW_BLOCK", ROW_BLOCK)
    model = models[family]
    sections = record_calls(monkeypatch, _threads, "one_thread_each")
    n, peak = measured_peak(model, threads, monkeypatch)
    assert n > 2 * threads * ROW_BLOCK  # at least two blocks a thread: dealt out to the threads
    assert sections == ([threads] * model.info.layers if threads > 1 else [])
    declared = peak_nbytes(model.config, n, 4, threads=threads) - python_nbytes(n)
    kept = expected_nbytes(model.config, n, 4) - python_nbytes(n)
    assert kept < peak <= declared


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("family", ["bert", "gpt2", "llama", "qwen3", "phi3"])
def test_a_fused_forward_holds_at_most_its_declared_peak(
    models: dict[str, AttentionModel], family: str, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same on the fused path with its overview (trace_forward(fused=True), which a CPU trace takes
    only without one): the kernel's outputs and the overview's tiles on every thread stay within
    peak_nbytes too (the kernel's own per-thread buffers, which no operator returns, are declared apart:
    mha.trace.memory.FLASH_Q_SPLIT)."""
    monkeypatch.setattr(trace_module, "ROW_BLOCK", ROW_BLOCK)
    model = models[family]
    n, peak = measured_peak(model, threads, monkeypatch, fused=True)
    declared = peak_nbytes(model.config, n, 4, threads=threads) - python_nbytes(n)
    kept = expected_nbytes(model.config, n, 4) - python_nbytes(n)
    assert kept < peak <= declared


def reachable_tensors(root: object) -> list[torch.Tensor]:
    """Every tensor reachable from `root` through the garbage collector's references, the model's
    ModelInfo (shared, and holding no tensor) left out."""
    seen: set[int] = set()
    found: list[torch.Tensor] = []
    todo = [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, type):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            found.append(obj)
            continue
        todo.extend(gc.get_referents(obj))
    return found


@pytest.mark.parametrize("family", FAMILIES)
def test_a_trace_counts_every_buffer_it_holds(models: dict[str, AttentionModel], family: str) -> None:
    model = models[family]
    for text in ("Hi.", TEXT):  # two lengths: the per-token part and the overview's s x s both grow
        trace = model.trace(text)
        buffers = {
            t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in reachable_tensors(trace)
        }
        python = objects_nbytes(trace.tokens, trace.encoded)
        assert trace.nbytes == sum(buffers.values()) + python
        # Its tensors are exactly the declared per-token and overview bytes: no view keeps more alive.
        declared = expected_nbytes(model.config, trace.n, 4)  # float32 on the CPU
        assert sum(buffers.values()) == declared - python_nbytes(trace.n)
        assert python <= python_nbytes(trace.n)


def test_the_python_objects_fit_their_allowance(models: dict[str, AttentionModel]) -> None:
    """python_nbytes covers a trace's tokens, per-token lists and text, in any script, however short."""
    texts = (
        "a",
        "The animal didn't cross the street.",
        "吾輩は猫である。名前はまだ無い。",
        "Rain 🌧️☀️ and 🌈 with 👩‍👩‍👧.",
    )
    for model in models.values():
        for text in texts:
            trace = model.trace(text, overview_size=None)
            assert not trace.encoded.truncated
            assert objects_nbytes(trace.tokens, trace.encoded) <= python_nbytes(trace.n)
