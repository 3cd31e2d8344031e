"""Ours vs transformers: attention extraction from the default model (all-MiniLM-L6-v2) on the CPU.

For n = 32, 128, 512 tokens, in one run and side by side:
  ours   = load_pretrained().attend(text)  (tokenize, forward, every layer's attention as one [L, H, n, n])
  theirs = tokenizer(text) + BertModel(attn_implementation="eager")(..., output_attentions=True)
Time: median of repeats, the two interleaved so machine load hits both alike.
Memory: peak resident set (ru_maxrss) of a fresh subprocess that loads one model and runs one size;
the baseline after loading is subtracted, so the figure is what extraction itself adds.

    .venv/bin/python benchmarks/extract.py [--repeats 20] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch

SIZES = (32, 128, 512)
WORDS = "the quick brown fox jumps over the lazy dog while attention heads watch every token".split()


def text_of(n: int, tokenizer) -> str:
    """A text the tokenizer turns into exactly n tokens, specials included."""
    words = (WORDS * (n // len(WORDS) + 2))[: n - 2]
    text = " ".join(words)
    got = len(tokenizer(text)["input_ids"])
    if got != n:
        raise ValueError(f"text gives {got} tokens, wanted {n}")
    return text


def load(which: str):
    from mha import load_pretrained
    from mha.pretrained import default_model_path

    ours = load_pretrained(device="cpu")
    if which == "ours":
        return ours, ours.tokenizer, lambda text: ours.attend(text)
    from transformers import BertModel

    theirs = BertModel.from_pretrained(str(default_model_path()), attn_implementation="eager").eval()
    tokenizer = ours.tokenizer

    def run(text: str):
        with torch.no_grad():
            return theirs(**tokenizer(text, return_tensors="pt"), output_attentions=True).attentions

    return theirs, tokenizer, run


def memory_child(which: str, n: int) -> None:
    _, tokenizer, run = load(which)
    text = text_of(n, tokenizer)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    run(text)
    run(text)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"base_kib": base, "peak_kib": peak}))


def measure_memory(which: str, n: int, threads: int) -> float:
    """MiB the extraction adds to the process's peak RSS (fresh interpreter each time)."""
    out = subprocess.run(
        [sys.executable, __file__, "--child", which, str(n), "--threads", str(threads)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    figures = json.loads(out.strip().splitlines()[-1])
    return (figures["peak_kib"] - figures["base_kib"]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--child", nargs=2, metavar=("WHICH", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.child:
        memory_child(args.child[0], int(args.child[1]))
        return

    _, tokenizer, ours = load("ours")
    _, _, theirs = load("theirs")
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f}; median of {args.repeats} interleaved repeats"
    )
    print(f"{'n':>5} {'ours ms':>9} {'theirs ms':>10} {'ratio':>7} {'ours MiB':>9} {'theirs MiB':>11}")
    for n in SIZES:
        text = text_of(n, tokenizer)
        for _ in range(3):  # warm-up: allocator, thread pool, tokenizer caches
            ours(text)
            theirs(text)
        times: dict[str, list[float]] = {"ours": [], "theirs": []}
        for _ in range(args.repeats):
            for name, run in (("ours", ours), ("theirs", theirs)):
                start = time.perf_counter()
                run(text)
                times[name].append(time.perf_counter() - start)
        t_ours, t_theirs = (statistics.median(times[k]) * 1000 for k in ("ours", "theirs"))
        if args.no_memory:
            m_ours = m_theirs = float("nan")
        else:
            m_ours, m_theirs = (measure_memory(k, n, args.threads) for k in ("ours", "theirs"))
        print(
            f"{n:>5} {t_ours:>9.2f} {t_theirs:>10.2f} {t_ours / t_theirs:>7.3f}"
            f" {m_ours:>9.1f} {m_theirs:>11.1f}"
        )
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
