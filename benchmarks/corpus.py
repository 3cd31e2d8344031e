"""Corpus runs: speed and memory, side by side in one run.

1. texts/s of the local engine (mha.corpus.run: padded batches, batched statistics, Parquet shards and
   aggregation included) against a plain loop of `attend` + `head_stats` + `head_labels` per text, on
   MiniLM and TEXTS texts of 20-60 tokens generated deterministically (goal: >= 3x), beside the
   engine's forwards alone (its padded groups, no statistics, no files) and the ceiling this CPU puts on
   any engine: the forward's matrix products alone (the texts' own tokens, no padding, nothing else
   counted) at this CPU's measured matmul peak; then the engine's share of that ceiling (goal on a CPU:
   >= 60 %) and of its forwards alone (goal on a GPU: >= 50 %, and >= 5x the loop). --repeat R
   measures the engine and its forwards alone R times in turn and keeps the best of each;
2. with `--engines local ray`, the Ray engine on this machine against the local engine (goal: >= 0.8x):
   cold (the engine starts a local cluster for the job and stops it) and warm (a Ray already started in
   this process, as a standing cluster joined through RAY_ADDRESS would be, that has run one job before;
   each job still starts its own workers and loads the model in each);
3. peak resident memory (ru_maxrss) of a whole local run at TEXTS and 10·TEXTS texts, each in a fresh
   subprocess (goal: within 10 %: the job streams, so memory does not grow with the corpus).

Run: PYTHONPATH=. .venv/bin/python benchmarks/corpus.py [--texts 2000] [--engines local ray] [--ray-large]
[--no-memory] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from timing import timed

from mha import analysis, load_pretrained

# Common words that MiniLM's WordPiece keeps whole, so a text of k words is k + 2 tokens (with [CLS], [SEP]).
WORDS = (
    "the of and to in is was for on that with as by at from his it an were are which this be or has had "
    "not but first one their its new after who they have her she two been other when there all during into "
    "school time may years more most only over city some world would where later up such used many can "
    "state about national out known university united then made"
).split()
PUNCTUATION = (",", ".", ";")


def write_corpus(path: Path, texts: int, *, seed: int = 0) -> None:
    """``texts`` JSON lines of 20-60 tokens each (18-58 words and punctuation, plus [CLS] and [SEP])."""
    generator = random.Random(seed)
    with path.open("w", encoding="utf-8") as f:
        for i in range(texts):
            pieces = [
                generator.choice(WORDS) if generator.random() > 0.1 else generator.choice(PUNCTUATION)
                for _ in range(generator.randint(18, 58))
            ]
            f.write(json.dumps({"id": f"t{i}", "text": " ".join(pieces)}) + "\n")


def plain_loop(model, path: Path) -> float:
    """texts/s of attend + head_stats + head_labels, one text at a time."""
    texts = [json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines()]
    start = time.perf_counter()
    for text in texts:
        result = model.attend(text, hidden_state=False)
        stats = analysis.head_stats(result.attentions, result.tokens, special=result.special, causal=False)
        analysis.head_labels(stats)
    return len(texts) / (time.perf_counter() - start)


def engine_rate(model, path: Path, engine: str, batch: int, device: str) -> tuple[float, float, float]:
    """texts/s of a whole run (model already loaded for the local engine; Ray loads it on its workers),
    the seconds before the first batch came back (Ray: the cluster, its workers, their models), and
    texts/s from then on."""
    from mha.corpus import run

    seen: list[tuple[float, int]] = []
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        summary = run(
            path,
            model if engine == "local" else None,
            Path(out) / "run",
            engine=engine,
            batch=batch,
            device=device,
            progress=lambda done, total: seen.append((time.perf_counter(), done)),
        )
        end = time.perf_counter()
    first, first_done = next((t, done) for t, done in seen if done > 0)  # not a run's opening call
    after = (seen[-1][1] - first_done) / max(end - first, 1e-9)
    return summary["counts"]["texts"] / (end - start), first - start, after


def forward_flops(config, n: int) -> float:
    """Multiply-add FLOPs of the matrix products in one n-token forward as the worker runs it (need_hidden
    False: the last layer computes q and k alone; its values, output projection and feed-forward are
    skipped): every layer's projections and feed-forward per token, and the n x n products per head."""
    e, f, layers = config.embed_dim, config.ffn_dim, config.num_layers
    d = config.head_dim or e // config.num_heads
    q, kv = config.num_heads * d, (config.num_kv_heads or config.num_heads) * d
    ffn_in = 2 * f if config.mlp == "gated" else f
    full = e * (q + 2 * kv) + q * e + e * ffn_in + f * e  # per token: q, k, v, out, feed-forward
    products = 2 * n * n * q  # q·kᵀ and weights·v, over all heads
    last = n * e * (q + kv) + n * n * q  # q and k, then q·kᵀ
    return 2.0 * ((layers - 1) * (n * full + products) + last)


