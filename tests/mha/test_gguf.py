"""GGUF files load into our layers and give exactly transformers' attention from the same file.

Small GGUF files are written here (tests/gguf_files.py, gguf's GGUFWriter) from the tiny random
checkpoints of tests/checkpoints.py, whose norm weights and biases are drawn away from 1 and 0, so a
forgotten one fails parity. The reference is transformers reading the same file
(AutoModelForCausalLM.from_pretrained(dir, gguf_file=..., attn_implementation="eager")), fed what its own
GGUF tokenizer gives.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf_files import assert_attends_as, build_gpt2, build_qwen3, transformers_of, write_gguf
from tolerances import FORWARD

from mha import AttentionModel, load_pretrained
from mha.errors import (
    CheckpointMismatchError,
    CheckpointNotFoundError,
    UnsupportedCheckpointError,
)
from mha.loading import gguf
from mha.loading.checkpoint import check_checkpoint
from mha.loading.gguf import CACHE_KIND, supported_architectures
from mha.loading.gguf import folders as cache
from mha.loading.gguf.packed import PackedLinear
from mha.loading.pretrained import checkpoint_architecture

TEXTS = ("The cat sat on the mat. The dog sat on the log.", "Ünïcödé: naïve café, 東京 🙂 and 12345.")
# The three families the issue names in the three formats; the others in one quantized format each
PARITY = [(family, q) for family in ("llama", "qwen2", "gemma2") for q in ("F32", "F16", "Q8_0")] + [
    ("mistral", "Q8_0"),
    ("phi3", "Q8_0"),
    ("qwen3", "Q8_0"),
    ("gemma3", "Q8_0"),
    ("gpt2", "Q8_0"),
]
# Every type gguf dequantizes that llama.cpp writes for weights, one per matrix of a 2-layer Llama whose
# rows are 256 values long (the K types' block): token_embd, 7 matrices a layer, output
QUANT_TYPES = (
    "F32",
    "F16",
    "BF16",
    "Q8_0",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
)


@pytest.fixture(autouse=True)
def session_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """One cache folder for the session's conversions, never the user's."""
    folder = tmp_path_factory.getbasetemp() / "headscope-cache"
    monkeypatch.setenv(cache.CACHE_ENV, str(folder))
    yield folder


@pytest.fixture(scope="session")
def sources(tiny_checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """family -> tiny checkpoint directory, with the GGUF-loadable Qwen3 and GPT-2 of gguf_files."""
    root = tmp_path_factory.mktemp("gguf-sources")
    return tiny_checkpoints | {"qwen3": build_qwen3(root / "qwen3"), "gpt2": build_gpt2(root / "gpt2")}


def _written(sources: dict[str, Path], root: Path, family: str, qtype: str, **options: object) -> Path:
    folder = root / f"{family}-{qtype}"
    folder.mkdir(parents=True, exist_ok=True)
    return write_gguf(sources[family], folder / f"tiny-{family}.gguf", qtype=qtype, **options)  # type: ignore[arg-type]


def _check_parity(ours: AttentionModel, file: Path) -> None:
    theirs, tokenizer = transformers_of(file)
    for text in TEXTS:
        # Both hold the same dequantized float32 weights: only the order of float32 sums differs (FORWARD).
        assert_attends_as(ours, theirs, tokenizer, text, FORWARD)
    if tokenizer.chat_template:  # the chat template survives the conversion and the cache
        message = [{"role": "user", "content": TEXTS[0]}]
        rendered = tokenizer.apply_chat_template(message, tokenize=False, add_generation_prompt=True)
        assert ours.info.chat_template
        assert ours.attend(TEXTS[0], chat=True).texts[0] == rendered


@pytest.mark.parametrize(("family", "qtype"), PARITY)
def test_attention_equals_transformers_from_the_same_file(
    family: str, qtype: str, sources: dict[str, Path], tmp_path: Path
) -> None:
    file = _written(sources, tmp_path, family, qtype)
    ours = load_pretrained(file, device="cpu")
    # llama.cpp writes Mistral as a Llama, and transformers reads it so
    assert ours.info.family == ("llama" if family == "mistral" else family)
    assert ours.info.name == file.stem
    _check_parity(ours, file)


def test_every_quantization_type_dequantizes(tmp_path: Path) -> None:
    from checkpoints import build_long_llama

    source = build_long_llama(tmp_path / "llama256", layers=2, hidden_size=256, intermediate_size=256)
    names = ["token_embd", "output"] + [
        f"blk.{i}.{m}"
        for i in range(2)
        for m in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
    ]
    types = {f"{name}.weight": QUANT_TYPES[i % len(QUANT_TYPES)] for i, name in enumerate(names)}
    (tmp_path / "mixed").mkdir()
    file = write_gguf(source, tmp_path / "mixed" / "mixed.gguf", types=types)
    ours = load_pretrained(file, device="cpu")
    cached = gguf.cached_directory(file)
    assert cached is not None
    written = json.loads((cached / "gguf.json").read_text())["tensor_types"]
    assert set(written) == set(QUANT_TYPES)
    assert all(torch.isfinite(p).all() for p in ours.network.parameters())
    # q, k and v of another type each (BF16 values, Q8_0 and Q4_0 blocks in layer 0): one fused projection
    in_proj = ours.network.layers[0].attn.in_proj
    assert isinstance(in_proj, PackedLinear) and len(set(in_proj.kinds)) == 3
    assert all(torch.isfinite(m.weight).all() for m in ours.network.modules() if isinstance(m, PackedLinear))
    _check_parity(ours, file)


def test_a_directory_holding_one_gguf_loads_under_its_name(sources: dict[str, Path], tmp_path: Path) -> None:
    file = _written(sources, tmp_path, "llama", "Q8_0")
    model = load_pretrained(file.parent, device="cpu")
    assert model.info.name == file.parent.name
    assert model.attend(TEXTS[0]).attentions.shape[:2] == (3, 4)


def test_a_gguf_without_its_suffix_is_known_by_its_magic(sources: dict[str, Path], tmp_path: Path) -> None:
    """As ollama keeps them: blobs/sha256-<digest>, no .gguf."""
    blob = tmp_path / "sha256-0123abcd"
    blob.write_bytes(_written(sources, tmp_path, "qwen2", "Q8_0").read_bytes())
    assert checkpoint_architecture(blob) == "decoder"
    assert load_pretrained(blob, device="cpu").info.name == "sha256-0123abcd"


def test_two_gguf_files_in_a_directory_are_named(sources: dict[str, Path], tmp_path: Path) -> None:
    file = _written(sources, tmp_path, "llama", "Q8_0")
    (file.parent / "other.gguf").write_bytes(file.read_bytes())
    for call in (load_pretrained, check_checkpoint, checkpoint_architecture):
        with pytest.raises(CheckpointNotFoundError, match=r"2 GGUF files \(other\.gguf, tiny-llama\.gguf\)"):
            call(file.parent)


def test_a_missing_gguf_path_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(CheckpointNotFoundError, match="no GGUF file at"):
        load_pretrained(tmp_path / "absent.gguf")


@pytest.mark.parametrize("architecture", ["mamba", "falcon", "gemma4", "qwen2moe", "t5"])
def test_an_architecture_we_do_not_convert_is_refused_by_name(
    architecture: str, sources: dict[str, Path], tmp_path: Path, session_cache: Path
) -> None:
    file = _written(sources, tmp_path, "llama", "F32", architecture=architecture)
    taken = ", ".join(supported_architectures())
    assert supported_architectures() == ["gemma2", "gemma3", "gpt2", "llama", "phi3", "qwen2", "qwen3"]
    for call in (load_pretrained, check_checkpoint, checkpoint_architecture):
        with pytest.raises(
            UnsupportedCheckpointError, match=f"architecture '{architecture}'.*takes GGUF files of {taken}$"
        ):
            call(file)
    assert not list((session_cache / CACHE_KIND).glob(f"{gguf.header_digest(file)}*"))


def test_the_startup_check_reads_the_header_and_converts_nothing(
    sources: dict[str, Path], tmp_path: Path, session_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hashlib

    file = _written(sources, tmp_path, "qwen2", "Q8_0")
    own = tmp_path / "own-cache"  # the session's may hold this header's folder from another test
    monkeypatch.setenv(cache.CACHE_ENV, str(own))

    def no_hashing(*_: object) -> None:
        raise AssertionError("a whole file hashed")

    with monkeypatch.context() as patched:
        patched.setattr(hashlib, "file_digest", no_hashing)  # a check never hashes the file
        assert checkpoint_architecture(file) == "decoder"
        check_checkpoint(file)
    assert not own.exists()  # nothing converted, nothing kept
    load_pretrained(file, device="cpu")
    assert checkpoint_architecture(file) == "decoder"  # and after a load, from its header again


@pytest.mark.parametrize("keep", [4, 200, 2_000, -100])
def test_a_file_cut_short_is_refused_clearly(keep: int, sources: dict[str, Path], tmp_path: Path) -> None:
    """Cut in the magic, in the metadata, in the tensor table's strings, and in the last tensor's data."""
    whole = _written(sources, tmp_path, "llama", "Q8_0").read_bytes()
    file = tmp_path / "cut.gguf"
    file.write_bytes(whole[:keep])
    for call in (load_pretrained, check_checkpoint, checkpoint_architecture):
        with pytest.raises(CheckpointNotFoundError, match="is not a readable GGUF file|is cut short: tensor"):
            call(file)


def test_a_file_that_is_not_gguf_is_refused_clearly(tmp_path: Path) -> None:
    file = tmp_path / "model.gguf"
    file.write_bytes(b"PK\x03\x04" + bytes(range(256)) * 8)
    with pytest.raises(CheckpointNotFoundError, match="is not a readable GGUF file"):
        load_pretrained(file)


def test_missing_and_misshaped_tensors_are_named_and_nothing_is_cached(
    sources: dict[str, Path], tmp_path: Path, session_cache: Path
) -> None:
    def damage(arrays: dict[str, object]) -> dict[str, object]:
        arrays = dict(arrays)
        del arrays["blk.1.attn_k.weight"]
        arrays["blk.0.ffn_up.weight"] = arrays["blk.0.ffn_up.weight"][:64]  # type: ignore[index]
        return arrays

    file = _written(sources, tmp_path, "qwen2", "F32", tensors=damage)
    check_checkpoint(file)  # the header alone is whole and of an architecture we take
    with pytest.raises(
        CheckpointMismatchError, match=r"missing keys \(1\): layers\.1\.self_attn\.k_proj"
    ) as caught:
        load_pretrained(file, device="cpu")
    assert "layers.0.mlp.up_proj.weight (64, 64)" in str(caught.value)
    digest = gguf.header_digest(file)
    assert not list((session_cache / CACHE_KIND).glob(f"*{digest}*"))  # neither published nor left behind


def _set_u32(file: Path, key: str, value: int) -> None:
    """Overwrite the uint32 metadata value of `key` in place (its name, then the type tag 4, then it)."""
    data = bytearray(file.read_bytes())
    tag = struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", 4)
    at = data.index(tag) + len(tag)
    data[at : at + 4] = struct.pack("<I", value)
    file.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("llama.attention.head_count", 0, "llama.attention.head_count is 0; a layer needs 1 or more"),
        ("llama.attention.head_count_kv", 0, "llama.attention.head_count_kv is 0"),
        ("llama.attention.head_count_kv", 3, "query heads are not a whole number of groups of the 3"),
        ("llama.attention.head_count", 6, "llama.embedding_length (64) is not divisible by head_count (6)"),
        ("llama.block_count", 9, "llama.block_count is 9, but no tensors of layers 3-8"),
        ("llama.block_count", 1, "llama.block_count is 1, but it holds tensors of layers 1-2"),
    ],
)
def test_a_config_its_tensors_belie_is_named_before_anything_is_built(
    key: str, value: int, says: str, sources: dict[str, Path], tmp_path: Path
) -> None:
    """Issue 33 item 2: the header's config against its tensors, at the cheap check (the service's startup
    check, so /api/models names it), a sentence and no ZeroDivisionError; nothing converted or cached."""
    file = _written(sources, tmp_path, "llama", "F32")
    _set_u32(file, key, value)
    for call in (check_checkpoint, checkpoint_architecture, load_pretrained):
        with pytest.raises(CheckpointMismatchError, match=re.escape(says)):
            call(file)


def test_a_layer_without_tensors_is_named(sources: dict[str, Path], tmp_path: Path) -> None:
    def drop_layer_one(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {name: array for name, array in arrays.items() if not name.startswith("blk.1.")}

    file = _written(sources, tmp_path, "llama", "F32", tensors=drop_layer_one)
    with pytest.raises(CheckpointMismatchError, match="no tensors of layer 1$"):
        check_checkpoint(file)


@pytest.mark.parametrize("budget", [64 << 10, 1 << 20])
def test_a_packed_model_says_what_it_holds(sources: dict[str, Path], tmp_path: Path, budget: int) -> None:
    """AttentionModel.nbytes of a GGUF model: its blocks as the file holds them (Q8_0: 34 bytes a block of
    32 weights), the float tensors, and the bytes its layers may keep dequantized, at what they can fill
    (issue 48 E4): the budget where the layers in float32 are more (64 KiB), else those layers (1 MiB is
    more than the tiny model's ~0.5 MB). What the service's memory budget across models counts."""
    from mha.loading.gguf.packed import DequantBudget

    file = _written(sources, tmp_path, "llama", "Q8_0")
    model = load_pretrained(file, dequant_cache_bytes=budget)
    network = model.network
    tensors = [*network.parameters(), *network.buffers()]
    stored = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())
    packed = [m for m in network.modules() if isinstance(getattr(m, "budget", None), DequantBudget)]
    assert len({id(m.budget) for m in packed}) == 1  # one budget a model, shared by its layers
    fill = sum(m.dequantized_nbytes for m in packed)  # every packed layer's weight in float32
    assert fill == sum(m.weight.numel() * 4 for m in packed)
    assert model.nbytes == stored + min(budget, fill)
    assert (fill > budget) == (budget == 64 << 10)  # each case counts what it says
    assert stored < file.stat().st_size  # the blocks, no float32 copy: less than the file itself
