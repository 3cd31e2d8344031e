"""Ours vs transformers: attention extraction from the default model (all-MiniLM-L6-v2) on the CPU.

For n = 32, 128, 512 tokens, in one run and side by side:
  ours   = load_pretrained().attend(text, hidden_state=False)  (tokenize, forward, every layer's attention
           as one [L, H, n, n]; what the service computes: the last layer's value path, out_proj and
           feed-forward are skipped, since no attention depends on them)
  ours+h = load_pretrained().attend(text)  (the same plus the last hidden state: the whole forward)
  theirs = tokenizer(text) + BertModel(attn_implementation="eager")(..., output_attentions=True)
Time: median of repeats, the two interleaved so machine load hits both alike.
Memory: in a fresh subprocess per model and size, the peak resident set (VmHWM, reset after loading
through /proc/self/clear_refs) minus the resident set before the call, with glibc's mmap threshold
fixed so freed blocks leave the process: what one extraction adds,
torch's allocations included (tracemalloc would not see them). Linux only.

    .venv/bin/python benchmarks/extract.py [--repeats 20] [--threads N]

--family llama: a random-weight Llama with SmolLM2-135M's shape (30 layers, 9 query heads over 3 KV heads,
hidden 576, feed-forward 1536, vocabulary 49,152), saved as a checkpoint and loaded by both sides, at
n = 128, 512 and 2048 random token ids (tokenization is the same for both and left out):
  ours   = our Transformer's forward with every attention and no hidden state (need_hidden=False)
  theirs = LlamaForCausalLM's base model, attn_implementation="eager", output_attentions=True

    .venv/bin/python benchmarks/extract.py --family llama [--repeats 5]

--family smollm2: the real SmolLM2-135M-Instruct from the bundled GGUF against transformers reading the
same file: load times (first and cached), attend and resident memory (benchmarks/smollm2.py, which takes
the same options after --family smollm2).

--device cpu|cuda: issue 27 item 4's figures on that device (benchmarks/extract_device.py; benchmarks/gpu.py
reads them through its `gpu_rows`), the default model (MiniLM, or the stand-in gpu.py installs in its place):
  attend_batch  32 different texts of 128 tokens: model.attend_batch(texts) (every result's maps and
                hidden state on the host) against tokenizer(texts, padding) + BertModel eager with
                output_attentions + torch.stack(attentions).cpu(): transformers' forward and its copy to
                the host; ours without the hidden state beside it.
  compact       the service's /api/attention/compact latency as the page asks it (abs-uint8-key-major,
                bits=auto, gzip) at 128 and 512 tokens, in process (TestClient, the cache off so every
                request runs its forward), against transformers eager + copy to host of the same text.
Median and min of interleaved repeats, each beside its reference as a ratio.

    .venv/bin/python benchmarks/extract.py --device cuda [--repeats 20]
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial

import torch
from random_llama import ids_of, llama_checkpoint, load_llama
from resident import child_peak_mib, print_peak_added
from texts import text_of
from timing import interleaved

SIZES = (32, 128, 512)
LLAMA_SIZES = (128, 512, 2048)


def load(which: str):
    from mha import load_pretrained
    from mha.loading.pretrained import default_model_path

    ours = load_pretrained(device="cpu")
    if which == "ours":
        return ours, ours.tokenizer, lambda text: ours.attend(text, hidden_state=False)
    if which == "ours+h":
        return ours, ours.tokenizer, lambda text: ours.attend(text)
    from transformers import BertModel

    theirs = BertModel.from_pretrained(str(default_model_path()), attn_implementation="eager").eval()
    tokenizer = ours.tokenizer

    def run(text: str):
        with torch.no_grad():
            return theirs(**tokenizer(text, return_tensors="pt"), output_attentions=True).attentions

    return theirs, tokenizer, run


def memory_child(which: str, n: int, llama: str | None = None) -> None:
    if llama is not None:
        _, run = load_llama(which, llama)
        text = ids_of(n)
    else:
        _, tokenizer, run = load(which)
        text = text_of(n, tokenizer)
    run(text)  # warm: lazy inits, thread pool
    print_peak_added(lambda: run(text))


def measure_memory(which: str, n: int, threads: int, llama: str | None = None) -> float:
    """MiB the extraction adds to the process's peak RSS (fresh interpreter each time)."""
    extra = ["--llama-dir", llama] if llama else []
    return child_peak_mib([__file__, "--child", which, str(n), "--threads", str(threads), *extra])


