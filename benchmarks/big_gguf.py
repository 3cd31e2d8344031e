"""GGUF files of the sizes people run, kept quantized (issue 34 item 6): Llama-shaped files of random ggml
blocks in Q4_K_M's mix (Q4_K; Q6_K for attn_v, ffn_down and the output), loaded by ours and, where its
float32 copy fits, by transformers' from_pretrained(gguf_file=...), on the CPU.

  1b  16 layers, width 2048, feed-forward 8192, 32 query / 8 key-value heads, 128,256 tokens (~0.9 GB)
  8b  Llama 3 8B: 32 layers, 4096, 14336, 32 / 8 heads, 128,256 tokens (~4.9 GB; --sizes 1b,8b: writing
      it takes minutes and 5 GB of disk, and one forward dequantizes 7.5 G weights)
  tiny  2 layers, 256, 512, 4 / 2 heads, 1,000 tokens: a rehearsal of the script, in seconds

Printed for each, each figure in a fresh process (so its peak resident memory, VmHWM, is its own):
  first load     an empty HEADSCOPE_CACHE_DIR: the header hashed, config, names and tokenizer read once
  cached load    the same cache: nothing but the header read before the forward
  attend 128     two 128-token attends after the cached load, each split into the time spent dequantizing
                 (gguf_packed.dequantize) and the rest (the matrix products, attention, norms); with
                 HEADSCOPE_DEQUANT_CACHE_BYTES' default, and with 0 (every layer dequantized each
                 forward), eager (the default) and compiled (HEADSCOPE_DEQUANT_COMPILE: the first forward
                 compiles each type, or reads inductor's disk cache)
  products only  the same attend with every layer kept dequantized (a budget the size of the float32
                 model), where that fits in memory (1b): what the matrix products cost alone, the
                 reference dequantizing is held to, in its own process and then interleaved with budget 0
                 in one (best of 4 each); for 8b (26 GiB of float32) each forward's own rest
  peak RSS       beside the goals: 1b <= file + 1.5 GiB, 8b <= 8 GB
  transformers   from_pretrained(gguf_file=...) (float32, every tensor dequantized at load) and its eager
                 forward with output_attentions at 128 tokens, where 4 bytes a weight fit in memory
and the routes for the dequantizing itself, per type of the mix on a 1 B layer's shapes: transformers' torch
code, the same under torch.compile, and against them the 128-token product.

    .venv/bin/python benchmarks/big_gguf.py [--sizes 1b] [--folder /tmp] [--keep] [--no-theirs]

The files are deleted at the end unless --keep. Check `df -h` and free memory first: the 8b file is 4.9 GB.
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

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
Q4_K, Q6_K = 12, 14  # ggml type ids
SIZES = {
    "1b": {"layers": 16, "width": 2048, "ffn": 8192, "heads": 32, "kv_heads": 8, "vocab": 128_256},
    "8b": {"layers": 32, "width": 4096, "ffn": 14_336, "heads": 32, "kv_heads": 8, "vocab": 128_256},
    # A rehearsal (gpu_gguf.py --quick): the same mix in a second, 2 layers and a small vocabulary.
    "tiny": {"layers": 2, "width": 256, "ffn": 512, "heads": 4, "kv_heads": 2, "vocab": 1000},
}
TOKENS = 128
TEXT = " ".join(["the quick brown fox jumps over the lazy dog"] * 40)


def layer_float_bytes(size: str) -> int:
    """One layer's matrices in float32: q and o (width x width), k and v (the key-value heads' rows), the
    feed-forward's gate, up and down."""
    shape = SIZES[size]
    width, kv_rows = shape["width"], shape["width"] * shape["kv_heads"] // shape["heads"]
    return 4 * width * (2 * width + 2 * kv_rows + 3 * shape["ffn"])


