"""One device call: issue 27's GPU table, parity first, then the speed rows, printed as one table at the end.

Sections, in order of value, each under its own time cap (a SIGALRM stops it; the rows it made stay) and
guarded so that a failure costs only its own rows:
  parity   every family we convert (tests/checkpoints.py, tests/seq2seq_checkpoints.py: tiny random
           checkpoints from configs, norm weights and biases drawn away from 1 and 0), one text (an
           encoder-decoder: a source and a forced target), in float32, float16 and bfloat16. Each row is
           the largest |weight - reference| over every attention map, the reference being our own
           network in float64 on the same device: ours beside transformers' eager model loaded in the
           same dtype (from_pretrained(dtype=...)). Goal: ours no further than transformers'.
  trace    a SmolLM2-135M-shaped Llama (benchmarks/random_llama.py's, its position limit raised to 32,768)
           at 8,192 / 16,384 / 32,768 random ids: trace_forward against random_llama.py's blind SDPA
           forward of the same network, the kernel path the trace took and the peak it adds on the device.
           Goal on a GPU: <= 1.5x. A size whose projected time (4x the last one's) is over what is left
           of the cap is skipped and says so.
  corpus   MiniLM (the embedded package, or --standin's), benchmarks/corpus.py's figures: the per-text
           attend loop, the local engine, and the engine's forwards alone on 2,000 texts. Goals on a GPU:
           >= 50 % of the forwards alone and >= 5x the loop.
  extract  attend_batch 32 x 128 and /api/attention/compact's latency at 128 and 512 tokens (the
           service in process), each against transformers eager + copy to host: benchmarks/extract_device.py's
           gpu_rows. Needs the service's packages (carried as wheels to the lent machine).
  attend   the SmolLM2-shaped Llama at n = 128 / 512 / 2,048: our forward with every map and no hidden
           state, then its maps copied to the host, against LlamaModel (eager, output_attentions) plus
           the same copy, layer by layer: what a viewer waits for on either side.
  gguf     issue 34's rows on the device (gpu_gguf.py): a 1 B GGUF in Q4_K_M's mix kept packed on the
           device, a 128-token attend's dequantizing against its products, the device peak against the
           file + one layer, and transformers' from_pretrained(gguf_file=) beside it.

--quick scales every size down (texts, tokens, repeats) so that `--device cpu --quick` rehearses the whole
script here (2.5 minutes on this 2-core machine under load). Half precision on the CPU: our loader refuses
it there, so bfloat16's network is our float32 one cast (what the loader does on a GPU) and float16 is
skipped; the output says so. --budget (420 s) bounds the sections together; --only runs some of them.

    .venv/bin/python benchmarks/gpu.py --device cpu --quick [--standin .gpu/minilm]   (the rehearsal)
    .venv/bin/python benchmarks/gpu.py --prepare --wheels .whl   (here: fills what a call carries)
    bash benchmarks/gpu.sh                                       (there: ../shared/GPU.md says how)

With $OUT set (the device machine sets it), the rows also go to $OUT/gpu.json (gpu.sh keeps the log there).

The sections live in gpu_parity.py and gpu_speed.py, their frame (rows, the run, the caps, the table) in
gpu_run.py, and what a call carries (the stand-in, the wheels) in gpu_prepare.py.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
# The repository (mha, app) and tests/ (the checkpoint builders) after it: tests/mha must not shadow mha.
for _path in (ROOT, ROOT / "tests"):
    if str(_path) not in sys.path:
        sys.path.append(str(_path))

from gpu_gguf import gguf  # noqa: E402
from gpu_parity import parity  # noqa: E402
from gpu_prepare import install_standin, prepare  # noqa: E402
from gpu_run import OutOfTime, Run, Skipped, table, time_cap  # noqa: E402
from gpu_speed import attend, corpus, extract_rows, trace  # noqa: E402

# (name, function, cap in seconds): in order of value; the caps add up to under 7 minutes with the set-up.
SECTIONS: tuple[tuple[str, Callable[[Run], None], float], ...] = (
    ("parity", parity, 60),
    ("trace", trace, 120),
    ("corpus", corpus, 50),
    ("extract", extract_rows, 40),
    ("attend", attend, 45),
    ("gguf", gguf, 90),
)


def environment(device: torch.device) -> dict[str, Any]:
    import transformers

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None  # a copy of the tree without its .git
    described = (
        torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {os.cpu_count()} cores"
    )
    return {
        "device": described,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "commit": commit,
        "threads": torch.get_num_threads(),
        "tf32": torch.backends.cuda.matmul.allow_tf32,
        "load_average": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda", help="cuda (the lent machine) or cpu (the rehearsal)")
    parser.add_argument("--quick", action="store_true", help="every size scaled down: the rehearsal")
    parser.add_argument("--only", nargs="+", choices=[name for name, _, _ in SECTIONS], help="these sections")
    parser.add_argument("--budget", type=float, default=420.0, help="seconds for all sections together")
    parser.add_argument("--standin", type=Path, help="a folder of MiniLM's tokenizer files: random weights")
    parser.add_argument(
        "--prepare", action="store_true", help="fill --standin (and --wheels) here, then stop"
    )
    parser.add_argument("--wheels", type=Path, help="with --prepare: download the wheels a call carries")
    args = parser.parse_args()
    if args.prepare:
        prepare(args.standin or ROOT / ".gpu" / "minilm", args.wheels)
        return
    import transformers

    from mha.devices import resolve_device

    # Their load reports, progress bars and tokenizer hints would bury the rows.
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", message="Recommended: pip install sacremoses")
    device = resolve_device(args.device)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as scratch:
        run = Run(device, args.quick, Path(scratch))
        if args.standin is not None:
            install_standin(args.standin, run.scratch / "standin")
            run.notes.append("MiniLM is a stand-in: the real tokenizer and config, random weights")
        env = environment(device)
        print(json.dumps(env), flush=True)
        status: dict[str, str] = {}
        for name, section, cap in SECTIONS:
            if args.only and name not in args.only:
                continue
            left = args.budget - (time.monotonic() - started)
            if left < 5:
                status[name] = "not started: the budget was spent"
                continue
            print(f"{name} (cap {min(cap, left):.0f} s)", flush=True)
            begun = time.monotonic()
            run.deadline = begun + min(cap, left)
            try:
                with time_cap(min(cap, left)):
                    section(run)
                status[name] = "done"
            except (OutOfTime, Skipped) as stop:
                status[name] = str(stop)
            except Exception as error:  # a section's failure costs its own rows only
                traceback.print_exc()
                status[name] = f"failed: {type(error).__name__}: {error}"[:300]
            status[name] += f" ({time.monotonic() - begun:.0f} s)"
            print(f"  {status[name]}", flush=True)
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    print(
        f"\n{env['device']}, torch {env['torch']}, transformers {env['transformers']}, commit {env['commit']}"
    )
    print(table(run.rows))
    for name, said in status.items():
        print(f"{name}: {said}")
    for note in run.notes:
        print(f"note: {note}")
    print(f"total {time.monotonic() - started:.0f} s")
    out = os.environ.get("OUT")
    if out:
        document = {**env, "quick": args.quick, "sections": status, "notes": run.notes}
        document["rows"] = [asdict(row) for row in run.rows]
        (Path(out) / "gpu.json").write_text(json.dumps(document, indent=1))


if __name__ == "__main__":
    main()
