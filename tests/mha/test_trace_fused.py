"""A trace's fused path (mha.trace.fused): which layers take it, that its kernel really ran, its lse against
float64, and its overview (pooled afterwards from q, k and lse) against pooling attend's matrices.

On the CPU a trace takes the fused kernels when it pools no overview in its forward (mha.trace.blocked
FUSED_CPU_OVERVIEW), so these tests trace with overview_size=None, or force fused=True to test the
overview pooled from the kept q, k and lse. Windows and rows of every family against attend are
tests/mha/test_trace.py's (where the default overview keeps the CPU on the blocked path).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from checkpoints import FAMILIES
from spies import record_calls
from tolerances import fused_lse, recomputed_weight
from torch.utils._python_dispatch import TorchDispatchMode
from trace_threads import on_one_then_two_threads

from mha import AttentionModel, _threads, load_pretrained
from mha.trace import blocked as trace_module
from mha.trace import windows
from mha.trace.blocked import BLOCKED, LayerTrace, trace_forward
from mha.trace.fused import cell_tokens, fused_attention, fused_kernel, scores_fit
from mha.trace.overview import edges
from mha.trace.windows import Trace

# ~60-85 tokens for every tokenizer here: longer than the sliding window (6) and than several row blocks.
TEXT = (
    "The animal didn't cross the street because it was too tired. Attention heads look at tokens; some "
    "look at the previous token, some at punctuation, and some at the first token of all."
)
ROW_BLOCK = 8
FLASH = "fused-flash-cpu"
# What a CPU trace of TEXT runs, by family: the fused kernel unless a layer soft-caps its logits (Gemma 2)
# or attends in a sliding window shorter than TEXT (Mistral: every layer; Qwen2 here: layers 1 and 2;
# Gemma 3 here: its local layers 0 and 2 around a global one).
PATHS = dict.fromkeys(FAMILIES, FLASH) | {
    "mistral": BLOCKED,
    "gemma2": BLOCKED,
    "qwen2": f"{FLASH}+{BLOCKED}",
    "gemma3": f"{BLOCKED}+{FLASH}",
}


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace_module, "ROW_BLOCK", ROW_BLOCK)  # the forward's row blocks
    monkeypatch.setattr(windows, "ROW_BLOCK", ROW_BLOCK)  # a window's, a row's, an overview's


class _Calls(TorchDispatchMode):
    """How many times each operator ran while active."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = func.overloadpacket.__name__
        self.calls[name] = self.calls.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def trace_of(model: AttentionModel, text: str, **options: Any) -> Trace:
    """model.trace(text) with Trace.of's options (fused=...), and max_tokens from `options`."""
    limit = options.pop("max_tokens", model.info.max_tokens)
    encoded = model.encoder.encode_batch([(text, None)], limit)[0]
    tokens = model.tokenizer.convert_ids_to_tokens(encoded.ids)
    return Trace.of(model.network, encoded, tokens, model.info, **options)


def max_score(layer: LayerTrace, scale: float) -> float:
    """The largest |score| the layer's q and k can make: scale·|q|·|k| (Cauchy-Schwarz)."""
    return float(layer.q.norm(dim=-1).amax() * layer.k.norm(dim=-1).amax()) * scale


def tolerance(trace: Trace, layers: range) -> float:
    """exp(s - lse) against attend's softmax (tests/mha/test_trace.py's bound, tests/tolerances.py)."""
    kept = [trace.layers[i] for i in layers]
    return recomputed_weight(kept[0].q.shape[-1], max(max_score(k, trace.scale) for k in kept))


