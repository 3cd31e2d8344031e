"""Long prompts: a trace (mha.trace) against the same network run blind, and transformers' eager attention.

A random-weight Llama with SmolLM2-135M's shape (benchmarks/extract.py's llama mode: 30 layers, 9 query
heads over 3 KV heads, hidden 576) on the CPU, at n = 1024, 2048, 4096, 8192 random token ids, side by side
in one run:
  trace  = trace_forward(network, ids): every layer's q, k and log-sum-exp, and the default 128 x 128
           max-pooled overview of every head, pooled as the weights pass
  blind  = the same network's whole forward, each layer's attention through torch's fused
           F.scaled_dot_product_attention(is_causal=True, enable_gqa=True): no weights anywhere. (Our
           MultiHeadAttention's need_weights=False path takes SDPA only when query and key heads are equal;
           grouped heads go through explicit weights, so the baseline calls SDPA itself, via Block's
           `attention` hook.)
  ratio  = trace / blind, medians of interleaved repeats; goal <= 1.25
  MiB    = peak resident memory one trace adds (fresh subprocess per n, measured as extract.py measures:
           VmHWM reset after the warm-up, glibc's mmap threshold fixed); goal <= 1.5 GB at n = 8192
  eager  = the same for LlamaModel(attn_implementation="eager", output_attentions=True), skipped with the
           memory it would need when its [L, H, n, n] weights alone exceed the memory the machine has free
  window = trace.window(layer, head, 512 x 512 rows x cols) and trace.row(layer, head, q) at the largest
           n, medians over layers, heads and positions; goals <= 150 ms and <= 20 ms

    .venv/bin/python benchmarks/long.py [--sizes 1024 2048 4096 8192] [--repeats 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from typing import cast

import torch
import torch.nn.functional as F
from extract import SMOLLM2, child_peak_mib, llama_checkpoint, load_llama, print_peak_added

from mha.layers import Block
from mha.model import Transformer
from mha.trace import Trace, trace_forward

SIZES = (1024, 2048, 4096, 8192)
GiB = 1 << 30


def ids_of(n: int) -> torch.Tensor:
    vocab = cast(int, SMOLLM2["vocab_size"])
    return torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(n))


def blind_forward(network: Transformer, ids: torch.Tensor) -> torch.Tensor:
    """The whole forward with torch's fused causal attention in every layer: the model run without weights."""
    position_ids = network.position_ids(ids)
    with torch.no_grad():
        x = network.embeddings(ids, position_ids, None)
        rotary = network.rotary(position_ids, x.dtype)
        for layer in cast("list[Block]", network.layers):
            attn = layer.attn

            def sdpa(h: torch.Tensor, attn=attn) -> torch.Tensor:
                q, k, v = attn.heads(h, h, h, True, rotary)  # (1, H, n, D), (1, H_kv, n, D) x 2
                out = F.scaled_dot_product_attention(
                    q, k, v, is_causal=True, scale=attn.scale, enable_gqa=True
                )  # (1, H, n, D)
                return attn.out_proj(out.transpose(1, 2).reshape(h.shape[0], h.shape[1], -1))

            x = layer(x, None, rotary=rotary, need_weights=False, weights_out=None, attention=sdpa)[0]
        return x if network.final_norm is None else network.final_norm(x)


def load_network(directory: str) -> Transformer:
    network, _ = load_llama("ours", directory)
    return network


def run_of(which: str, directory: str):
    if which == "eager":
        return load_llama("theirs", directory)[1]
    network = load_network(directory)
    return lambda ids: trace_forward(network, ids)


def memory_child(which: str, n: int, directory: str) -> None:
    run = run_of(which, directory)
    ids = ids_of(n)
    run(ids[:, :64])  # warm: lazy inits, thread pool (a short input, so the measured call's pages are new)
    print_peak_added(lambda: run(ids))


def measure_memory(which: str, n: int, threads: int, directory: str) -> float:
    """MiB one call adds to a fresh process's peak RSS."""
    return child_peak_mib([__file__, "--child", which, str(n), "--threads", str(threads), "--dir", directory])


def available_bytes() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("MemAvailable not in /proc/meminfo")