def main() -> None:
    if sys.argv[1:3] == ["--family", "smollm2"]:
        import smollm2

        smollm2.main(sys.argv[3:])
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--no-memory", action="store_true")
    # smollm2 (given first) is handed to benchmarks/smollm2.py above
    parser.add_argument("--family", choices=("minilm", "llama", "smollm2"), default="minilm")
    parser.add_argument("--child", nargs=2, metavar=("WHICH", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--llama-dir", help=argparse.SUPPRESS)
    parser.add_argument(
        "--device", help="cpu or cuda: attend_batch 32 x 128 and the compact first view there"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.device:
        from extract_device import device_figures, print_device_figures

        print_device_figures(device_figures(args.device, repeats=args.repeats))
        return
    if args.child:
        memory_child(args.child[0], int(args.child[1]), args.llama_dir)
        return
    if args.family == "llama":
        main_llama(args)
        return

    _, tokenizer, ours = load("ours")
    ours_h = load("ours+h")[2]
    _, _, theirs = load("theirs")
    runs = {"ours": ours, "ours+h": ours_h, "theirs": theirs}
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f}; median and min of {args.repeats} interleaved repeats"
    )
    print(
        f"{'n':>5} {'ours ms':>9} {'ours+h ms':>10} {'theirs ms':>10} {'ratio':>7} {'ratio+h':>8}"
        f" {'min ours':>9} {'min theirs':>11} {'ratio':>7} {'ours MiB':>9} {'theirs MiB':>11}"
    )
    for n in SIZES:
        text = text_of(n, tokenizer)
        # Three warm-up rounds: allocator, thread pool, tokenizer caches.
        times = interleaved({k: partial(run, text) for k, run in runs.items()}, args.repeats, warm=3)
        t_ours, t_ours_h, t_theirs = (times[k].median_ms for k in runs)
        b_ours, b_theirs = (times[k].min_ms for k in ("ours", "theirs"))
        if args.no_memory:
            m_ours = m_theirs = float("nan")
        else:
            m_ours, m_theirs = (measure_memory(k, n, args.threads) for k in ("ours", "theirs"))
        print(
            f"{n:>5} {t_ours:>9.2f} {t_ours_h:>10.2f} {t_theirs:>10.2f} {t_ours / t_theirs:>7.3f}"
            f" {t_ours_h / t_theirs:>8.3f} {b_ours:>9.2f} {b_theirs:>11.2f}"
            f" {b_ours / b_theirs:>7.3f} {m_ours:>9.1f} {m_theirs:>11.1f}"
        )
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


def main_llama(args: argparse.Namespace) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        llama_checkpoint(directory)
        runs = {which: load_llama(which, directory)[1] for which in ("ours", "theirs")}
        print(
            f"SmolLM2-135M-shaped Llama (random weights), torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.2f}; "
            f"median and min of {args.repeats} interleaved repeats"
        )
        print(
            f"{'n':>5} {'ours ms':>9} {'theirs ms':>10} {'ratio':>7} {'min ours':>9} {'min theirs':>11}"
            f" {'ratio':>7} {'ours MiB':>9} {'theirs MiB':>11}"
        )
        for n in LLAMA_SIZES:
            ids = ids_of(n)
            times = interleaved({k: partial(run, ids) for k, run in runs.items()}, args.repeats)
            t_ours, t_theirs = (times[k].median_ms for k in runs)
            b_ours, b_theirs = (times[k].min_ms for k in runs)
            if args.no_memory:
                m_ours = m_theirs = float("nan")
            else:
                m_ours, m_theirs = (measure_memory(k, n, args.threads, directory) for k in runs)
            print(
                f"{n:>5} {t_ours:>9.1f} {t_theirs:>10.1f} {t_ours / t_theirs:>7.3f} {b_ours:>9.1f}"
                f" {b_theirs:>11.1f} {b_ours / b_theirs:>7.3f} {m_ours:>9.1f} {m_theirs:>11.1f}",
                flush=True,
            )
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
