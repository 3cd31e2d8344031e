"""A trace (mha.trace) gives attend's weights, window by window, without ever holding an [n, n]
matrix.

Every family's tiny checkpoint, with the row block shrunk to 8 so that a 60-token text runs through many
blocks, sliding windows straddling their edges, against `attend` (proven equal to transformers' eager
attention by test_fidelity.py). Pooled results are checked against pooling attend's matrices in plain
Python loops over the same block edges.
"""

from __future__ import annotations

import pytest
import torch
from checkpoints import FAMILIES
from spies import record_calls
from tolerances import U32, float32_sum, recomputed_weight
from torch.utils._python_dispatch import TorchDispatchMode
from trace_threads import on_one_then_two_threads

from mha import AttentionModel, _threads
from mha.trace import blocked as trace_module
from mha.trace import overview, windows
from mha.trace.overview import edges
from mha.trace.windows import Trace

# ~60 tokens for every tokenizer here: longer than the sliding window (6) and than several row blocks.
TEXT = (
    "The animal didn't cross the street because it was too tired. Attention heads look at tokens; some "
    "look at the previous token, some at punctuation, and some at the first token of all."
)
PAIR = "It was happy there, said the dog."
ROW_BLOCK = 8


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace_module, "ROW_BLOCK", ROW_BLOCK)  # the forward's row blocks
    monkeypatch.setattr(windows, "ROW_BLOCK", ROW_BLOCK)  # a window's, a row's, an overview's


def pool_reference(matrix: torch.Tensor, rows: list[int], cols: list[int], reduce: str) -> torch.Tensor:
    """[..., R, C] pooled from [..., n, n] by the block edges, one block at a time."""
    out = torch.zeros(*matrix.shape[:-2], len(rows) - 1, len(cols) - 1)
    for r in range(len(rows) - 1):
        for c in range(len(cols) - 1):
            block = matrix[..., rows[r] : rows[r + 1], cols[c] : cols[c + 1]]
            out[..., r, c] = block.amax(dim=(-2, -1)) if reduce == "max" else block.mean(dim=(-2, -1))
    return out


def tolerance(trace: Trace, layers: range | int) -> float:
    """The trace recomputes each weight as exp(s - lse), in another kernel than attend's softmax: bounded
    by the largest score those layers can produce (tests/tolerances.py recomputed_weight)."""
    kept = [trace.layers[i] for i in (range(layers, layers + 1) if isinstance(layers, int) else layers)]
    max_score = max(float(k.q.norm(dim=-1).amax() * k.k.norm(dim=-1).amax()) * trace.scale for k in kept)
    return recomputed_weight(kept[0].q.shape[-1], max_score)


