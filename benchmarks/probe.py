"""The head probe (``AttentionModel.probe_heads``, issue 47 item 6) against one attend of the same tokens, on
the CPU: MiniLM (the embedded default), SmolLM2-135M-Instruct (bundled) and the 1 B Llama GGUF of
benchmarks/big_gguf.py (its writer: Q4_K_M's mix of random blocks, 16 layers, 32 heads, ~0.9 GB).

The probe at its defaults: seed 0, 8 sequences of a start token and 50 random ids repeated once, 8 x 101
tokens in one batched forward, each layer's maps scored as they come. Beside it, the same number of tokens
through ``attend`` (hidden_state=False: the weights alone, as the probe takes them): one text of 808 tokens
where the model's limit allows; MiniLM's is 512, so there it is ``attend_batch`` of 8 texts of 101 tokens
(the same tokens and maps, padded to none: each text is cut to 101).

The times: both in one fresh process, interleaved (timing.py: one warm call each, then --repeats rounds,
the median and the best), so the machine's load weighs on each alike. The memory: each in a fresh process
of its own, one call: its peak resident memory (VmHWM, reset after the load by /proc/self/clear_refs, so
the load's own peak is not counted) and that peak over the loaded model's resident set (VmRSS just before
the call): the call's own memory. Ratios are probe / attend.

    .venv/bin/python benchmarks/probe.py [--models minilm,smollm2,1b] [--sizes 1b] [--repeats 5]
        [--folder /tmp] [--keep] [--threads N]

``--models`` picks the models (``1b`` is the GGUF; ``tiny`` its 2-layer rehearsal, in seconds), ``--sizes``
the GGUF's sizes as big_gguf.py takes them (``--sizes ""`` skips the GGUF). The GGUF file is written into
--folder and deleted at the end unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from big_gguf import SIZES, write_file  # beside this script, as timing
from timing import ratio

ROOT = Path(__file__).resolve().parents[1]
SEQUENCES, LENGTH = 8, 50  # probe_heads' defaults
TOKENS = SEQUENCES * (2 * LENGTH + 1)  # 808
NAMED = {"minilm": None, "smollm2": "SmolLM2-135M-Instruct"}  # load_pretrained's names (None: the default)
# Long enough for 808 tokens in every tokenizer here (MiniLM's WordPiece: ~1 token a word).
TEXT = " ".join(["the quick brown fox jumps over the lazy dog, and the cat sat on the mat."] * 80)

CHILD = r"""
import json, sys, time
import torch
from mha import load_pretrained
from timing import interleaved
MODEL, WHAT, REPEATS, TOKENS, SEQUENCES, LENGTH, TEXT = sys.argv[1:8]
REPEATS, TOKENS, SEQUENCES, LENGTH = int(REPEATS), int(TOKENS), int(SEQUENCES), int(LENGTH)
def status(field):  # MiB
    lines = open("/proc/self/status").read().split("\n")
    return next(int(l.split()[1]) for l in lines if l.startswith(field)) / 1024
began = time.perf_counter()
model = load_pretrained(None if MODEL == "-" else MODEL, device="cpu")
out = {"load": time.perf_counter() - began, "load_hwm": status("VmHWM"), "limit": model.info.max_tokens}
with open("/proc/self/clear_refs", "w") as clear:  # "5": the peak (VmHWM) restarts from the RSS now
    clear.write("5")
