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

--device cpu|cuda: issue 27 item 4's figures on that device (`device_figures`; benchmarks/gpu.py reads
them through `gpu_rows`), the default model (MiniLM, or the stand-in gpu.py installs in its place):
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
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

SIZES = (32, 128, 512)
LLAMA_SIZES = (128, 512, 2048)
# SmolLM2-135M's shape (HuggingFaceTB/SmolLM2-135M config.json)
SMOLLM2 = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0},
    "tie_word_embeddings": True,
}
WORDS = "the quick brown fox jumps over the lazy dog while attention heads watch every token".split()


def text_of(n: int, tokenizer, *, salt: int = 0) -> str:
    """A text the tokenizer turns into exactly n tokens, specials included (`salt` rotates the words: another
    text of the same length)."""
    shift = salt % len(WORDS)
    words = ((WORDS[shift:] + WORDS[:shift]) * (n // len(WORDS) + 2))[: n - 2]
    text = " ".join(words)
    got = len(tokenizer(text)["input_ids"])
    if got != n:
        raise ValueError(f"text gives {got} tokens, wanted {n}")
    return text


def llama_checkpoint(directory: str) -> str:
    """A random SmolLM2-135M-shaped Llama saved in `directory` (weights only: no tokenizer is needed)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM2))
    with torch.no_grad():  # wider than the init, so heads are sharp as trained ones are
        for name, p in model.named_parameters():
            if p.ndim > 1 and "embed" not in name:
                p.mul_(3.0)
    model.save_pretrained(directory)
    return directory


def load_llama(which: str, directory: str):
    """(model, run(ids)) for one side of the llama comparison."""
    from transformers import AutoConfig, LlamaModel

    from mha.loading import checkpoint_files
    from mha.loading.convert import for_model_type
    from mha.loading.pretrained import build_network

    if which == "ours":
        # No tokenizer: the ids are random, so the network alone, loaded as load_pretrained loads it.
        converter = for_model_type("llama")
        config = converter.config_from_hf(AutoConfig.from_pretrained(directory))
        network = build_network(config, converter, checkpoint_files.weight_files(Path(directory)))

        def run_ours(ids: torch.Tensor):
            with torch.no_grad():
                return network(ids, need_hidden=False).attentions

        return network, run_ours
    theirs = LlamaModel.from_pretrained(directory, attn_implementation="eager").eval()

    def run_theirs(ids: torch.Tensor):
        with torch.no_grad():
            return theirs(ids, output_attentions=True).attentions

    return theirs, run_theirs


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


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def memory_child(which: str, n: int, llama: str | None = None) -> None:
    if llama is not None:
        _, run = load_llama(which, llama)
        text = torch.randint(0, SMOLLM2["vocab_size"], (1, n), generator=torch.Generator().manual_seed(n))
    else:
        _, tokenizer, run = load(which)
        text = text_of(n, tokenizer)
    run(text)  # warm: lazy inits, thread pool
    print_peak_added(lambda: run(text))


def print_peak_added(call: Callable[[], object]) -> None:
    """Print, as one JSON line, the resident set before `call` and the peak during it (a child's answer)."""
    gc.collect()
    base = _status_kib("VmRSS")
    # Writing 5 to clear_refs resets the peak (VmHWM) to the current RSS (Linux >= 4.0), so the peak
    # below is the extraction's own, not the model loading's.
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    result = call()
    peak = _status_kib("VmHWM")
    del result
    print(json.dumps({"base_kib": base, "peak_kib": peak}))


def measure_memory(which: str, n: int, threads: int, llama: str | None = None) -> float:
    """MiB the extraction adds to the process's peak RSS (fresh interpreter each time)."""
    extra = ["--llama-dir", llama] if llama else []
    return child_peak_mib([__file__, "--child", which, str(n), "--threads", str(threads), *extra])


def child_peak_mib(argv: list[str]) -> float:
    """MiB between the resident set and the peak that `python argv` prints (print_peak_added)."""
    out = subprocess.run(
        [sys.executable, *argv],
        check=True,
        capture_output=True,
        # A fixed mmap threshold: glibc otherwise raises it after the warm-up call and serves the measured
        # call from memory already resident, which would hide most of what that call allocates.
        env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"},
        text=True,
    ).stdout
    figures = json.loads(out.strip().splitlines()[-1])
    return (figures["peak_kib"] - figures["base_kib"]) / 1024


# --- issue 27 item 4: attend_batch and the service's first view on a device ------------------------------

BATCH_TEXTS, BATCH_TOKENS = 32, 128
COMPACT_SIZES = (128, 512)
FIRST_VIEW = "/api/attention/compact?scheme=abs-uint8-key-major&bits=auto"  # what the page asks first


def interleaved(
    runs: dict[str, Callable[[], object]], repeats: int, device: torch.device, warm: int = 2
) -> dict[str, tuple[float, float]]:
    """{name: (median ms, min ms)} of `repeats` interleaved calls each, after `warm` of each; the device is
    drained before every call, so none pays for the one before it."""
    for _ in range(warm):
        for run in runs.values():
            run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            run()  # every run ends with its values on the host, so its time includes the device's
            times[name].append(time.perf_counter() - start)
    return {name: (statistics.median(t) * 1000, min(t) * 1000) for name, t in times.items()}


def transformers_eager(device: torch.device) -> Callable[[list[str]], torch.Tensor]:
    """The reference: tokenize (padded), BertModel eager with output_attentions, every layer's maps stacked
    and copied to the host."""
    from transformers import AutoTokenizer, BertModel

    from mha.loading.pretrained import default_model_path

    path = str(default_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path)
    theirs = BertModel.from_pretrained(path, attn_implementation="eager").to(device).eval()

    def run(texts: list[str]) -> torch.Tensor:
        batch = tokenizer(texts, padding=True, return_tensors="pt").to(device)
        with torch.no_grad():
            return torch.stack(theirs(**batch, output_attentions=True).attentions).cpu()

    return run


def batch_figures(
    ours: Any, theirs: Callable[[list[str]], torch.Tensor], device: torch.device, repeats: int
) -> dict[str, Any]:
    """attend_batch of BATCH_TEXTS different texts of BATCH_TOKENS tokens against `theirs` of the same."""
    texts = [text_of(BATCH_TOKENS, ours.tokenizer, salt=i) for i in range(BATCH_TEXTS)]
    batch = interleaved(
        {
            "ours": lambda: ours.attend_batch(texts),
            "ours_no_hidden": lambda: ours.attend_batch(texts, hidden_state=False),
            "theirs": lambda: theirs(texts),
        },
        repeats,
        device,
    )
    return {
        "texts": BATCH_TEXTS,
        "tokens": BATCH_TOKENS,
        **{f"{name}_ms": median for name, (median, _) in batch.items()},
        **{f"{name}_min_ms": least for name, (_, least) in batch.items()},
        "ratio": batch["ours"][0] / batch["theirs"][0],
        "ratio_no_hidden": batch["ours_no_hidden"][0] / batch["theirs"][0],
    }


def device_figures(device: str = "cpu", *, repeats: int = 10) -> dict[str, Any]:
    """attend_batch 32 x 128 and the compact first view's latency at COMPACT_SIZES on `device`, each beside
    transformers eager + copy to host: {"device", "attend_batch": {...}, "compact": {n: {...}}}, times in ms
    (median and min), ratios ours / reference of the medians."""
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import Settings
    from mha import load_pretrained

    torch_device = torch.device(device)
    theirs = transformers_eager(torch_device)
    figures: dict[str, Any] = {
        "device": torch.cuda.get_device_name(torch_device) if torch_device.type == "cuda" else "cpu",
        # its own model, freed before the service loads one
        "attend_batch": batch_figures(load_pretrained(device=torch_device), theirs, torch_device, repeats),
        "compact": {},
    }
    settings = Settings(
        device=device,
        log_level="warning",
        models={},
        allowed_hosts=["testserver"],
        bundled_llm=False,
        random_model=False,
        cache_size=0,  # every request runs its forward and its encoding, as a new text does
    )
    with TestClient(create_app(settings)) as client:
        tokenizer = client.app.state.service.registry.get(None)[1].tokenizer  # type: ignore[attr-defined]
        for n in COMPACT_SIZES:
            text = text_of(n, tokenizer)

            def ask(text: str = text) -> None:
                answer = client.post(FIRST_VIEW, json={"text": text})
                if answer.status_code != 200:
                    raise RuntimeError(f"{FIRST_VIEW} answered {answer.status_code}: {answer.text[:200]}")

            timed = interleaved(
                {"service": ask, "theirs": lambda text=text: theirs([text])}, repeats, torch_device
            )
            figures["compact"][n] = {
                "service_ms": timed["service"][0],
                "service_min_ms": timed["service"][1],
                "theirs_ms": timed["theirs"][0],
                "theirs_min_ms": timed["theirs"][1],
                "ratio": timed["service"][0] / timed["theirs"][0],
            }
    return figures


def gpu_rows(device: str = "cuda", quick: bool = False) -> list[dict[str, Any]]:
    """device_figures as benchmarks/gpu.py's rows (its Row's fields)."""
    figures = device_figures(device, repeats=3 if quick else 10)
    batch = figures["attend_batch"]
    rows = [
        {
            "check": f"attend_batch {batch['texts']} x {batch['tokens']}",
            "ours": f"{batch['ours_ms']:.1f} ms (no hidden state {batch['ours_no_hidden_ms']:.1f})",
            "reference": f"transformers eager + copy to host {batch['theirs_ms']:.1f} ms",
            "ratio": batch["ratio"],
            "note": "goal <= 1",
            "values": {k: v for k, v in batch.items() if isinstance(v, float)},
        }
    ]
    for n, one in figures["compact"].items():
        rows.append(
            {
                "check": f"/api/attention/compact {n} tokens",
                "ours": f"{one['service_ms']:.1f} ms",
                "reference": f"transformers eager + copy to host {one['theirs_ms']:.1f} ms",
                "ratio": one["ratio"],
                "note": "the whole request: forward, quantize, gzip",
                "values": one,
            }
        )
    return rows


def print_device_figures(figures: dict[str, Any]) -> None:
    batch = figures["attend_batch"]
    print(
        f"{figures['device']}, torch {torch.__version__}, {torch.get_num_threads()} threads, load average "
        f"{os.getloadavg()[0]:.2f}; median (min) of interleaved repeats, ms"
    )
    print(f"{'check':<34} {'ours':>17} {'reference':>17} {'ratio':>7}")
    print(
        f"{'attend_batch 32 x 128':<34} {batch['ours_ms']:>8.1f} ({batch['ours_min_ms']:>6.1f})"
        f" {batch['theirs_ms']:>8.1f} ({batch['theirs_min_ms']:>6.1f}) {batch['ratio']:>7.3f}"
    )
    print(
        f"{'  without the hidden state':<34} {batch['ours_no_hidden_ms']:>8.1f}"
        f" ({batch['ours_no_hidden_min_ms']:>6.1f}) {'':>17} {batch['ratio_no_hidden']:>7.3f}"
    )
    for n, one in figures["compact"].items():
        check = f"/api/attention/compact {n} tokens"
        print(
            f"{check:<34} {one['service_ms']:>8.1f} ({one['service_min_ms']:>6.1f})"
            f" {one['theirs_ms']:>8.1f} ({one['theirs_min_ms']:>6.1f}) {one['ratio']:>7.3f}"
        )
    print("reference: transformers' BertModel eager (output_attentions) + torch.stack(...).cpu(), same texts")


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
        for _ in range(3):  # warm-up: allocator, thread pool, tokenizer caches
            for run in runs.values():
                run(text)
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.repeats):
            for name, run in runs.items():
                start = time.perf_counter()
                run(text)
                times[name].append(time.perf_counter() - start)
        t_ours, t_ours_h, t_theirs = (statistics.median(times[k]) * 1000 for k in runs)
        # The minimum is the figure least disturbed by other processes on a shared machine.
        b_ours, b_theirs = (min(times[k]) * 1000 for k in ("ours", "theirs"))
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
            ids = torch.randint(0, SMOLLM2["vocab_size"], (1, n), generator=torch.Generator().manual_seed(n))
            for run in runs.values():  # warm-up
                run(ids)
            times: dict[str, list[float]] = {name: [] for name in runs}
            for _ in range(args.repeats):
                for name, run in runs.items():
                    start = time.perf_counter()
                    result = run(ids)
                    times[name].append(time.perf_counter() - start)
                    del result
            t_ours, t_theirs = (statistics.median(times[k]) * 1000 for k in runs)
            b_ours, b_theirs = (min(times[k]) * 1000 for k in runs)
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
