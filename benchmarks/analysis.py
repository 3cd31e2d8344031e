"""Speed of mha.analysis, side by side with the straightforward formulas, in one run.

head_stats: ours (tiled row kernels) vs the textbook one-liners (xlogy, einsum) at L=6, H=12,
on one thread; the goal is well under 100 ms at n=512. attention_flow: seconds per input length
for 6 layers, to pick FLOW_MAX_TOKENS (~2 s). Run: .venv/bin/python benchmarks/analysis.py
"""

from __future__ import annotations

import os

import torch
from timing import interleaved, timed

from mha import analysis

LAYERS, HEADS = 6, 12


def attention(n: int, *, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(LAYERS, HEADS, n, n, generator=generator) * 2, dim=-1)


def reference_stats(a: torch.Tensor) -> dict[str, torch.Tensor]:
    """The definitions written the obvious way (no tiling)."""
    n = a.shape[-1]
    positions = torch.arange(n, dtype=a.dtype)
    distance = (positions[:, None] - positions[None, :]).abs()
    return {
        "entropy": (-torch.special.xlogy(a, a).sum(-1)).mean(-1),
        "distance": torch.einsum("lhij,ij->lhi", a, distance).mean(-1),
        "forward": (a * torch.ones(n, n).triu(1)).sum(-1).mean(-1),
        "max": a.amax(-1).mean(-1),
    }


def best_of(function, repeats: int = 5) -> float:
    """Seconds of the fastest of `repeats` calls, after one warm-up."""
    return timed(function, repeats).min


def main() -> None:
    torch.set_num_threads(1)
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; torch threads 1")
    print(f"\nhead_stats, {LAYERS}x{HEADS} heads (best of 5 interleaved, ms)")
    print(f"{'n':>5} {'ours':>8} {'reference':>10} {'ratio':>6}  max |diff|")
    for n in (64, 128, 256, 512):
        a = attention(n)
        tokens = ["[CLS]", *(f"w{i}" for i in range(n - 2)), "[SEP]"]
        times = interleaved(
            {
                "ours": lambda a=a, tokens=tokens: analysis.head_stats(a, tokens),
                "reference": lambda a=a: reference_stats(a),
            },
            repeats=5,
        )
        ours, reference = times["ours"].min, times["reference"].min
        got, want = analysis.head_stats(a, tokens), reference_stats(a)
        diff = max(float((got[k] - want[k]).abs().max()) for k in want)
        print(f"{n:>5} {ours * 1e3:>8.1f} {reference * 1e3:>10.1f} {reference / ours:>6.2f}  {diff:.1e}")

    print(f"\nrollout and compare, {LAYERS}x{HEADS} heads, n=512 (best of 5, ms)")
    a, b = attention(512), attention(512, seed=1)
    print(f"  rollout_per_layer {best_of(lambda: analysis.rollout_per_layer(a)) * 1e3:8.1f}")
    print(f"  compare           {best_of(lambda: analysis.compare(a, b), repeats=3) * 1e3:8.1f}")

    print(f"\nattention_flow, {LAYERS} layers, all n² pairs (one run, s)")
    for n in (8, 12, 14, 16, 20):
        a = attention(n)
        once = timed(lambda a=a, n=n: analysis.attention_flow(a, max_tokens=n), 1, warm=0).min
        print(f"  n={n:>3} {once:6.2f}   (default limit {analysis.FLOW_MAX_TOKENS})")
    a = attention(48)
    once = timed(lambda: analysis.attention_flow(a, max_tokens=48, queries=[0]), 1, warm=0).min
    print(f"  n= 48, [CLS] row only {once:6.2f}")


if __name__ == "__main__":
    main()