out["loaded"] = status("VmRSS")
batch = model.info.max_tokens < TOKENS  # no room for one text of TOKENS: SEQUENCES texts of its share
calls = {
    "probe": lambda: model.probe_heads(seed=0, sequences=SEQUENCES, length=LENGTH),
    "attend": (
        (lambda: model.attend_batch([TEXT] * SEQUENCES, max_tokens=TOKENS // SEQUENCES, hidden_state=False))
        if batch
        else (lambda: [model.attend(TEXT, max_tokens=TOKENS, hidden_state=False)])
    ),
}
if WHAT == "time":  # both in this process, interleaved (timing.py): the machine's load weighs on each alike
    got = interleaved(calls, REPEATS)
    out.update({f"{k}_{m}": getattr(v, m) for k, v in got.items() for m in ("median", "min")})
elif WHAT in calls:  # one call in a fresh process: its peak is its own
    result = calls[WHAT]()
    out["tokens"] = int(result.token_ids.numel()) if WHAT == "probe" else sum(r.n for r in result)
    out["texts"] = 1 if WHAT == "probe" else len(result)
out.update(hwm=status("VmHWM"), batch=batch)
print(json.dumps(out))
"""


def child(model: str, what: str, repeats: int, cache: str, threads: int | None) -> dict[str, float]:
    """One fresh process: ``what`` "load", "probe" or "attend" (one call: its VmHWM its own), or "time"
    (both interleaved, timing.py)."""
    env = {**os.environ, "HEADSCOPE_CACHE_DIR": cache, "PYTHONPATH": f"{ROOT}:{ROOT / 'benchmarks'}"}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    args = [model, what, str(repeats), str(TOKENS), str(SEQUENCES), str(LENGTH), TEXT]
    done = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"the {what} child of {model} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def row(name: str, model: str, repeats: int, cache: str, threads: int | None) -> None:
    """The probe and its attend: their times interleaved in one process, each one's peak in its own; a
    table row, printed as it ends."""
    probe, attend = (child(model, what, 0, cache, threads) for what in ("probe", "attend"))
    times = child(model, "time", repeats, cache, threads)
    what = f"{attend['texts']} x {attend['tokens'] // attend['texts']}" + (
        " (batch)" if attend["batch"] else ""
    )
    own = {k: got["hwm"] - got["loaded"] for k, got in (("probe", probe), ("attend", attend))}
    ms = {k: f"{times[k + '_median'] * 1000:,.0f} ({times[k + '_min'] * 1000:,.0f})" for k in own}
    print(
        f"| {name} | {probe['tokens']} | {ms['probe']} | {probe['hwm']:,.0f} (+{own['probe']:,.0f}) | {what} "
        f"| {ms['attend']} | {attend['hwm']:,.0f} (+{own['attend']:,.0f}) "
        f"| {ratio(times['probe_median'], times['attend_median']):.2f} "
        f"| {ratio(own['probe'], own['attend']):.2f} |",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="minilm,smollm2,1b", help="comma-separated: minilm, smollm2, 1b")
    parser.add_argument("--sizes", default=None, help="the GGUF's sizes (big_gguf.py's: 1b, 8b, tiny)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--folder", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--keep", action="store_true", help="keep the written GGUF files")
    parser.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of each child")
    args = parser.parse_args()
    models = [m for m in args.models.split(",") if m]
    sizes = (
        [m for m in models if m in SIZES] if args.sizes is None else [s for s in args.sizes.split(",") if s]
    )
    unknown = sorted(set(models) - set(NAMED) - set(SIZES))
    if unknown:
        raise SystemExit(
            f"unknown models {unknown}: minilm, smollm2 or a size of big_gguf.py ({', '.join(SIZES)})"
        )
    print(
        f"probe_heads(seed=0, sequences={SEQUENCES}, length={LENGTH}) against attend of {TOKENS} tokens "
        f"(hidden_state=False), CPU, {args.threads or 'default'} threads, median (best) of {args.repeats} "
        f"after a warm call; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    print(
        "\n| model | probe tokens | probe ms | probe peak RSS MiB (+ over the loaded model) | attend tokens "
        "| attend ms | attend peak RSS MiB (+) | time probe / attend | own peak probe / attend |"
    )
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    with tempfile.TemporaryDirectory() as cache:
        for name in (m for m in models if m in NAMED):
            row(name, NAMED[name] or "-", args.repeats, cache, args.threads)
        for size in sizes:
            path = args.folder / f"random-llama-{size}.gguf"
            began = time.perf_counter()
            reused = path.exists()  # one --keep left: the same bytes (seed 0)
            if not reused:
                write_file(path, size)
            how = "reused" if reused else f"written in {time.perf_counter() - began:.0f} s"
            try:
                child(str(path), "load", 0, cache, args.threads)  # fills the GGUF cache: loads are then alike
                row(
                    f"{size} GGUF ({path.stat().st_size / 2**20:,.0f} MiB, {how})",
                    str(path),
                    args.repeats,
                    cache,
                    args.threads,
                )
            finally:
                if not args.keep:
                    path.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