def pool_max(matrix: torch.Tensor, cuts: list[int]) -> torch.Tensor:
    """[..., s, s] max-pooled from [..., n, n] by the block edges, one block at a time."""
    out = torch.zeros(*matrix.shape[:-2], len(cuts) - 1, len(cuts) - 1)
    for r in range(len(cuts) - 1):
        for c in range(len(cuts) - 1):
            out[..., r, c] = matrix[..., cuts[r] : cuts[r + 1], cuts[c] : cuts[c + 1]].amax(dim=(-2, -1))
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_the_fused_kernel_runs_where_it_computes_the_layer_exactly(
    models: dict[str, AttentionModel], family: str
) -> None:
    model = models[family]
    with _Calls() as seen:
        trace = model.trace(TEXT, overview_size=None)
    assert trace.path == PATHS[family]
    # With an overview pooled in the forward, the CPU keeps the blocked path, unless fused is asked for.
    assert model.trace(TEXT).path == BLOCKED
    assert trace_of(model, TEXT, fused=True).path == PATHS[family]
    cfg = model.config
    hides = cfg.sliding_window is not None and cfg.sliding_window < trace.n  # a window shorter than TEXT
    fused = [
        i
        for i in range(model.info.layers)
        if cfg.attention_softcap is None and not (i in cfg.window_layers and hides)
    ]
    assert [layer.path for layer in trace.layers] == [
        FLASH if i in fused else BLOCKED for i in range(model.info.layers)
    ]
    # The kernel really ran, once for each fused layer, and nothing else computed attention there.
    assert seen.calls.get("_scaled_dot_product_flash_attention_for_cpu", 0) == len(fused)


def test_a_window_the_input_fits_in_takes_the_fused_kernel(models: dict[str, AttentionModel]) -> None:
    """Mistral's window (6) hides keys from TEXT's rows but from none of "Hi."'s: there it runs fused (and
    equals attend), while Gemma 2's soft-cap keeps it blocked at any length."""
    assert models["gemma2"].trace("Hi.", overview_size=None).path == BLOCKED
    want = models["mistral"].attend("Hi.", hidden_state=False)
    trace = models["mistral"].trace("Hi.", overview_size=None)
    assert trace.path == FLASH
    assert trace.n <= models["mistral"].config.sliding_window  # type: ignore[operator]
    for layer in range(models["mistral"].info.layers):
        got = torch.stack([trace.window(layer, h).values for h in range(models["mistral"].info.heads)])
        assert (got - want.attentions[layer]).abs().max() <= tolerance(trace, range(layer, layer + 1))


