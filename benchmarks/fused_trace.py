"""Which fused kernel should a trace run? Issue 27's "measure before choosing", in one run.

A trace keeps, per layer, the post-rotary q and k and each query row's log-sum-exp (lse), so a window is
recomputed exactly as exp(q·kᵀ·scale − lse). Today (mha.trace.blocked.trace_forward) each layer's attention is
computed in row blocks by hand; a fused kernel that also returns the lse would make the trace cost about a
blind forward. This script runs a random-weight Llama of SmolLM2-135M's shape (benchmarks/random_llama.py) and
prints, per n, side by side:

  blind      the whole forward, each layer through F.scaled_dot_product_attention(is_causal, enable_gqa):
             no weights, no lse (the reference every trace figure is a ratio of)
  today      mha.trace.blocked.trace_forward with its 128 x 128 max-pooled overview (--today sizes only: slow)
  <kernel>   the whole forward keeping q, k and the lse of every layer, attention through one candidate:
               efficient  aten._scaled_dot_product_efficient_attention(compute_log_sumexp=True) (CUDA)
               flash      aten._scaled_dot_product_flash_attention (CUDA half precision only)
               flashcpu   aten._scaled_dot_product_flash_attention_for_cpu (CPU)
               flex       torch.compile(flex_attention) with return_aux=AuxRequest(lse=True) and a causal
                          block mask (compile time printed apart)
  overview   the 128 x 128 max-pooled overview of every head recomputed afterwards from the kept q, k, lse:
               torch      blocks of rows through matmul, exp and a reshape-max (only the causal columns)
               triton     one fused kernel: a tile's scores, exp(s − lse), tile max, atomic max into its cell
                          (n a multiple of 128·64 so a 64 x 64 tile lies in one cell; else skipped)

Each kernel's lse is checked against a float64 logsumexp of the same scores on sampled rows, and each
overview against an exact one built from float64 weights on a few heads. Figures are medians of --repeats
after a warm-up; CUDA timings are synchronised. JSON of everything goes to --json.

    python benchmarks/fused_trace.py --device cuda --sizes 8192 16384 32768 --today 8192
    python benchmarks/fused_trace.py --device cpu --sizes 512 1024 --layers 2     # rehearsal
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from random_llama import SMOLLM2, hooked_forward, ids_of, llama_checkpoint, load_llama, sdpa  # noqa: E402
from timing import timed  # noqa: E402

from mha.networks.model import Transformer  # noqa: E402

CELLS = 128  # the overview's blocks per side (mha.trace.overview.OVERVIEW_SIZE)
TILE = 64  # the Triton overview's tile per side

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor | None]]


def median_s(call: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median seconds of `repeats` calls after one warm-up."""
    return timed(call, repeats, device=device).median


def first_call(call: Callable[[], object], device: torch.device) -> float:
    """Seconds of one call (a compile included)."""
    return timed(call, 1, warm=0, device=device).median


def expand(k: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, H_kv, n, D) -> (B, H, n, D): query head h reads key head h // (H / H_kv)."""
    return k.repeat_interleave(heads // k.shape[1], dim=1)


def attend_blind(q, k, v, scale):
    return sdpa(q, k, v, scale), None


def attend_efficient(q, k, v, scale):
    heads = q.shape[1]
    out, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(
        q, expand(k, heads), expand(v, heads), None, True, 0.0, True, scale=scale
    )
    return out, lse[..., : q.shape[2]]  # the kernel pads lse's rows to a multiple of 32


def attend_flash(q, k, v, scale):
    heads = q.shape[1]
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention(
        q, expand(k, heads), expand(v, heads), 0.0, True, False, scale=scale
    )[:2]
    return out, lse


def attend_flashcpu(q, k, v, scale):
    heads = q.shape[1]
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, expand(k, heads), expand(v, heads), 0.0, True, scale=scale
    )
    return out, lse


