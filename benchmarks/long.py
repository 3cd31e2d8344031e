"""Long prompts: a trace (mha.trace) against the same network run blind, and transformers' eager
attention.

A random-weight Llama with SmolLM2-135M's shape (benchmarks/extract.py's llama mode: 30 layers, 9 query
heads over 3 KV heads, hidden 576) on the CPU, at n = 1024, 2048, 4096, 8192 random token ids, side by side
in one run:
  trace  = trace_forward(network, ids): every layer's q, k and log-sum-exp, and the default 128 x 128
           max-pooled overview of every head, by the path trace_forward chooses (printed: on the CPU the
           row blocks, which pool the overview as the weights pass; mha.trace.blocked FUSED_CPU_OVERVIEW)
  blind  = the same network's whole forward, each layer's attention through torch's fused
           F.scaled_dot_product_attention(is_causal=True, enable_gqa=True): no weights anywhere. (Our
           MultiHeadAttention's need_weights=False path takes SDPA only when query and key heads are equal;
           grouped heads go through explicit weights, so the baseline calls SDPA itself, via Block's
           `attention` hook.)
  ratio  = trace / blind, medians of interleaved repeats; goal <= 1.2 (issue 27)
  --compare adds, interleaved with those: trace_forward(fused=True), each layer through torch's fused
           kernel with its lse and the overview pooled afterwards from q, k and lse (mha.trace.fused), and
           the same without an overview (what the CPU runs for a trace without one): their difference is
           what the overview pooled afterwards costs
  MiB    = peak resident memory one trace adds (fresh subprocess per n, measured as extract.py measures:
           VmHWM reset after the warm-up, glibc's mmap threshold fixed); goal <= 1 GB at n = 8192
  eager  = the same for LlamaModel(attn_implementation="eager", output_attentions=True), skipped with the
           memory it would need when its [L, H, n, n] weights alone exceed the memory the machine has free
  window = trace.window(layer, head, 512 x 512 rows x cols) and trace.row(layer, head, q) at the largest
           n, medians over layers, heads and positions; goals <= 150 ms and <= 20 ms
  wire   = bytes on the wire at n = 2048 and 8192 (--wire), the app called in-process through its ASGI
           interface as a browser would call it (Accept-Encoding: gzip): the /api/trace stream (progress
           lines and the tokens), the 128 x 128 overview of every head (HSA1, gzipped; row-max-uint8, the
           route's default, and abs-uint8-key-major, the page's COMPACT_SCHEME), and one 512 x 512
           /api/trace/window (JSON, 6 decimals). The checkpoint gets a word-level tokenizer (one token a
           word, its vocabulary padded to the model's rows as checkpoints pad theirs).

    .venv/bin/python benchmarks/long.py [--sizes 1024 2048 4096 8192] [--repeats 3] [--threads 2]
        [--wire 2048 8192] [--no-eager] [--no-memory] [--compare]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import cast

import torch
from random_llama import SMOLLM2, blind_forward, ids_of, llama_checkpoint, load_llama, load_network
from resident import available_bytes, child_peak_mib, print_peak_added
from texts import WORDS
from timing import interleaved, timed

from mha.core.layers import Block
from mha.networks.model import Transformer
from mha.networks.result import ModelInfo
from mha.trace.blocked import trace_forward
from mha.trace.windows import Trace

SIZES = (1024, 2048, 4096, 8192)
WIRE_SIZES = (2048, 8192)
# The scheme app/static/js/api.js asks /api/attention/compact for (COMPACT_SCHEME).
PAGE_SCHEME = "abs-uint8-key-major"
GiB = 1 << 30


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


def eager_memory(n: int, threads: int, directory: str) -> str:
    # output_attentions keeps every layer's [H, n, n] float32 weights; the scores before softmax are one more.
    layers, heads = cast(int, SMOLLM2["num_hidden_layers"]), cast(int, SMOLLM2["num_attention_heads"])
    need = (layers + 1) * heads * n * n * 4
    free = available_bytes()
    if need > 0.8 * free:
        return f"would need {need / GiB:.1f} GiB ({free / GiB:.1f} free)"
    return f"{measure_memory('eager', n, threads, directory):.1f}"


def windows_and_rows(network: Transformer, n: int, repeats: int) -> tuple[float, float, float]:
    """(trace ms, median window ms, median row ms) at n: 512 x 512 windows and rows at spread positions."""
    ids = ids_of(n)
    start = time.perf_counter()
    layers, overview = trace_forward(network, ids)
    traced = (time.perf_counter() - start) * 1000
    attn = cast(Block, network.layers[0]).attn
    # No tokens: windows and rows read the layers, the scale and the mask, and the model's name only to
    # refuse a non-finite value.
    cfg = network.config
    info = ModelInfo(
        "random Llama",
        "llama",
        cfg.num_layers,
        cfg.num_heads,
        cfg.num_kv_heads or cfg.num_heads,
        cfg.max_tokens,
        causal=True,
        pretrained=False,
        device="cpu",
        dtype="float32",
    )
    trace = Trace(None, [""] * n, info, layers, attn.scale, attn.softcap, True, overview)  # type: ignore[arg-type]
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
        window.append(timed(partial(trace.window, layer, head, (q0, q0 + 512), (k0, k0 + 512)), 1, warm=0))
        row.append(timed(partial(trace.row, layer, head, n - 1 - i), 1, warm=0))
    return traced, statistics.median(t.median_ms for t in window), statistics.median(t.median_ms for t in row)


def word_tokenizer(directory: str, vocab_size: int) -> None:
    """A word-level fast tokenizer saved into the checkpoint: <s> first, then WORDS, then unused entries up
    to the model's rows (the service refuses a tokenizer under half of them, as a stand-in)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = ["<s>", "<unk>", *dict.fromkeys(WORDS)]
    vocab = {
        word: i for i, word in enumerate(words + [f"<unused{i}>" for i in range(vocab_size - len(words))])
    }
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", unk_token="<unk>")
    wrapped.model_max_length = cast(int, SMOLLM2["max_position_embeddings"])
    wrapped.save_pretrained(directory)