def write_file(path: Path, size: str) -> None:
    """A Llama GGUF of random blocks in Q4_K_M's mix, streamed tensor by tensor (never all in memory)."""
    import gguf

    shape = SIZES[size]
    width, ffn, heads, kv = shape["width"], shape["ffn"], shape["heads"], shape["kv_heads"]
    head_dim = width // heads
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"random-llama-{size}")
    writer.add_block_count(shape["layers"])
    writer.add_context_length(8192)
    writer.add_embedding_length(width)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(500_000.0)
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(shape["vocab"])
    # A byte-level BPE of the model's vocabulary size: the 256 byte tokens, one merge, then fillers
    alphabet = (
        [chr(c) for c in range(33, 127)]
        + [chr(c) for c in range(161, 173)]
        + [chr(c) for c in range(174, 256)]
    )
    alphabet += [chr(256 + i) for i in range(256 - len(alphabet))]
    tokens = [*alphabet, "th"] + [f"<f{i}>" for i in range(shape["vocab"] - len(alphabet) - 1)]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.NORMAL] * len(tokens))
    writer.add_token_merges(["t h"])
    writer.add_bos_token_id(len(tokens) - 2)
    writer.add_eos_token_id(len(tokens) - 1)

    matrices = [("token_embd.weight", shape["vocab"], width, Q4_K)]
    for i in range(shape["layers"]):
        matrices += [
            (f"blk.{i}.attn_q.weight", width, width, Q4_K),
            (f"blk.{i}.attn_k.weight", kv * head_dim, width, Q4_K),
            (f"blk.{i}.attn_v.weight", kv * head_dim, width, Q6_K),
            (f"blk.{i}.attn_output.weight", width, width, Q4_K),
            (f"blk.{i}.ffn_gate.weight", ffn, width, Q4_K),
            (f"blk.{i}.ffn_up.weight", ffn, width, Q4_K),
            (f"blk.{i}.ffn_down.weight", width, ffn, Q6_K),
        ]
    matrices.append(("output.weight", shape["vocab"], width, Q6_K))
    norms = [f"blk.{i}.{n}.weight" for i in range(shape["layers"]) for n in ("attn_norm", "ffn_norm")]
    norms.append("output_norm.weight")
    for name, rows, columns, kind in matrices:
        elements, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(kind)]
        row_bytes = columns // elements * nbytes
        writer.add_tensor_info(
            name, (rows, row_bytes), np.dtype(np.uint8), rows * row_bytes, gguf.GGMLQuantizationType(kind)
        )
    for name in norms:
        writer.add_tensor_info(name, (width,), np.dtype(np.float32), 4 * width)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    generator = np.random.default_rng(0)
    for _name, rows, columns, kind in matrices:
        elements, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(kind)]
        # Every byte below 0x20: each float16 scale field is finite and small (tests/gguf_files.py)
        writer.write_tensor_data(
            generator.integers(0, 0x20, (rows, columns // elements * nbytes), dtype=np.uint8)
        )
    for _ in norms:
        writer.write_tensor_data(np.ones(width, dtype=np.float32))
    writer.close()


CHILD = r"""
import json, os, sys, time
start = time.perf_counter()
import torch
from mha import load_pretrained
from mha.loading.gguf import packed as gguf_packed
spent = [0.0]
dequantize = gguf_packed.dequantize  # every chunk of every packed layer, kept or multiplied as it comes
def timed(*args, **options):
    began = time.perf_counter()
    values = dequantize(*args, **options)
    spent[0] += time.perf_counter() - began
    return values
gguf_packed.dequantize = timed
FILE, BUDGET, TEXT, N, COMPILE = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
budget = None if BUDGET == "default" else int(BUDGET)
options = {} if COMPILE == "auto" else {"dequant_compile": COMPILE == "1"}  # auto: load_pretrained's default
began = time.perf_counter()
model = load_pretrained(FILE, device="cpu", dequant_cache_bytes=budget, **options)
loaded = time.perf_counter() - began
out = {"load": loaded, "process": time.perf_counter() - start}
packed = [m for m in model.network.modules() if isinstance(m, gguf_packed.PackedLinear)]
out["compiled"] = packed[0].budget.compiled
if N:
    for run in ("first", "second"):
        spent[0] = 0.0
        began = time.perf_counter()
        model.attend(TEXT, max_tokens=N, hidden_state=False)
        out[run] = time.perf_counter() - began
        out[run + "_dequant"] = spent[0]
status = open("/proc/self/status").read().split("\n")
out["hwm"] = next(int(l.split()[1]) for l in status if l.startswith("VmHWM")) / 1024
print(json.dumps(out))
"""

INTERLEAVED = r"""
import json, sys, time
from mha import load_pretrained
FILE, TEXT, N = sys.argv[1], sys.argv[2], int(sys.argv[3])
models = {
    "none": load_pretrained(FILE, device="cpu", dequant_cache_bytes=0),
    "kept": load_pretrained(FILE, device="cpu", dequant_cache_bytes=1 << 40),
}
out = {name: [] for name in models}
for round in range(5):  # the first warms each up (and fills the kept one's layers): not counted
    for name, model in models.items():
        began = time.perf_counter()
        model.attend(TEXT, max_tokens=N, hidden_state=False)
        if round:
            out[name].append(time.perf_counter() - began)
print(json.dumps(out))
"""

THEIRS = r"""
import json, sys, time
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
FILE, TEXT, N = sys.argv[1], sys.argv[2], int(sys.argv[3])
folder, name = FILE.rsplit("/", 1)
began = time.perf_counter()
model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, attn_implementation="eager").eval()
tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
out = {"load": time.perf_counter() - began}
ids = tokenizer(TEXT, truncation=True, max_length=N, return_tensors="pt")
for run in ("first", "second"):
    began = time.perf_counter()
    with torch.no_grad():
        model.model(**ids, output_attentions=True)
    out[run] = time.perf_counter() - began
status = open("/proc/self/status").read().split("\n")
out["hwm"] = next(int(l.split()[1]) for l in status if l.startswith("VmHWM")) / 1024
print(json.dumps(out))
"""


def child(script: str, *args: str, cache: str) -> dict[str, float]:
    env = {**os.environ, "HEADSCOPE_CACHE_DIR": cache, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"a child failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def dequant_routes(repeats: int = 5) -> None:
    """The dequantizing routes, per type of Q4_K_M's mix, on the shapes of a 1 B layer's matrices: our
    PackedLinear's path (Blocks.dequantize_into) eager in the CPU's chunks (_CPU_CHUNK_VALUES), eager in
    chunks of 2^23 values (the GPU's, and the CPU's before: their passes leave the cache), and under
    torch.compile, against the 128-token product with the same matrix; interleaved, the best of `repeats`."""
    import torch
    from transformers.integrations.gguf.dequant import GGML_BLOCK

    from mha.loading.gguf import packed as gguf_packed
    from mha.loading.gguf.packed import Blocks

    small = gguf_packed._CPU_CHUNK_VALUES

    def timed(call: object, chunk: int = small) -> float:
        gguf_packed._CPU_CHUNK_VALUES = chunk
        try:
            began = time.perf_counter()
            call()  # type: ignore[operator]
            return time.perf_counter() - began
        finally:
            gguf_packed._CPU_CHUNK_VALUES = small

    print(
        f"\n| matrix | type | eager, 2^{small.bit_length() - 1} a chunk | eager, 2^23 a chunk "
        "| compiled (compile s) | 128-token product | eager / product | compiled / product |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for kind, rows, columns, what in ((Q4_K, 8192, 2048, "ffn_up"), (Q6_K, 2048, 8192, "ffn_down")):
        data = torch.randint(0, 0x20, (rows, columns // 256 * GGML_BLOCK[kind][1]), dtype=torch.uint8)
        blocks = Blocks(data, kind, (rows, columns))
        out = torch.empty(rows, columns)
        x = torch.randn(TOKENS, columns)
        compiling = timed(lambda: blocks.dequantize_into(out, compiled=True))  # noqa: B023 - compiles the type
        fill = lambda: blocks.dequantize_into(out)  # noqa: B023, E731 - called within the iteration
        routes = {  # each route's call, and the chunk it runs in
            "eager": (fill, small),
            "large": (fill, 1 << 23),
            "compiled": (lambda: blocks.dequantize_into(out, compiled=True), small),  # noqa: B023
            "product": (lambda: x @ out.T, small),  # noqa: B023
        }
        best = dict.fromkeys(routes, float("inf"))
        for _ in range(repeats + 1):  # the first round warms each route up, and counts only if the best
            for route, (call, chunk) in routes.items():
                best[route] = min(best[route], timed(call, chunk))
        name = {Q4_K: "Q4_K", Q6_K: "Q6_K"}[kind]
        eager, large, fast, product = best["eager"], best["large"], best["compiled"], best["product"]
        print(
            f"| {what} {rows} x {columns} | {name} | {eager * 1000:.0f} ms | {large * 1000:.0f} ms "
            f"| {fast * 1000:.0f} ms ({compiling:.0f}) | {product * 1000:.0f} ms | {eager / product:.2f} "
            f"| {fast / product:.2f} |",
            flush=True,
        )
    print(
        "A product read from the blocks: transformers' GgufLinear.mul_mat_vec needs the ggml-org hub kernel "
        "(CUDA/Metal, fetched from the network): none on this CPU",
        flush=True,
    )


def measure(size: str, path: Path, file_mib: float, cache: str) -> None:
    """Our loads and attends, each row printed as its child ends (an 8 B run takes long)."""
    first = child(CHILD, str(path), "default", TEXT, "0", "auto", cache=cache)
    cached = child(CHILD, str(path), "default", TEXT, str(TOKENS), "auto", cache=cache)
    print(
        f"load: first {first['load']:.1f} s (process {first['process']:.1f} s, peak RSS {first['hwm']:,.0f} "
        f"MiB), cached {cached['load']:.1f} s (process {cached['process']:.1f} s)",
        flush=True,
    )
    goal = 8000 / 1.048576 if size == "8b" else file_mib + 1536
    print("| attend 128 tokens | forward | dequantizing | the rest | peak RSS MiB | goal MiB |")
    print("|---|---|---|---|---|---|", flush=True)

    def row(label: str, got: dict[str, float]) -> None:
        for which in ("first", "second"):
            rest = got[which] - got[which + "_dequant"]
            print(
                f"| {label}, {which} | {got[which]:.1f} s | {got[which + '_dequant']:.1f} s "
                f"| {rest:.1f} s | {got['hwm']:,.0f} | {goal:,.0f} |",
                flush=True,
            )

    row(f"default (768 MiB kept, {'compiled' if cached['compiled'] else 'eager'})", cached)
    eager = child(CHILD, str(path), "0", TEXT, str(TOKENS), "0", cache=cache)
    row("budget 0, eager", eager)
    compiled = child(CHILD, str(path), "0", TEXT, str(TOKENS), "1", cache=cache)
    row("budget 0, compiled", compiled)
    floats = SIZES[size]["layers"] * layer_float_bytes(size)
    if floats < 0.6 * _available():
        every = child(CHILD, str(path), str(1 << 40), TEXT, str(TOKENS), "0", cache=cache)
        row("every layer kept", every)
        for label, got in (("eager", eager), ("compiled", compiled)):
            ratio = got["second_dequant"] / every["second"]
            cost = (got["second"] - every["second"]) / every["second"]
            print(
                f"dequantizing / products, {label} (budget 0 / every layer kept, second forwards): "
                f"{ratio:.2f} in the dequantizer; {cost:.2f} in what the forward takes longer"
            )
        # Each row above is one process at one moment; a shared machine's pace drifts between them.
        got = child(INTERLEAVED, str(path), TEXT, str(TOKENS), cache=cache)
        none, kept = min(got["none"]), min(got["kept"])
        print(
            f"interleaved in one process, best of {len(got['none'])}: budget 0 eager {none:.2f} s, every "
            f"layer kept {kept:.2f} s; the forward takes {(none - kept) / kept:.2f}x the kept forward longer "
            f"(products, attention and norms: the products alone are less, so their ratio is a little higher)"
        )
    else:  # 26 GiB of float32 for 8 B: each forward's own rest (products, attention, norms) stands in
        for label, got in (("eager", eager), ("compiled", compiled)):
            ratio = got["second_dequant"] / (got["second"] - got["second_dequant"])
            print(
                f"dequantizing / the rest of the same forward, {label} (budget 0, second forward; the "
                f"{floats / 2**30:.0f} GiB float32 model does not fit; the rest is more than the products, "
                f"so the products' ratio is higher): {ratio:.2f}"
            )


def _available() -> int:
    """MemAvailable, bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable"):
            return int(line.split()[1]) * 1024
    return 0


def run(size: str, folder: Path, *, theirs: bool, keep: bool) -> None:
    import hashlib

    from mha.loading.gguf import header_digest

    path = folder / f"random-llama-{size}.gguf"
    began = time.perf_counter()
    reused = path.exists()  # one --keep left: the same bytes (seed 0)
    if not reused:
        write_file(path, size)
    file_mib = path.stat().st_size / 2**20
    how = "reused" if reused else f"written in {time.perf_counter() - began:.0f} s"
    print(f"\n== {size}: {path} {file_mib:,.0f} MiB, {how}", flush=True)
    began = time.perf_counter()
    with path.open("rb") as f:
        hashlib.file_digest(f, "sha256")
    whole = time.perf_counter() - began
    began = time.perf_counter()
    header_digest(path)
    print(
        f"SHA-256 of the whole file {whole:.1f} s ({file_mib / whole:,.0f} MiB/s); of its header "
        f"{(time.perf_counter() - began) * 1000:.0f} ms (what the cache is keyed by)"
    )
    try:
        with tempfile.TemporaryDirectory() as cache:
            measure(size, path, file_mib, cache)
        if theirs:
            got = child(THEIRS, str(path), TEXT, str(TOKENS), cache="")
            print(
                f"transformers: load {got['load']:.1f} s, "
                f"forward {got['first']:.1f} / {got['second']:.1f} s, peak RSS {got['hwm']:,.0f} MiB"
            )
    finally:
        if not keep:
            path.unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1b", help="comma-separated: 1b, 8b, tiny")
    parser.add_argument("--folder", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--keep", action="store_true", help="keep the written files")
    parser.add_argument("--no-theirs", action="store_true", help="skip transformers")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    dequant_routes()
    for size in args.sizes.split(","):
        theirs = not args.no_theirs and size != "8b"  # 8b in float32: 32 GB
        run(size, args.folder, theirs=theirs, keep=args.keep)


if __name__ == "__main__":
    main()