class Flex:
    """Compiled flex_attention with a causal block mask per n, returning the lse."""

    def __init__(self, device: torch.device) -> None:
        from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

        self.device, self.masks = device, {}
        self.create_block_mask, self.aux = create_block_mask, AuxRequest(lse=True)
        self.kernel = torch.compile(flex_attention, dynamic=False)

    def mask(self, n: int):
        if n not in self.masks:
            self.masks[n] = self.create_block_mask(
                lambda b, h, q, kv: q >= kv, None, None, n, n, device=str(self.device)
            )
        return self.masks[n]

    def __call__(self, q, k, v, scale):
        out, aux = self.kernel(
            q, k, v, block_mask=self.mask(q.shape[2]), scale=scale, enable_gqa=True, return_aux=self.aux
        )
        return out, aux.lse


def run_forward(network: Transformer, ids: torch.Tensor, attend: Attend, keep: bool) -> list[tuple]:
    """The whole forward with `attend` in every layer; with keep, each layer's (q, k, lse)."""
    kept: list[tuple] = []

    def through(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        out, lse = attend(q, k, v, scale)  # (1, H, n, D), (1, H, n)
        if keep:
            kept.append((q[0].contiguous(), k[0].contiguous(), lse[0]))
        return out

    hooked_forward(network, ids, through)
    return kept


def reference_lse(q: torch.Tensor, k: torch.Tensor, scale: float, rows: torch.Tensor) -> torch.Tensor:
    """float64 lse [H, len(rows)] of causal scores, query head h over key head h // group."""
    heads = q.shape[0]
    kk = expand(k[None], heads)[0].double()
    s = q[:, rows].double() @ kk.transpose(-1, -2) * scale  # (H, r, n)
    s = s.masked_fill(
        torch.arange(k.shape[1], device=q.device)[None, None, :] > rows[None, :, None], -math.inf
    )
    return torch.logsumexp(s, dim=-1)


def overview_torch(
    q: torch.Tensor, k: torch.Tensor, lse: torch.Tensor, scale: float, block: int
) -> torch.Tensor:
    """[H, C, C] max-pooled weights, n a multiple of CELLS; rows in blocks of `block` (a multiple of the
    cell), each against only the keys up to its last row."""
    heads, n, _ = q.shape
    cell = n // CELLS
    kk = expand(k[None], heads)[0]
    out = q.new_zeros(heads, CELLS, CELLS)
    for start in range(0, n, block):
        stop = min(start + block, n)
        s = torch.matmul(q[:, start:stop], kk[:, :stop].transpose(-1, -2)).mul_(scale)  # (H, r, stop)
        s.sub_(lse[:, start:stop, None])
        rows = torch.arange(start, stop, device=q.device)[:, None]
        s.masked_fill_(torch.arange(stop, device=q.device)[None, :] > rows, -math.inf)
        w = s.exp_()
        r = (stop - start) // cell
        pooled = w.view(heads, r, cell, stop // cell, cell).amax(dim=(2, 4))  # (H, r, stop / cell)
        out[:, start // cell : stop // cell, : stop // cell] = pooled
    return out


def overview_exact(q, k, lse_unused, scale, heads: list[int]) -> torch.Tensor:
    """float64 reference of the pooled overview on `heads`, from softmax itself."""
    n = q.shape[1]
    cell = n // CELLS
    group = q.shape[0] // k.shape[0]
    outs = []
    for h in heads:
        s = q[h].double() @ k[h // group].double().T * scale
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), -math.inf)
        w = torch.softmax(s, dim=-1)
        outs.append(w.view(CELLS, cell, CELLS, cell).amax(dim=(1, 3)))
    return torch.stack(outs)


def triton_overview():
    """A fused Triton kernel for the max-pooled overview, or None where Triton is missing."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def kernel(
        q_ptr, k_ptr, lse_ptr, out_ptr, n, scale, group,
        D: tl.constexpr, TILE: tl.constexpr, CELLS: tl.constexpr, PRECISION: tl.constexpr,
    ):  # fmt: skip
        h = tl.program_id(0)
        row_tile = tl.program_id(1)
        rows = row_tile * TILE + tl.arange(0, TILE)
        dims = tl.arange(0, D)
        q = tl.load(q_ptr + h * n * D + rows[:, None] * D + dims[None, :])
        lse = tl.load(lse_ptr + h * n + rows)
        cell = n // CELLS
        row_cell = (row_tile * TILE) // cell
        kv = h // group
        # Causal: key tiles up to and including the diagonal one.
        for col_tile in range(0, row_tile + 1):
            cols = col_tile * TILE + tl.arange(0, TILE)
            k = tl.load(k_ptr + kv * n * D + cols[:, None] * D + dims[None, :])
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale - lse[:, None]
            w = tl.where(cols[None, :] <= rows[:, None], tl.exp(s), 0.0)
            top = tl.max(tl.max(w, axis=1), axis=0)
            # Weights are >= 0, so their float bits order as int32s do: an integer atomic max.
            target = out_ptr + (h * CELLS + row_cell) * CELLS + (col_tile * TILE) // cell
            tl.atomic_max(target.to(tl.pointer_type(tl.int32)), top.to(tl.int32, bitcast=True))

    def run(
        q: torch.Tensor, k: torch.Tensor, lse: torch.Tensor, scale: float, precision: str
    ) -> torch.Tensor:
        heads, n, dim = q.shape
        if n % (CELLS * TILE):
            raise ValueError(f"n ({n}) is not a multiple of {CELLS * TILE}")
        out = torch.zeros(heads, CELLS, CELLS, device=q.device, dtype=torch.float32)
        kernel[(heads, n // TILE)](
            q, k, lse.float().contiguous(), out, n, scale, heads // k.shape[0],
            D=dim, TILE=TILE, CELLS=CELLS, PRECISION=precision,
        )  # fmt: skip
        return out

    return run


class Probe:
    """The run's sections, each timed, guarded and under the whole run's budget; results and table rows."""

    def __init__(self, args: argparse.Namespace, device: torch.device) -> None:
        self.args, self.device = args, device
        self.began = time.perf_counter()
        self.results: dict[str, Any] = {"torch": torch.__version__}
        self.results["device"] = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        self.rows: list[tuple[str, str, float | None, float | None]] = []

    def section(self, name: str, call: Callable[[], Any]) -> Any:
        left = self.args.budget - (time.perf_counter() - self.began)
        if left < 20:
            print(f"[skip] {name}: {left:.0f} s of the budget left", flush=True)
            return None
        start = time.perf_counter()
        try:
            value = call()
        except Exception as error:  # one failing candidate must not cost the others
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            print(f"[fail] {name}: {type(error).__name__}: {first}", flush=True)
            self.results[name] = f"failed: {type(error).__name__}: {first}"
            return None
        print(f"[done] {name} in {time.perf_counter() - start:.1f} s: {value}", flush=True)
        self.results[name] = value
        return value

    def timed(self, call: Callable[[], object]) -> float:
        return median_s(call, self.device, self.args.repeats)

    def size(self, network: Transformer, n: int, kernels: dict[str, Attend], tag: str) -> None:
        """Blind, today (where asked) and every kernel at n; the overviews in float32."""
        device = self.device
        ids = ids_of(n).to(device)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        blind = self.section(
            f"blind {tag}", lambda: self.timed(lambda: run_forward(network, ids, attend_blind, False))
        )
        float32 = next(network.parameters()).dtype == torch.float32
        if float32 and n in self.args.today:
            from mha.trace.blocked import trace_forward

            today = self.section(
                f"today {tag}", lambda: median_s(lambda: trace_forward(network, ids), device, 1)
            )
            self.rows.append((tag, "today (trace_forward)", today, blind))
        for name, attend in kernels.items():
            if name == "flex":
                self.section(
                    f"flex compile {tag}",
                    lambda attend=attend: first_call(lambda: run_forward(network, ids, attend, True), device),
                )
            got = self.section(f"{name} {tag}", lambda attend=attend: self.kernel(network, ids, attend))
            self.rows.append((tag, name, got and got["s"], blind))
        if float32:
            # Overviews from one layer's kept q, k, lse (the efficient/flashcpu kernel's), times the layers.
            kept = run_forward(network, ids, kernels.get("efficient") or kernels["flashcpu"], True)
            q, k, lse = kept[len(kept) // 2]
            self.overviews(q, k, lse, network.layers[0].attn.scale, len(kept), tag, blind)

    def kernel(self, network: Transformer, ids: torch.Tensor, attend: Attend) -> dict[str, Any]:
        """Seconds of the kept forward through `attend`, its lse's error on sampled rows, its peak added."""
        device, n = self.device, ids.shape[1]
        base = 0
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        seconds = self.timed(lambda: run_forward(network, ids, attend, True))
        kept = run_forward(network, ids, attend, True)
        q, k, lse = kept[len(kept) // 2]
        sample = torch.linspace(0, n - 1, 16, device=device).long()
        ref = reference_lse(q.float(), k.float(), network.layers[0].attn.scale, sample)
        value: dict[str, Any] = {"s": seconds, "lse_err": (lse[:, sample].double() - ref).abs().max().item()}
        if device.type == "cuda":
            value["peak_added_MiB"] = (torch.cuda.max_memory_allocated(device) - base) / 2**20
        return value

    def overviews(self, q, k, lse, scale: float, layers: int, tag: str, blind: float | None) -> None:
        n = q.shape[1]
        exact = overview_exact(q, k, lse, scale, [0, q.shape[0] - 1]) if n <= 16384 else None

        def figure(make: Callable[[], torch.Tensor]) -> dict[str, Any]:
            view = make()
            err = None if exact is None else (view[[0, -1]].double() - exact).abs().max().item()
            return {"s_all_layers": layers * self.timed(make), "err": err}

        for block in (n // CELLS * 4, n // CELLS * 16):
            got = self.section(
                f"overview torch block={block} {tag}",
                lambda block=block: figure(lambda: overview_torch(q, k, lse, scale, block)),
            )
            self.rows.append((tag, f"overview torch rows={block}", got and got["s_all_layers"], blind))
        triton_run = triton_overview() if self.device.type == "cuda" else None
        if triton_run is None or n % (CELLS * TILE):
            return
        for precision in ("ieee", "tf32x3", "tf32"):
            got = self.section(
                f"overview triton {precision} {tag}",
                lambda precision=precision: figure(lambda: triton_run(q, k, lse, scale, precision)),
            )
            self.rows.append((tag, f"overview triton {precision}", got and got["s_all_layers"], blind))

    def table(self) -> None:
        print("\n| input | path | seconds | blind s | ratio |")
        print("|---|---|---|---|---|")
        for tag, name, seconds, blind in self.rows:
            if seconds is None or blind is None:
                print(f"| {tag} | {name} | - | {'-' if blind is None else f'{blind:.3f}'} | - |")
            else:
                print(f"| {tag} | {name} | {seconds:.3f} | {blind:.3f} | {seconds / blind:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--sizes", type=int, nargs="+", default=[8192, 16384, 32768])
    parser.add_argument("--today", type=int, nargs="*", default=[8192], help="sizes to run trace_forward at")
    parser.add_argument("--layers", type=int, default=None, help="fewer layers than SmolLM2's 30")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--budget", type=float, default=420.0, help="seconds; later sections are skipped")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32 (the trace's windows are exact)
    probe = Probe(args, device)
    SMOLLM2["max_position_embeddings"] = max(max(args.sizes), 8192)
    if args.layers:
        SMOLLM2["num_hidden_layers"] = args.layers
    with tempfile.TemporaryDirectory() as directory:
        llama_checkpoint(directory)
        network32, _ = load_llama("ours", directory)
    network32 = network32.to(device).eval()
    flex = probe.section("flex_init", lambda: Flex(device))
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        if device.type == "cpu" and dtype != torch.float32:
            continue  # the CPU's half-precision kernels are no question of this probe
        network = network32 if dtype == torch.float32 else network32.to(dtype)
        kernels: dict[str, Attend] = {}
        if device.type == "cuda":
            kernels["efficient"] = attend_efficient
            if dtype != torch.float32:
                kernels["flash"] = attend_flash  # half precision only
        else:
            kernels["flashcpu"] = attend_flashcpu
        if flex is not None:
            kernels["flex"] = flex
        for n in args.sizes:
            probe.size(network, n, kernels, f"{dtype_name} n={n}")
    probe.table()
    if args.json:
        Path(args.json).write_text(json.dumps(probe.results, indent=1, default=str))


if __name__ == "__main__":
    main()