def check(got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    assert got.shape == want.shape
    assert (got - want).abs().max().item() <= tol


@pytest.mark.parametrize("family", FAMILIES)
def test_windows_and_rows_equal_attend(models: dict[str, AttentionModel], family: str) -> None:
    model = models[family]
    want = model.attend(TEXT, hidden_state=False)
    trace = model.trace(TEXT)
    assert trace.tokens == want.tokens and trace.n == want.n > 4 * ROW_BLOCK
    for layer in range(model.info.layers):
        for head in range(model.info.heads):
            window = trace.window(layer, head)
            assert window.exact and window.factor == (1, 1)
            check(window.values, want.attentions[layer, head], tolerance(trace, layer))
            for q in (0, trace.n // 2, trace.n - 1):
                check(trace.row(layer, head, q), want.attentions[layer, head, q], tolerance(trace, layer))


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_a_pair_traces_like_attend(models: dict[str, AttentionModel], family: str) -> None:
    want = models[family].attend(TEXT, PAIR, hidden_state=False)
    trace = models[family].trace(TEXT, PAIR)
    assert trace.encoded.segments == want.segments
    for layer in range(models[family].info.layers):
        check(trace.window(layer, 1).values, want.attentions[layer, 1], tolerance(trace, layer))


@pytest.mark.parametrize("family", ["gpt2", "mistral", "gemma2", "bert"])
@pytest.mark.parametrize("reduce", ["max", "mean"])
def test_pooled_results_equal_pooling_the_full_matrices(
    models: dict[str, AttentionModel], family: str, reduce: str
) -> None:
    model = models[family]
    full = model.attend(TEXT, hidden_state=False).attentions
    trace = model.trace(TEXT, overview_size=None)
    n = trace.n
    overview = trace.overview(size=7, reduce=reduce)
    assert overview.values.shape == (model.info.layers, model.info.heads, 7, 7) and not overview.exact
    # A max or a mean of values each within the bound is within it too.
    every = tolerance(trace, range(model.info.layers))
    check(overview.values, pool_reference(full, overview.row_edges, overview.col_edges, reduce), every)
    # A window that is pooled on one side and exact on the other.
    window = trace.window(2 % model.info.layers, 1, rows=(3, n - 2), cols=(5, 12), max_cells=9, reduce=reduce)
    assert window.row_edges == edges(3, n - 2, 9).tolist() and window.col_edges == list(range(5, 13))
    sub = full[2 % model.info.layers, 1]
    check(window.values, pool_reference(sub, window.row_edges, window.col_edges, reduce), every)


@pytest.mark.parametrize(
    ("n", "cells", "window"),
    [(64, 16, None), (64, 16, 11), (61, 7, None), (61, 7, 5), (40, 40, None), (64, 8, 4)],
    ids=["even", "even-windowed", "uneven", "uneven-windowed", "exact", "even-narrow-window"],
)
@pytest.mark.parametrize("reduce", ["max", "mean"])
def test_pooling_block_by_block_equals_pooling_the_whole(
    n: int, cells: int, window: int | None, reduce: str
) -> None:
    """Blocks fed as a causal trace feeds them (rows in ROW_BLOCKs, keys from the block's window to its
    last row) pool to what the whole matrix pools to, whether cells are even (one reshape per axis),
    uneven (cell by cell and scattered), one token each, or cut mid-cell by a window's first key."""
    gen = torch.Generator().manual_seed(n + cells)
    full = torch.rand(3, n, n, generator=gen).tril()
    cuts = edges(0, n, cells)
    pool = overview.Pool(3, cuts, cuts, reduce)  # type: ignore[arg-type]
    for start in range(0, n, ROW_BLOCK):
        rows = (start, min(start + ROW_BLOCK, n))
        cols = trace_module.key_span(rows, True, window, n)
        block = full[:, rows[0] : rows[1], cols[0] : cols[1]]
        if window is not None:  # the keys a window hides are zero weights, as in a trace
            keep = trace_module.band_keep(rows, cols, causal=True, window=window)
            assert keep is not None
            block = block.masked_fill(~keep, 0.0)
            full[:, rows[0] : rows[1], cols[0] : cols[1]] = block
            full[:, rows[0] : rows[1], : cols[0]] = 0.0
        pool.add(block, rows, cols)
    got = pool.result()
    want = pool_reference(full, cuts.tolist(), cuts.tolist(), reduce)
    # max picks one of the values: exact. mean: a float32 sum of a cell's k <= area values in [0, 1) in
    # another order (k·u of the sum, so k·u of the mean times k / area <= k·u), and the division's u.
    area = int(cuts.diff().max()) ** 2
    check(got.values, want, 0.0 if reduce == "max" else float32_sum(area) + U32)


def test_the_overview_pooled_in_the_forward_is_reused(models: dict[str, AttentionModel]) -> None:
    model = models["qwen2"]
    first = model.trace(TEXT, overview_size=16)
    again = model.trace(TEXT, overview_size=None).overview(size=16)
    assert first.first_overview is not None and first.overview(size=16) is first.first_overview
    check(first.first_overview.values, again.values, tolerance(first, range(model.info.layers)))


def test_a_short_input_overview_is_exact(models: dict[str, AttentionModel]) -> None:
    model = models["llama"]
    want = model.attend("Hi there.", hidden_state=False).attentions
    trace = model.trace("Hi there.")
    overview = trace.overview(size=128)
    assert overview.exact
    check(overview.values, want, tolerance(trace, range(model.info.layers)))


def test_the_longest_input_traces_like_attend(models: dict[str, AttentionModel]) -> None:
    model = models["mistral"]  # every layer windowed
    long = " ".join([TEXT] * 4)
    want = model.attend(long, hidden_state=False)
    trace = model.trace(long)
    assert want.truncated and trace.n == want.n == model.info.max_tokens
    for layer in range(model.info.layers):
        check(trace.window(layer, 3).values, want.attentions[layer, 3], tolerance(trace, layer))


class _Shapes(TorchDispatchMode):
    """Every shape an operator returns while active."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                self.shapes.append(tuple(t.shape))
        return out


@pytest.mark.parametrize("family", ["llama", "gpt2", "bert"])
def test_no_square_matrix_is_ever_held(models: dict[str, AttentionModel], family: str) -> None:
    model = models[family]
    text = TEXT[:100]  # under every model's limit, so n is none of the layer widths (32, 64, 96)
    n = len(model.encoder.encode_batch([(text, None)], model.info.max_tokens)[0].ids)
    cfg = model.config
    assert n not in (cfg.embed_dim, cfg.ffn_dim, 2 * cfg.ffn_dim) and n > 3 * ROW_BLOCK
    with _Shapes() as seen:
        trace = model.trace(text, overview_size=16)
        trace.window(1, 2, max_cells=16)
        trace.row(1, 2, n - 1)
    assert seen.shapes and trace.n == n
    assert not [s for s in seen.shapes if s[-2:] == (n, n)]
    # Nothing grows as n²: the largest tensor is one row block's scores [H, block, n], a per-token
    # activation [n, width] (the widest: the gated feed-forward's gate and up, 2F) or a weight's view.
    width = max(2 * cfg.ffn_dim, cfg.embed_dim, 3 * cfg.num_heads * (cfg.head_dim or 0))
    weight = max(p.numel() for p in model.network.parameters())
    largest = max(torch.Size(s).numel() for s in seen.shapes)
    assert largest <= max(cfg.num_heads * ROW_BLOCK * n, n * width, weight)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_trace_keeps_one_buffer_holding_nothing_else(
    models: dict[str, AttentionModel], family: str
) -> None:
    """Every layer's q, k, lse and value norms and the overview are views into one buffer (mha.trace.blocked.
    kept_buffers), and the buffer is exactly their size: no view of the fused q/k/v projection keeps it
    alive, nothing is kept twice (Trace.nbytes counts whole buffers: test_trace_memory.py)."""
    trace = models[family].trace(TEXT)
    assert trace.first_overview is not None
    kept = [t for layer in trace.layers for t in (layer.q, layer.k, layer.lse, layer.norms) if t is not None]
    assert len(kept) == 4 * len(trace.layers)
    kept += [trace.first_overview.values]
    assert len({t.untyped_storage().data_ptr() for t in kept}) == 1
    assert kept[0].untyped_storage().nbytes() == sum(t.numel() * t.element_size() for t in kept)


@pytest.mark.parametrize("n", [1, 100, 1024, 1025, 2048, 4096, 8192, 10**6])
def test_the_forward_row_blocks_shrink_with_n_within_their_bounds(
    monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    monkeypatch.setattr(trace_module, "ROW_BLOCK", 128)
    rows = trace_module.forward_rows(n)
    assert 32 <= rows <= 128 and rows == min(128, max(32, trace_module.FORWARD_SCORES // n))
    assert rows * n <= trace_module.FORWARD_SCORES or rows == 32  # a block's scores stay near the budget
    assert trace_module.forward_rows(n + 1) <= rows  # longer inputs never get larger blocks


def test_bad_requests_name_what_is_wrong(models: dict[str, AttentionModel]) -> None:
    trace: Trace = models["llama"].trace("A short text.")
    with pytest.raises(IndexError, match="layer 3"):
        trace.window(3, 0)
    with pytest.raises(IndexError, match="head 4"):
        trace.row(0, 4, 0)
    with pytest.raises(IndexError, match="query"):
        trace.row(0, 0, trace.n)
    with pytest.raises(ValueError, match="rows 2..1"):
        trace.window(0, 0, rows=(2, 1))
    with pytest.raises(ValueError, match="cols"):
        trace.window(0, 0, cols=(0, trace.n + 1))
    with pytest.raises(ValueError, match="reduce"):
        trace.overview(reduce="sum")  # type: ignore[arg-type]


@pytest.mark.parametrize(("lo", "hi", "cells"), [(0, 10, 3), (5, 12, 7), (0, 8192, 128), (3, 1000, 511)])
def test_edges_cover_the_span_in_nearly_equal_blocks(lo: int, hi: int, cells: int) -> None:
    e = edges(lo, hi, cells)
    sizes = e.diff()
    assert e[0] == lo and e[-1] == hi and len(e) == cells + 1
    assert int(sizes.min()) >= 1 and int(sizes.max()) - int(sizes.min()) <= 1


@pytest.mark.parametrize("family", ["llama", "mistral", "gemma2", "bert"])
def test_blocks_split_across_threads_trace_like_one_thread(
    models: dict[str, AttentionModel], family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With two torch threads each runs every other row block alone (torch set to one thread meanwhile,
    restored after); either way in the caller's inference mode, as the service traces: the same weights as
    one thread's loop, within the bound of weights recomputed from scores that another thread count's GEMMs
    round differently (the layers' projections run on one thread against two)."""
    model = models[family]
    sections = record_calls(monkeypatch, _threads, "one_thread_each")
    alone, split = on_one_then_two_threads(lambda: model.trace(TEXT, overview_size=16))
    assert sections == [2] * model.info.layers
    assert alone.first_overview is not None and split.first_overview is not None
    every = tolerance(alone, range(model.info.layers))
    check(split.first_overview.values, alone.first_overview.values, every)
    for layer in range(model.info.layers):
        for head in (0, model.info.heads - 1):
            check(split.window(layer, head).values, alone.window(layer, head).values, tolerance(alone, layer))