def matmul_peak(config, device: torch.device) -> float:
    """FLOP/s of the device's best float32 matmul (on the CPU, on torch's threads), at the feed-forward's
    shape with 4,096 rows (large enough for the kernel's peak): the best of 5."""
    a = torch.randn(4096, config.embed_dim, device=device)
    b = torch.randn(config.embed_dim, config.ffn_dim, device=device)
    best = timed(lambda: a @ b, 5, device=device).min
    return 2.0 * a.shape[0] * a.shape[1] * b.shape[1] / best


def encode(model, path: Path) -> list:
    """The corpus's texts encoded as the worker encodes them (one at a time, at most 512 tokens)."""
    texts = [json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines()]
    return [model.encoder.encode_batch([(t, None)], 512)[0] for t in texts]


def forward_alone(model, encoded: list, batch: int) -> float:
    """texts/s of the engine's forwards and nothing else: the same padded groups of the same batches, T at
    a time on torch's T threads, each on one (mha._threads.in_order), no statistics, no files."""
    from mha._threads import in_order
    from mha.corpus.worker import padded_groups

    groups = []
    for start in range(0, len(encoded), batch):
        part = encoded[start : start + batch]
        groups += [[part[k] for k in group] for group in padded_groups([len(e.ids) for e in part])]
    begin = time.perf_counter()
    threads = torch.get_num_threads() if model.device.type == "cpu" else 1  # as the local engine runs
    for _ in in_order(model.forward_padded, enumerate(groups), threads):
        pass
    return len(encoded) / (time.perf_counter() - begin)


def ceiling(model, encoded: list, loop: float) -> tuple[float, float, float]:
    """(peak GFLOP/s, ms a text for the forward's matmuls at that peak, the most any engine can beat the
    loop by: the loop's ms a text over that floor)."""
    lengths = [len(e.ids) for e in encoded]
    flops = sum(forward_flops(model.config, n) for n in lengths) / len(lengths)
    peak = matmul_peak(model.config, model.device)
    floor = flops / peak
    return peak / 1e9, 1e3 * floor, (1 / loop) / floor


def ray_rate(path: Path, batch: int, warm: bool, device: str) -> tuple[float, float, float]:
    """engine_rate of the Ray engine: on a local cluster it starts and stops itself (cold), or on a Ray
    started here first that has run the same job once (warm: Ray Data's own actors already up)."""
    if not warm:
        return engine_rate(None, path, "ray", batch, device)
    import ray

    ray.init(address="local", include_dashboard=False, log_to_driver=False)
    try:
        engine_rate(None, path, "ray", batch, device)
        return engine_rate(None, path, "ray", batch, device)
    finally:
        ray.shutdown()


