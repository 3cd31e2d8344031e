"""benchmarks/gpu.py's gguf section: issue 34 item 6's rows on the device. A Llama-shaped GGUF of random
blocks in Q4_K_M's mix (benchmarks/big_gguf.py's 1 B file; --quick: a 2-layer one), loaded on the device
with its blocks kept packed there:
  load       load_pretrained's first load (config, names and tokenizer read by transformers)
  attend     a 128-token attend with every layer dequantized each forward (budget 0: the blocks are
             dequantized on the device, timed with a synchronize around each), against the same attend
             with every layer kept dequantized (the products alone): goal dequantizing <= the products
  memory     the device peak of the budget-0 attend against the file's size + one layer in float32
  theirs     transformers' from_pretrained(gguf_file=...) (float32, dequantized at load, on the CPU)
             moved to the device, its eager forward with output_attentions at 128 tokens
Each after a warm-up forward, second of two.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from big_gguf import TEXT, TOKENS, layer_float_bytes, write_file
from gpu_run import MiB, Row, Run
from timing import synchronize


def gguf(run: Run) -> None:
    from mha import load_pretrained
    from mha.loading.gguf import packed as gguf_packed

    size = "tiny" if run.quick else "1b"
    path = run.scratch / f"random-llama-{size}.gguf"
    write_file(path, size)
    file_mib = path.stat().st_size / MiB
    spent = [0.0]
    dequantize = gguf_packed.dequantize  # every chunk of every packed layer

    def timed(*args: Any, **options: Any) -> torch.Tensor:
        synchronize(run.device)
        began = time.perf_counter()
        values = dequantize(*args, **options)
        synchronize(run.device)
        spent[0] += time.perf_counter() - began
        return values

    def attend(model: object) -> tuple[float, float]:
        """(forward s, dequantizing s) of the second of two 128-token attends."""
        for _ in range(2):
            spent[0] = 0.0
            synchronize(run.device)
            began = time.perf_counter()
            model.attend(TEXT, max_tokens=TOKENS, hidden_state=False)  # type: ignore[attr-defined]
            synchronize(run.device)
            forward = time.perf_counter() - began
        return forward, spent[0]

    gguf_packed.dequantize = timed
    try:
        began = time.perf_counter()
        model = load_pretrained(path, device=run.device, dequant_cache_bytes=0)
        loaded = time.perf_counter() - began
        run.add(Row("gguf", f"{size} Q4_K_M mix, first load", f"{loaded:.1f} s", f"file {file_mib:,.0f} MiB"))
        if run.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(run.device)
        forward, dequantizing = attend(model)
        peak = torch.cuda.max_memory_allocated(run.device) / MiB if run.device.type == "cuda" else None
        del model
        kept = load_pretrained(path, device=run.device, dequant_cache_bytes=1 << 40)
        products, _ = attend(kept)
        del kept
    finally:
        gguf_packed.dequantize = dequantize
    run.add(
        Row(
            "gguf",
            f"{size} attend {TOKENS}, every layer dequantized: dequantizing",
            f"{dequantizing:.2f} s of {forward:.2f} s",
            f"every layer kept (products) {products:.2f} s",
            dequantizing / products,
            "goal <= 1",
            {"forward_s": forward, "dequantizing_s": dequantizing, "products_s": products},
        )
    )
    layer_mib = layer_float_bytes(size) / MiB
    if peak is not None:
        run.add(
            Row(
                "gguf",
                f"{size} attend {TOKENS}: device peak",
                f"{peak:,.0f} MiB",
                f"file + one layer in float32 {file_mib + layer_mib:,.0f} MiB",
                peak / (file_mib + layer_mib),
            )
        )
    theirs_forward(run, path, size)


def theirs_forward(run: Run, path: Path, size: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(path.parent), path.name
    began = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, attn_implementation="eager")
    model = model.eval().to(run.device)
    loaded = time.perf_counter() - began
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    ids = tokenizer(TEXT, truncation=True, max_length=TOKENS, return_tensors="pt").to(run.device)
    for _ in range(2):
        synchronize(run.device)
        began = time.perf_counter()
        with torch.no_grad():
            model.model(**ids, output_attentions=True)
        synchronize(run.device)
        forward = time.perf_counter() - began
    run.add(
        Row(
            "gguf",
            f"{size} transformers from_pretrained(gguf_file=)",
            f"load {loaded:.1f} s",
            f"forward {forward:.2f} s",
            note="float32, dequantized at load",
        )  # fmt: skip
    )
