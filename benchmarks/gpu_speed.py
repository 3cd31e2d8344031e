"""benchmarks/gpu.py's speed sections, each beside its reference: the trace against the blind forward, the
corpus engine against its forwards alone, attend_batch and the compact first view (extract_device.py), and
attend at SmolLM2's shape against transformers eager (gpu.py's docstring says what each row is).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from functools import partial

import torch
from gpu_run import Row, Run, peak_added_mib
from timing import interleaved


def medians(run: Run, runs: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """name -> median seconds of interleaved calls on the run's device, after one warm-up each."""
    return {name: t.median for name, t in interleaved(runs, repeats, device=run.device).items()}


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
            times = medians(run, {"trace": traced, "blind": partial(blind_forward, network, ids)}, repeats)
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


def extract_rows(run: Run) -> None:
    """benchmarks/extract_device.py's gpu_rows: rows as dicts of Row's fields but the section."""
    from extract_device import gpu_rows

    for row in gpu_rows(device=str(run.device), quick=run.quick):
        run.add(Row(**{"section": "extract", **row}))


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
        times = medians(run, {"ours": partial(ours, ids), "theirs": partial(eager, ids)}, repeats)
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