MEMORY_CHILD = """
import resource, sys
from mha.corpus import run
run(sys.argv[1], None, sys.argv[2], batch=int(sys.argv[3]), device=sys.argv[4])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def peak_memory(path: Path, batch: int, device: str) -> float:
    """MiB of peak resident memory of a whole local run in a fresh process (ru_maxrss, KiB on Linux)."""
    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        done = subprocess.run(
            [sys.executable, "-c", MEMORY_CHILD, str(path), str(Path(out) / "run"), str(batch), device],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        return int(done.stdout.split()[-1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--engines", nargs="+", default=["local"], choices=["local", "ray"])
    parser.add_argument("--no-memory", action="store_true", help="skip the two memory runs")
    parser.add_argument(
        "--ray-large", action="store_true", help="also the local and (cold) Ray engines on 10·TEXTS texts"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument(
        "--repeat", type=int, default=1, help="the local engine and its forwards alone, in turn: the best of"
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda, ... (the loop, both engines, the peak)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the memory runs' subprocesses too
    threads = torch.get_num_threads()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; torch threads {threads}")
    model = load_pretrained(device=args.device)
    with tempfile.TemporaryDirectory() as scratch:
        small = Path(scratch) / "small.jsonl"
        write_corpus(small, args.texts)
        print(f"\nMiniLM, {args.texts} texts of 20-60 tokens, batch {args.batch}")
        loop = plain_loop(model, small)
        encoded = encode(model, small)
        # Engine and forwards alone measured in turn, the best of --repeat each: on a shared machine the
        # load moves between two measurements, and the ratio of the two is the figure that matters.
        local, local_start, local_after, alone = 0.0, 0.0, 0.0, 0.0
        for _ in range(args.repeat):
            rate = engine_rate(model, small, "local", args.batch, args.device)
            if rate[0] > local:
                local, local_start, local_after = rate
            alone = max(alone, forward_alone(model, encoded, args.batch))
        peak, floor, most = ceiling(model, encoded, loop)
        print(f"{'':28}{'texts/s':>10}{'ratio':>8}  goal{'first batch':>22}{'texts/s after':>15}")
        print(f"{'attend + head_stats loop':28}{loop:>10.1f}{1.0:>8.2f}")
        print(
            f"{'local engine':28}{local:>10.1f}{local / loop:>8.2f}  >= 3x the loop"
            f"{local_start:>9.1f} s{local_after:>15.1f}"
        )
        print(f"{'its forwards alone':28}{alone:>10.1f}{alone / loop:>8.2f}  no statistics, no files")
        print(
            f"{'ceiling on this ' + model.device.type:28}{1e3 / floor:>10.1f}{most:>8.2f}"
            "  the forward's matmuls alone, "
            f"{floor:.2f} ms a text at the measured peak {peak:.0f} GFLOP/s"
        )
        print(
            f"local engine: {100 * local * floor / 1e3:.0f} % of the ceiling (goal >= 60 % on a CPU), "
            f"{100 * local / alone:.0f} % of its forwards alone (goal >= 50 % on a GPU)"
        )
        if "ray" in args.engines:
            try:
                for label, warm in (("ray engine, cold cluster", False), ("ray engine, warm cluster", True)):
                    ray, ray_start, ray_after = ray_rate(small, args.batch, warm, args.device)
                    print(
                        f"{label:28}{ray:>10.1f}{ray / local:>8.2f}  >= 0.8x local"
                        f"{ray_start:>9.1f} s{ray_after:>15.1f}"
                    )
            except (ImportError, RuntimeError) as error:
                print(f"{'ray engine':28}  not run: {error}")
        large = Path(scratch) / "large.jsonl"
        write_corpus(large, 10 * args.texts, seed=1)
        if args.ray_large:
            print(f"\n{10 * args.texts} texts (the Ray engine's start-up spread over ten times the texts)")
            local = engine_rate(model, large, "local", args.batch, args.device)[0]
            ray = ray_rate(large, args.batch, False, args.device)[0]
            print(f"{'local engine':28}{local:>10.1f}{1.0:>8.2f}")
            print(f"{'ray engine, cold cluster':28}{ray:>10.1f}{ray / local:>8.2f}  >= 0.8x local")
        if not args.no_memory:
            print("\npeak resident memory of a whole local run (fresh process each; ru_maxrss)")
            first = peak_memory(small, args.batch, args.device)
            second = peak_memory(large, args.batch, args.device)
            print(f"{args.texts:>7} texts {first:>8.0f} MiB")
            growth = 100 * (second / first - 1)
            print(f"{10 * args.texts:>7} texts {second:>8.0f} MiB  ({growth:+.1f} %, goal within 10 %)")


if __name__ == "__main__":
    main()
