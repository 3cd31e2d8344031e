"""Long-input traces against docs/memory-and-load.md's row: the real server (uvicorn subprocess), 4 clients.

The memory model (docs/memory-and-load.md) bounds what traces add to the resident set by
    HEADSCOPE_TRACE_CACHE_BYTES + HEADSCOPE_MAX_CONCURRENCY x HEADSCOPE_TRACE_MAX_BYTES
(every trace alive and every trace's forward, the trace and its scratch). This probe serves a random-weight
Llama of SmolLM2-135M's shape (30 layers, 9 query heads over 3 KV heads; benchmarks/long.py's checkpoint and
word-level tokenizer) with a 96 MiB trace limit and a 128 MiB trace cache, and sends 12 traces of distinct
texts, each as long as the model's `trace_max_tokens` (GET /api/models: the longest input whose forward
fits the limit), from 4 concurrent clients, in two phases on one server:
  traces   each client streams /api/trace to its end: what the row bounds
  + reads  each client then reads the trace as the page does, its overview (HSA1) and one window: their
           encodings and the cached overview bytes belong to other rows ("other encodings", "the answer
           cache"), and a trace the cache dropped meanwhile is traced again
Printed per phase: the server's peak resident set during it (VmHWM, reset at its start) minus its resident
set before the load, beside the row, and the resident set `--after` seconds later, beside the cache.

    .venv/bin/python benchmarks/trace_memory.py [--clients 4] [--traces 12] [--max-mib 96] [--cache-mib 128]
        [--concurrency 2] [--after 5] [--env NAME=VALUE ...]

Linux only (/proc). Building the checkpoint takes ~10 s and ~0.6 GB of disk in a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import cast

import httpx
from launch import Server, serve
from long import word_tokenizer
from random_llama import SMOLLM2, llama_checkpoint
from resident import reset_peak, status_kib
from texts import WORDS

MiB = 1 << 20
MODEL = "smollm2-shaped"
SAMPLE_S = 0.02  # between RSS samples (a second view of the peak, should clear_refs be refused)


def text_of(n: int, seed: int) -> str:
    """n - 1 words (the tokenizer adds <s>): n tokens, a different text for every seed."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n - 1))


def one_trace(client: httpx.Client, text: str, n: int, *, reads: bool) -> None:
    """What the page does with a long input: the trace's stream, then (`reads`) its overview and a window."""
    body = {"model": MODEL, "text": text}
    with client.stream("POST", "/api/trace", json=body) as stream:
        stream.raise_for_status()
        last = ""
        for line in stream.iter_lines():
            last = line
    done = json.loads(last)
    if done.get("event") != "done" or done["n"] != n:
        raise RuntimeError(f"/api/trace did not trace {n} tokens: {last[:300]!r}")
    if not reads:
        return
    client.post("/api/trace/overview", json=body).raise_for_status()
    side = min(n, 512)
    spot = {"layer": 3, "head": 1, "rows": [n - side, n], "cols": [0, side], "max_cells": 512}
    client.post("/api/trace/window", json=body | spot).raise_for_status()


def phase(
    server: Server, args: argparse.Namespace, n: int, first_seed: int, *, reads: bool
) -> tuple[int, float]:
    """Run one phase's traces from the clients: (the server's peak RSS in KiB during it, its seconds)."""
    pid = server.process.pid
    peak_reset = reset_peak(pid)
    sampled = [status_kib("VmRSS", pid)]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(SAMPLE_S):
            sampled.append(status_kib("VmRSS", pid))

    def client_run(index: int) -> None:
        with httpx.Client(base_url=server.base, timeout=600) as own:
            for seed in range(index, args.traces, args.clients):
                one_trace(own, text_of(n, first_seed + seed), n, reads=reads)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    began = time.perf_counter()
    try:
        with ThreadPoolExecutor(args.clients) as pool:
            for future in [pool.submit(client_run, i) for i in range(args.clients)]:
                future.result()
    finally:
        stop.set()
        sampler.join()
    seconds = time.perf_counter() - began
    return max(max(sampled), status_kib("VmHWM", pid) if peak_reset else 0), seconds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--traces", type=int, default=12, help="traces per phase")
    parser.add_argument("--max-mib", type=int, default=96, help="HEADSCOPE_TRACE_MAX_BYTES in MiB")
    parser.add_argument("--cache-mib", type=int, default=128, help="HEADSCOPE_TRACE_CACHE_BYTES in MiB")
    parser.add_argument("--concurrency", type=int, default=2, help="HEADSCOPE_MAX_CONCURRENCY")
    parser.add_argument("--after", type=float, default=5.0, help="seconds after a phase to read RSS")
    parser.add_argument("--env", nargs="*", default=[], metavar="NAME=VALUE", help="more server environment")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        llama_checkpoint(directory)
        word_tokenizer(directory, cast(int, SMOLLM2["vocab_size"]))
        env = {
            "HEADSCOPE_MODELS": json.dumps({MODEL: directory}),
            "HEADSCOPE_DEFAULT_MODEL": MODEL,
            "HEADSCOPE_RANDOM_MODEL": "false",
            "HEADSCOPE_TRACE_MAX_BYTES": str(args.max_mib * MiB),
            "HEADSCOPE_TRACE_CACHE_BYTES": str(args.cache_mib * MiB),
            "HEADSCOPE_MAX_CONCURRENCY": str(args.concurrency),
            "HEADSCOPE_LOG_LEVEL": "warning",
            **dict(pair.split("=", 1) for pair in args.env),
        }
        log = Path(directory) / "server.log"
        with serve(env, log=log) as server, httpx.Client(base_url=server.base, timeout=600) as client:
            pid = server.process.pid
            models = {m["name"]: m for m in client.get("/api/models").json()["models"]}
            n = models[MODEL]["trace_max_tokens"]
            one_trace(client, text_of(64, seed=-1), 64, reads=True)  # warm-up: lazy inits, thread pools
            time.sleep(2.0)  # the service's idle trim (1 s after a large answer)
            start = status_kib("VmRSS", pid)
            for index, (label, reads) in enumerate((("traces", False), ("+ reads", True))):
                peak, seconds = phase(server, args, n, index * args.traces, reads=reads)
                time.sleep(args.after)
                rows.append((label, seconds, peak, status_kib("VmRSS", pid)))
    bound = args.cache_mib + args.concurrency * args.max_mib
    print(
        f"{MODEL} (random weights): per phase {args.traces} traces of {n} tokens (its trace_max_tokens at "
        f"HEADSCOPE_TRACE_MAX_BYTES={args.max_mib} MiB) from {args.clients} clients; "
        f"HEADSCOPE_TRACE_CACHE_BYTES={args.cache_mib} MiB, HEADSCOPE_MAX_CONCURRENCY={args.concurrency}; "
        f"{os.cpu_count()} CPUs; RSS before the load {start / 1024:.0f} MiB"
    )
    print(
        f"{'phase':<8} {'seconds':>7} {'peak growth MiB':>16} {'README row':>11}"
        f" {f'held {args.after:g} s after':>17} {'the cache':>10}"
    )
    for label, seconds, peak, after in rows:
        print(
            f"{label:<8} {seconds:>7.1f} {(peak - start) / 1024:>16.0f} {bound:>11}"
            f" {(after - start) / 1024:>17.0f} {args.cache_mib:>10}"
        )
    print(
        f"(the row: {args.cache_mib} + {args.concurrency} x {args.max_mib} MiB; growth and held: over the "
        "RSS before the load)"
    )


if __name__ == "__main__":
    main()