def wire_bytes(directory: str, sizes: list[int]) -> None:
    """Bytes on the wire of a long input's answers, the app called in-process (no server, no port)."""
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import Settings

    word_tokenizer(directory, cast(int, SMOLLM2["vocab_size"]))
    settings = Settings(
        models={"smollm2-shaped": Path(directory)},
        default_model="smollm2-shaped",
        allowed_hosts=["testserver"],
        log_level="warning",
    )
    gzip = {"Accept-Encoding": "gzip"}
    print(f"bytes on the wire (gzip accepted; {PAGE_SCHEME} is app/static/js/api.js's COMPACT_SCHEME):")
    print(
        f"{'n':>5} {'trace stream':>13} {'overview row-max-uint8':>23} {f'overview {PAGE_SCHEME}':>29}"
        f" {'512 x 512 window':>17}"
    )
    with TestClient(create_app(settings)) as client:
        for n in sizes:
            text = " ".join((WORDS * (n // len(WORDS) + 1))[: n - 1])  # and <s>: n tokens
            body = {"text": text, "model": "smollm2-shaped"}
            stream = client.post("/api/trace", json=body, headers=gzip)
            done = json.loads(stream.text.strip().splitlines()[-1])
            if done.get("event") != "done" or done["n"] != n:
                raise RuntimeError(f"/api/trace did not trace {n} tokens: {stream.text[-300:]}")
            overview = {
                scheme: client.post(f"/api/trace/overview?scheme={scheme}", json=body, headers=gzip)
                for scheme in ("row-max-uint8", PAGE_SCHEME)
            }
            # The bottom-right window: the last 512 queries against the 512 keys before them and their own.
            spot = {"layer": 0, "head": 0, "rows": [n - 512, n], "cols": [n - 512, n], "max_cells": 512}
            window = client.post("/api/trace/window", json=body | spot, headers=gzip)
            for answer in (*overview.values(), window):
                answer.raise_for_status()
            sent = [stream, overview["row-max-uint8"], overview[PAGE_SCHEME], window]
            widths = (13, 23, 29, 17)
            row = " ".join(f"{a.num_bytes_downloaded:>{w},}" for a, w in zip(sent, widths, strict=True))
            print(f"{n:>5} {row}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="*", default=list(SIZES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-eager", action="store_true", help="skip transformers' eager memory")
    parser.add_argument("--no-memory", action="store_true", help="skip both memory figures")
    parser.add_argument(
        "--compare", action="store_true", help="also time the trace without overview and the blocked path"
    )
    parser.add_argument(
        "--wire",
        type=int,
        nargs="*",
        default=list(WIRE_SIZES),
        help="n for bytes on the wire (--wire alone: none)",
    )
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
        paths = {
            option: "+".join(dict.fromkeys(kept.path for kept in trace_forward(network, ids_of(64), **kw)[0]))
            for option, kw in (("trace", {}), ("fused=True", {"fused": True}))
        }
        print("paths (mha.trace.windows.Trace.path): " + ", ".join(f"{k} {v}" for k, v in paths.items()))
        compare = f" {'fused ms':>9} {'ratio':>6} {'no-overview ms':>14}" if args.compare else ""
        head = f"{'n':>5} {'trace ms':>9} {'blind ms':>9} {'ratio':>6}{compare}"
        print(f"{head} {'trace MiB':>10} {'eager MiB':>28}")
        for n in sorted(args.sizes):
            ids = ids_of(n)
            runs: dict[str, Callable[[], object]] = {"trace": partial(trace_forward, network, ids)}
            runs["blind"] = partial(blind_forward, network, ids)
            if args.compare:
                runs["fused"] = partial(trace_forward, network, ids, fused=True)
                runs["no-overview"] = partial(trace_forward, network, ids, overview_size=None, fused=True)
            times = interleaved(runs, args.repeats)
            t_trace, t_blind, *t_compare = (times[k].median_ms for k in runs)
            m_trace = float("nan") if args.no_memory else measure_memory("trace", n, args.threads, directory)
            m_eager = "-" if args.no_memory or args.no_eager else eager_memory(n, args.threads, directory)
            compared = ""
            if t_compare:
                t_fused, t_plain = t_compare
                compared = f" {t_fused:>9.0f} {t_fused / t_blind:>6.2f} {t_plain:>14.0f}"
            print(
                f"{n:>5} {t_trace:>9.0f} {t_blind:>9.0f} {t_trace / t_blind:>6.2f}{compared} {m_trace:>10.1f}"
                f" {m_eager:>28} (load {os.getloadavg()[0]:.2f})",
                flush=True,
            )
            gc.collect()
        if args.sizes and max(args.sizes) > 512:  # a 512 x 512 window needs more tokens than that
            n = max(args.sizes)
            traced, window, row = windows_and_rows(network, n, max(args.repeats, 3))
            print(f"at n = {n} (trace {traced:.0f} ms): 512 x 512 window {window:.1f} ms, row {row:.2f} ms")
        if args.wire:
            del network
            gc.collect()
            wire_bytes(directory, sorted(args.wire))
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