def eager_memory(n: int, threads: int, directory: str) -> str:
    # output_attentions keeps every layer's [H, n, n] float32 weights; the scores before softmax are one more.
    layers, heads = cast(int, SMOLLM2["num_hidden_layers"]), cast(int, SMOLLM2["num_attention_heads"])
    need = (layers + 1) * heads * n * n * 4
    free = available_bytes()
    if need > 0.8 * free:
        return f"would need {need / GiB:.1f} GiB ({free / GiB:.1f} free)"
    return f"{measure_memory('eager', n, threads, directory):.1f}"


def median_ms(call, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def windows_and_rows(network: Transformer, n: int, repeats: int) -> tuple[float, float, float]:
    """(trace ms, median window ms, median row ms) at n: 512 x 512 windows and rows at spread positions."""
    ids = ids_of(n)
    start = time.perf_counter()
    layers, overview = trace_forward(network, ids)
    traced = (time.perf_counter() - start) * 1000
    attn = cast(Block, network.layers[0]).attn
    # No tokens or model info: windows and rows read only the layers, the scale and the mask.
    trace = Trace(None, [""] * n, None, layers, attn.scale, attn.softcap, True, overview)  # type: ignore[arg-type]
    gen = torch.Generator().manual_seed(0)
    spots = [
        (int(torch.randint(len(layers), (1,), generator=gen)), int(torch.randint(9, (1,), generator=gen)))
        for _ in range(repeats * 3)
    ]
    window, row = [], []
    for i, (layer, head) in enumerate(spots):
        # The bottom-right window sees every key before it: the costliest one on a causal model.
        q0 = n - 512 if i % 2 == 0 else (i * 997) % (n - 512)
        k0 = max(0, q0 - (i * 131) % n)
        window.append(median_ms(partial(trace.window, layer, head, (q0, q0 + 512), (k0, k0 + 512)), 1))
        row.append(median_ms(partial(trace.row, layer, head, n - 1 - i), 1))
    return traced, statistics.median(window), statistics.median(row)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-eager", action="store_true", help="skip transformers' eager memory")
    parser.add_argument("--no-memory", action="store_true", help="skip both memory figures")
    parser.add_argument("--dir", help=argparse.SUPPRESS)  # the checkpoint, for a memory child
    parser.add_argument("--child", nargs=2, metavar=("WHICH", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.child:
        memory_child(args.child[0], int(args.child[1]), args.dir)
        return
    with tempfile.TemporaryDirectory() as directory:
        llama_checkpoint(directory)
        network = load_network(directory)
        print(
            f"SmolLM2-135M-shaped Llama (random weights), torch {torch.__version__},"
            f" {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, load average"
            f" {os.getloadavg()[0]:.2f}; median of {args.repeats} interleaved repeats"
        )
        print(f"{'n':>5} {'trace ms':>9} {'blind ms':>9} {'ratio':>6} {'trace MiB':>10} {'eager MiB':>28}")
        for n in sorted(args.sizes):
            ids = ids_of(n)
            runs: dict[str, Callable[[], object]] = {"trace": partial(trace_forward, network, ids)}
            runs["blind"] = partial(blind_forward, network, ids)
            for run in runs.values():  # warm-up
                run()
            times: dict[str, list[float]] = {name: [] for name in runs}
            for _ in range(args.repeats):
                for name, run in runs.items():
                    start = time.perf_counter()
                    result = run()
                    times[name].append(time.perf_counter() - start)
                    del result
            t_trace, t_blind = (statistics.median(times[k]) * 1000 for k in runs)
            m_trace = float("nan") if args.no_memory else measure_memory("trace", n, args.threads, directory)
            m_eager = "-" if args.no_memory or args.no_eager else eager_memory(n, args.threads, directory)
            print(
                f"{n:>5} {t_trace:>9.0f} {t_blind:>9.0f} {t_trace / t_blind:>6.2f} {m_trace:>10.1f}"
                f" {m_eager:>28}",
                flush=True,
            )
            gc.collect()
        n = max(args.sizes)
        traced, window, row = windows_and_rows(network, n, max(args.repeats, 3))
        print(f"at n = {n} (trace {traced:.0f} ms): 512 x 512 window {window:.1f} ms, row {row:.2f} ms")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
