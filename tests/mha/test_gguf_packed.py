"""A GGUF's quantized matrices stay as their ggml blocks (mha.loading.gguf.packed) and still give exactly
transformers' attention and greedy continuation from the same file, for every ggml type transformers
dequantizes (and Q5_0, Q5_1, which gguf's numpy dequantizer reads), in the dtype the model is cast to,
with or without dequantized layers kept between forwards; what reads a layer's weight (value norms, head
effects) works on them, and a block whose float16 scale is NaN or infinite is refused at load.

The files are a 2-layer Llama whose rows are 256 values long (the K and IQ types' block), every matrix in
one type: gguf-py quantizes the legacy types, the others are raw blocks whose every byte is below 0x20, so
each float16 scale field is finite (tests/gguf_files.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gguf_files import assert_attends_as, transformers_of, write_gguf
from tolerances import FORWARD, U32

from mha import load_pretrained
from mha.errors import CheckpointNotFoundError
from mha.loading.gguf import folders as cache
from mha.loading.gguf.packed import PackedEmbedding, PackedLinear

TEXT = "The cat sat on the mat. The dog sat on the log."
NEW_TOKENS = 6


def _every_type() -> list[str]:
    """The ggml types transformers' torch dequantizer knows, and the two only gguf's numpy one does."""
    from transformers.integrations.gguf.dequant import GGML_NAME

    return sorted(GGML_NAME.values()) + ["Q5_0", "Q5_1"]


@pytest.fixture(autouse=True)
def session_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path_factory.getbasetemp() / "headscope-cache"))


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from checkpoints import build_long_llama

    root = tmp_path_factory.mktemp("packed-source")
    return build_long_llama(root / "llama256", layers=2, hidden_size=256, intermediate_size=256)


def _file(source: Path, root: Path, qtype: str) -> Path:
    (root / qtype).mkdir(parents=True, exist_ok=True)
    return write_gguf(source, root / qtype / f"tiny-{qtype}.gguf", qtype=qtype)


@pytest.mark.parametrize("qtype", _every_type())
def test_every_type_stays_packed_and_equals_transformers(qtype: str, source: Path, tmp_path: Path) -> None:
    from gguf import GGMLQuantizationType

    file = _file(source, tmp_path, qtype)
    ours = load_pretrained(file, device="cpu")
    kind = int(GGMLQuantizationType[qtype])
    layer = ours.network.layers[0]
    for linear in (layer.attn.in_proj, layer.attn.out_proj, layer.ffn.fc_in, layer.ffn.fc_out):
        assert isinstance(linear, PackedLinear) and set(linear.kinds) == {kind}
    assert isinstance(ours.network.embeddings.token, PackedEmbedding)

    theirs, tokenizer = transformers_of(file)
    # The same blocks dequantized on both sides (transformers' torch code or gguf's numpy code here, gguf's
    # numpy code there), each value d·q + m in float32 either way: only the order of the forward's float32
    # sums differs (FORWARD).
    ids = assert_attends_as(ours, theirs, tokenizer, TEXT, FORWARD)
    continued = ours.attend(TEXT, max_new_tokens=NEW_TOKENS)
    with torch.no_grad():
        generated = theirs.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=NEW_TOKENS)[0]
    assert continued.token_ids == generated.tolist()


def test_the_kept_layers_change_no_value_and_stay_in_the_budget(source: Path, tmp_path: Path) -> None:
    file = _file(source, tmp_path, "Q4_K")
    kept = load_pretrained(file, device="cpu")
    none = load_pretrained(file, device="cpu", dequant_cache_bytes=0)
    small = load_pretrained(file, device="cpu", dequant_cache_bytes=256 * 256 * 4 * 3)
    first = kept.attend(TEXT).attentions
    assert torch.equal(kept.attend(TEXT).attentions, first)  # the second forward reads the kept layers
    assert torch.equal(none.attend(TEXT).attentions, first)
    assert torch.equal(small.attend(TEXT).attentions, first)
    packed = [m for m in kept.network.modules() if isinstance(m, PackedLinear)]
    assert all(m._kept is not None for m in packed)
    assert not any(m._kept is not None for m in none.network.modules() if isinstance(m, PackedLinear))
    budget = next(m for m in small.network.modules() if isinstance(m, PackedLinear)).budget
    assert 0 < budget.used <= budget.limit


def test_a_dtype_or_device_move_and_what_reads_a_weight_work_on_blocks(source: Path, tmp_path: Path) -> None:
    file = _file(source, tmp_path, "Q6_K")
    model = load_pretrained(file, device="cpu")
    in_proj = model.network.layers[0].attn.in_proj
    assert isinstance(in_proj, PackedLinear)
    full = in_proj.weight
    blocks = in_proj._buffers["blocks0"]
    model.network.half()  # as cast_network does on a GPU: the blocks stay, the weight follows the dtype
    assert in_proj._buffers["blocks0"] is blocks and in_proj.weight.dtype == torch.float16
    assert torch.equal(in_proj.weight, full.half())
    model.network.float()
    assert torch.equal(in_proj.weight, full)
    with_norms = model.attend(TEXT, norms=True)  # value norms read out_proj's weight
    assert with_norms.norms is not None and torch.isfinite(with_norms.norms).all()
    effects = model.head_effects(TEXT)  # head ablation
    assert torch.isfinite(effects.effects).all()


def test_a_nan_scale_is_refused_at_load(source: Path, tmp_path: Path) -> None:
    from gguf import GGUFReader

    file = _file(source, tmp_path, "Q8_0")
    tensor = next(t for t in GGUFReader(file).tensors if t.name == "blk.1.attn_v.weight")
    data = bytearray(file.read_bytes())
    at = int(tensor.data_offset) + 34 * 3  # the fourth block's float16 scale (Q8_0: 2 + 32 bytes a block)
    data[at : at + 2] = b"\x00\x7e"  # a float16 NaN
    file.write_bytes(bytes(data))
    with pytest.raises(CheckpointNotFoundError, match=r"layers\.1\.self_attn\.v_proj\.weight holds 1 NaN"):
        load_pretrained(file, device="cpu")


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_the_cpus_small_chunks_give_the_values_of_one_chunk(
    qtype: str, source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the CPU a matrix dequantizes in chunks of rows small enough to stay in cache (_CPU_CHUNK_VALUES):
    bit for bit the values of the whole matrix at once, the rotary rows' order (a gather per chunk) and a
    last, shorter chunk included; eager unless compiling is asked for; and the forward's product, chunk by
    chunk, is the whole weight's up to the order of its sums."""
    from mha.loading.gguf import packed as gguf_packed

    model = load_pretrained(_file(source, tmp_path, qtype), device="cpu", dequant_cache_bytes=0)
    packed = [m for m in model.network.modules() if isinstance(m, PackedLinear)]
    assert packed and not any(m.budget.compiled for m in packed)
    ordered = [
        m for m in packed if any(name.startswith("order") and b is not None for name, b in m.named_buffers())
    ]
    assert ordered  # q and k: llama.cpp permuted their rows
    layers = [ordered[0], packed[-1]]
    monkeypatch.setattr(gguf_packed, "_CPU_CHUNK_VALUES", 1 << 40)
    whole = [m.weight for m in layers]
    monkeypatch.setattr(gguf_packed, "_CPU_CHUNK_VALUES", 3 * 256)  # 3 rows of 256 columns a chunk
    assert all(m.weight.shape[0] % 3 for m in layers)  # the last chunk is a shorter one
    for layer, expected in zip(layers, whole, strict=True):
        assert torch.equal(layer.weight, expected)
    # A layer not kept multiplies each chunk as it comes and never makes the whole weight. Against one
    # product with the whole weight only the order of each output's float32 sum of k terms can differ
    # (another kernel for a 3-row chunk): each sum is within gamma_k·Σ|x·w| of the exact one (Higham's bound).
    generator = torch.Generator().manual_seed(0)
    for layer, weight in zip(layers, whole, strict=True):
        assert layer._kept is None
        x = torch.randn(5, layer.in_features, generator=generator)
        k = layer.in_features
        bound = 2 * k * U32 / (1 - k * U32) * (x.abs() @ weight.abs().T)  # 2 gamma_k: one per side
        assert ((layer(x) - torch.nn.functional.linear(x, weight)).abs() <= bound).all()


def test_the_compiled_dequantizer_gives_the_same_attention(
    source: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """dequant_compile=True: transformers' dequantizer under torch.compile, bit for bit the eager one's
    values for Q4_0 (each value is (q - 8) * d, one float32 product of exact operands, rounded once either
    way), so the same attention; where inductor cannot compile (no C++ compiler) the eager code runs and
    says so once."""
    import shutil

    from mha.loading.gguf import packed as gguf_packed

    file = _file(source, tmp_path, "Q4_0")
    eager = load_pretrained(file, device="cpu", dequant_cache_bytes=0, dequant_compile=False)
    compiled = load_pretrained(file, device="cpu", dequant_cache_bytes=0, dequant_compile=True)
    assert next(m for m in compiled.network.modules() if isinstance(m, PackedLinear)).budget.compiled
    with caplog.at_level("WARNING", logger=gguf_packed.__name__):
        attentions = compiled.attend(TEXT).attentions
    assert torch.equal(attentions, eager.attend(TEXT).attentions)
    ran = gguf_packed._COMPILED[(2, "cpu")]  # Q4_0's
    if shutil.which("c++") or shutil.which("g++"):
        assert ran is not None, caplog.text
    else:
        assert ran is None and "runs uncompiled" in caplog.text