@pytest.mark.parametrize("family", ["llama", "gpt2", "bert"])
def test_the_fused_lse_equals_a_float64_logsumexp(models: dict[str, AttentionModel], family: str) -> None:
    """The kernel's lse against torch.logsumexp in float64 of the scores of the very q and k it read (kept,
    float32): only its own arithmetic differs (tests/tolerances.py fused_lse)."""
    model = models[family]
    trace = model.trace(TEXT, overview_size=None)
    assert trace.path == FLASH
    n = trace.n
    for layer in trace.layers:
        group = layer.q.shape[0] // layer.k.shape[0]
        k = layer.k.double().repeat_interleave(group, dim=0)  # query head h reads key head h // G
        scores = layer.q.double() @ k.transpose(1, 2) * trace.scale  # [H, n, n]
        if trace.causal:
            scores.masked_fill_(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
        want = torch.logsumexp(scores, dim=-1)
        bound = fused_lse(n, layer.q.shape[-1], max_score(layer, trace.scale))
        assert (layer.lse.double() - want).abs().max().item() <= bound


@pytest.mark.parametrize("family", ["llama", "gpt2", "bert", "qwen2"])
def test_the_fused_overview_equals_pooling_attend(models: dict[str, AttentionModel], family: str) -> None:
    """The overview pooled from q, k and lse after each fused layer, at sizes whose cells are uneven (a
    cell's last token repeated), even, and one token each, equals max-pooling attend's matrices (Qwen2:
    beside its blocked layers' overview)."""
    model = models[family]
    n = model.trace(TEXT, overview_size=None).n
    n -= n % 8  # TEXT cut to a multiple of 8 tokens, so n // 4 cells are 4 tokens each
    full = model.attend(TEXT, max_tokens=n, hidden_state=False).attentions
    assert full.shape[-1] == n
    for size in (7, 16, n // 4, n):
        trace = trace_of(model, TEXT, max_tokens=n, overview_size=size, fused=True)
        assert trace.first_overview is not None
        cuts = trace.first_overview.row_edges
        assert cuts == edges(0, n, size).tolist()
        assert (cell_tokens(cuts) is None) == (n % size == 0)
        want = pool_max(full, cuts)
        error = (trace.first_overview.values - want).abs().max().item()
        assert error <= tolerance(trace, range(model.info.layers))


def test_the_fused_and_blocked_paths_keep_the_same_trace(models: dict[str, AttentionModel]) -> None:
    """trace_forward(fused=False) runs every layer in row blocks: the same lse and overview, within the
    bound of weights recomputed in another kernel."""
    model = models["llama"]
    ids = torch.tensor([model.encoder.encode_batch([(TEXT, None)], model.info.max_tokens)[0].ids])
    fused, fused_overview = trace_forward(model.network, ids, overview_size=16, fused=True)
    blocked, blocked_overview = trace_forward(model.network, ids, overview_size=16, fused=False)
    assert {layer.path for layer in fused} == {FLASH} and {layer.path for layer in blocked} == {BLOCKED}
    assert fused_overview is not None and blocked_overview is not None
    scale = model.network.layers[0].attn.scale
    trace = Trace(None, [""] * ids.shape[1], None, fused, scale, None, True)  # type: ignore[arg-type]
    bound = tolerance(trace, range(model.info.layers))
    assert (fused_overview.values - blocked_overview.values).abs().max().item() <= bound
    for i, (a, b) in enumerate(zip(fused, blocked, strict=True)):
        # Layer 0 reads the same embeddings; later ones the previous layer's output, another kernel's.
        close = torch.equal if i == 0 else lambda x, y: (x - y).abs().max().item() <= bound
        assert close(a.q, b.q) and close(a.k, b.k)
        # Each lse is within fused_lse of the exact one (the blocked one is softmax's arithmetic, within it
        # too), and the scores of later layers differ by the forward's bound, which moves lse as much.
        lse_bound = 2 * fused_lse(ids.shape[1], a.q.shape[-1], max_score(a, scale)) + (i > 0) * bound
        assert (a.lse - b.lse).abs().max().item() <= lse_bound


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_the_fused_overview_split_across_threads_equals_one_thread(
    models: dict[str, AttentionModel], family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With two torch threads each pools every other row block of cells alone (one section a layer); each
    block writes only its own cells, so the overview equals one thread's within the bound of scores another
    thread count's projections round differently."""
    model = models[family]
    sections = record_calls(monkeypatch, _threads, "one_thread_each")
    alone, split = on_one_then_two_threads(lambda: trace_of(model, TEXT, overview_size=16, fused=True))
    assert alone.path == split.path == FLASH and sections == [2] * model.info.layers
    assert alone.first_overview is not None and split.first_overview is not None
    error = (split.first_overview.values - alone.first_overview.values).abs().max().item()
    assert error <= tolerance(alone, range(model.info.layers))


@pytest.mark.parametrize(
    ("device", "dtype", "head_dim", "softcap", "window", "biased", "want"),
    [
        ("cpu", torch.float32, 64, None, None, False, "fused-flash-cpu"),
        ("cpu", torch.bfloat16, 64, None, 100, False, "fused-flash-cpu"),  # the window hides nothing
        ("cpu", torch.float32, 64, None, 99, False, None),  # it hides key 0 from query 99
        ("cpu", torch.float32, 64, 50.0, None, False, None),
        ("cpu", torch.float32, 64, None, None, True, None),
        ("cuda", torch.float32, 64, None, None, False, "fused-efficient-cuda"),
        ("cuda", torch.bfloat16, 64, None, None, False, "fused-flash-cuda"),
        ("cuda", torch.float16, 72, None, None, False, "fused-flash-cuda"),
        ("cuda", torch.float16, 60, None, None, False, "fused-efficient-cuda"),  # flash: multiples of 8
        ("cuda", torch.bfloat16, 320, None, None, False, "fused-efficient-cuda"),  # flash: up to 256
        ("cuda", torch.float64, 64, None, None, False, None),
        ("meta", torch.float32, 64, None, None, False, None),
    ],
)
def test_which_kernel_a_layer_takes(
    device: str,
    dtype: torch.dtype,
    head_dim: int,
    softcap: float | None,
    window: int | None,
    biased: bool,
    want: str | None,
) -> None:
    got = fused_kernel(
        device=torch.device(device),
        dtype=dtype,
        head_dim=head_dim,
        softcap=softcap,
        window=window,
        n=100,
        biased=biased,
    )
    assert got == want


def test_a_layer_whose_scores_could_overflow_runs_blocked() -> None:
    """Scores that could pass float32's largest (D·max|q|·max|k|·scale past it) are left to the blocked path,
    whose lse shows the overflow; a kernel's need not (the CPU kernel's lse was 0 on an AVX-512 machine).
    Values that bound every score inside float32 keep the kernel, however large each score is."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 12, 16, generator=gen) for _ in range(3))
    scale = 16**-0.5
    assert fused_attention(FLASH, q, k, v, causal=True, scale=scale) is not None
    big = 1e30  # each score ~1e60: past float32's ~3.4e38, though each q and k element is finite
    assert torch.isfinite(q * big).all()
    assert not scores_fit(q * big, k * big, scale)
    assert fused_attention(FLASH, q * big, k * big, v, causal=True, scale=scale) is None
    # D·max|q|·max|k|·scale < 16·(5e17)²/4 = 1e36: every score is bounded inside float32 (max|randn| of 768
    # draws is below 5 with probability 1 - 4e-4, and the seed is fixed), so the kernel computes the layer.
    assert scores_fit(q * 1e17, k * 1e17, scale)
    assert fused_attention(FLASH, q * 1e17, k * 1e17, v, causal=True, scale=scale) is not None
    assert not scores_fit(q.clone().fill_(float("nan")), k, scale)
    # Half precision: a row of 16 values of 3e4 has a norm past float16's 65,504, but scores of 3.6e9.
    wide = torch.full((1, 1, 4, 16), 3e4, dtype=torch.float16)
    assert not torch.isfinite(wide.norm(dim=-1)).all()  # the premise
    assert scores_fit(wide, wide, scale)


def test_uneven_cells_repeat_their_last_token() -> None:
    cuts = edges(0, 10, 4).tolist()  # [0, 2, 5, 7, 10]
    assert cell_tokens(cuts).tolist() == [[0, 1, 1], [2, 3, 4], [5, 6, 6], [7, 8, 9]]  # type: ignore[union-attr]
    assert cell_tokens(edges(0, 12, 4).tolist()) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("family", ["llama", "gpt2", "bert"])
def test_a_cuda_trace_runs_fused_and_equals_the_cpu_trace(
    tiny_checkpoints: dict[str, Path], models: dict[str, AttentionModel], family: str
) -> None:
    """On a GPU in float32 the memory-efficient kernel runs (TF32 off, as torch's default): its windows
    and overview equal the CPU trace's within the bound of weights recomputed in another kernel."""
    cuda = load_pretrained(tiny_checkpoints[family], device="cuda")
    trace = cuda.trace(TEXT, overview_size=16)
    cpu = trace_of(models[family], TEXT, overview_size=16, fused=True)
    assert trace.path == "fused-efficient-cuda"
    bound = tolerance(cpu, range(cuda.info.layers))
    assert trace.first_overview is not None and cpu.first_overview is not None
    assert (trace.first_overview.values.cpu() - cpu.first_overview.values).abs().max().item() <= bound
    for layer in range(cuda.info.layers):
        got = trace.window(layer, 1).values.cpu()
        assert (got - cpu.window(layer, 1).values).abs().max().item() <= bound
