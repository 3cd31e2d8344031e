"""Pretrained checkpoints in our layers: load_network() and random_network() -> LoadedNetwork (our network,
the checkpoint's tokenizer, what the model is, and what reads its LM head), which the model facade
(mha.model: load_pretrained, random_model) wraps in an AttentionModel; checkpoint_architecture() says what a
checkpoint is before loading it.

The checkpoint's own tokenizer (read from its directory) does the tokenization (mha.text.tokenize);
transformers is used for that and for reading config.json, never for the attention itself. Finding and reading
the checkpoint's files is mha.loading.checkpoint's, converting its weights to ours mha.loading.convert's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple, cast

import torch

from mha.core.layers import cast_network
from mha.devices import resolve_device, resolve_dtype
from mha.errors import CheckpointNotFoundError
from mha.loading import checkpoint
from mha.loading.checkpoint import DEFAULT_MODEL_NAME, check_checkpoint, default_model_path
from mha.loading.checkpoint_files import Checked, check_files
from mha.loading.convert import Converter, convert_state_dict
from mha.loading.convert.base import build_network as make_network
from mha.loading.convert.base import forced_tokens
from mha.loading.gguf import weights as gguf_weights
from mha.loading.gguf.cache import cached_config
from mha.loading.gguf.header import architecture, read_header
from mha.loading.gguf.locate import find_gguf, source_name
from mha.loading.gguf.packed import DEFAULT_DEQUANT_CACHE_BYTES, DequantBudget
from mha.loading.load_progress import Progress, Stages, report
from mha.networks.model import Transformer, TransformerConfig
from mha.networks.result import ModelInfo
from mha.networks.seq2seq import EncoderDecoder, Seq2SeqConfig
from mha.text import chat
from mha.text.tokenize import is_byte_level

__all__ = [
    "DEFAULT_MODEL_NAME",
    "LoadedNetwork",
    "build_network",
    "check_checkpoint",
    "checkpoint_architecture",
    "default_model_path",
    "load_network",
    "random_network",
]

logger = logging.getLogger(__name__)

# A load's stages and their shares of its progress bar (mha.loading.load_progress), from where a first load
# spends its time: a GGUF's config (transformers reading its config and tokenizer into the cache: ~70 % of
# the bundled SmolLM2's first load; dropped when cached), its tensors read, its weights taken (their scales
# checked), the finite check; a folder's weight files read, most of its load.
GGUF_STAGES = {"config": 60, "prepare": 5, "weights": 10, "build": 20, "finite": 5}
FOLDER_STAGES = {"prepare": 10, "weights": 60, "build": 15, "finite": 15}


@dataclass(frozen=True)
class LoadedNetwork:
    """What a load gives the model facade (mha.model.AttentionModel): the network in eval mode on its device,
    the checkpoint's tokenizer, and what reads the LM head and logits bias on first use (None: an encoder,
    which cannot write; only writing text needs them)."""

    network: Transformer | EncoderDecoder
    tokenizer: Any
    info: ModelInfo
    pair_template: bool = True  # whether a text pair gets the tokenizer's pair template ([CLS] a [SEP] b)
    lm_head: Callable[[], torch.Tensor] | None = None
    eos_ids: tuple[int, ...] = field(default=())  # the tokens that end a continuation
    logits_bias: Callable[[], torch.Tensor | None] | None = None


def checkpoint_architecture(path: str | Path) -> str | None:
    """ "encoder", "decoder" or "encoder-decoder": what a local checkpoint is, from its config (no tensor
    read, no tokenizer: milliseconds), so a service can say it before loading; None for a hub id not on
    disk. Runs check_checkpoint's checks, and raises what it raises for broken files."""
    gguf_file = find_gguf(path)
    if gguf_file is not None:  # its header: its config and tokenizer are not read here
        return architecture(gguf_file)
    directory = checkpoint.local_directory(path)
    if directory is None:
        return None
    config = check_files(directory).config
    return "encoder-decoder" if isinstance(config, Seq2SeqConfig) else config.architecture


def load_network(
    path: str | Path | None = None,
    *,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype | None = None,
    name: str | None = None,
    dequant_cache_bytes: int | None = None,
    dequant_compile: bool = False,
    progress: Progress | None = None,
) -> LoadedNetwork:
    """A Hugging Face checkpoint directory (an encoder, a decoder, or an encoder-decoder of
    mha.loading.convert.CONVERTERS), or a GGUF file (or a directory holding one) of an architecture we convert
    (mha.loading.gguf: its header read once, its config and tokenizer read on first use, from
    $HEADSCOPE_CACHE_DIR after), in our layers. A GGUF's quantized matrices stay as their ggml blocks,
    dequantized layer by layer in the forward (mha.loading.gguf.packed); up to `dequant_cache_bytes` of
    dequantized weights are kept between forwards (None: DEFAULT_DEQUANT_CACHE_BYTES). `dequant_compile`
    runs the dequantizer under torch.compile: opt-in, as it is slower for Q6_K and about even for Q4_K.

    path None or "all-MiniLM-L6-v2" is the embedded default. A path that is not a directory is taken as a
    hub id and fetched only then (needs the network). The tokenizer comes from the checkpoint's own files.
    Every failure is a CheckpointError subclass (mha.errors); check_checkpoint(path) finds the ones the
    files alone show, without loading. `progress(step, steps)`, a plain callable, is told how far the load
    is as it goes (mha.loading.load_progress: one rising bar over its stages), on the loading thread.
    """
    if path is None or str(path) == DEFAULT_MODEL_NAME:
        name = name or DEFAULT_MODEL_NAME
    gguf_file = find_gguf(path)
    if gguf_file is not None:
        stages = Stages(progress, GGUF_STAGES)
        budget = DequantBudget(
            DEFAULT_DEQUANT_CACHE_BYTES if dequant_cache_bytes is None else dequant_cache_bytes
        )
        parts = _gguf_parts(gguf_file, budget, stages, device=device, dtype=dtype)
        budget.compiled = dequant_compile
        name = name or source_name(gguf_file if path is None else path)
    else:
        stages = Stages(progress, FOLDER_STAGES)
        parts = _folder_parts(path, stages, device=device, dtype=dtype)
    return _finish(parts, name or parts.directory.name, stages)


class _Parts(NamedTuple):
    """What each kind of checkpoint gives the rest of a load: read and built, on the CPU."""

    source: Path  # the GGUF file or the checkpoint folder, named in messages
    directory: Path  # its config and tokenizer files
    checked: Checked  # its config (a seq2seq one with its generation config)
    tokenizer: Any
    network: Transformer | EncoderDecoder
    read_head: Callable[[], torch.Tensor | None]  # the checkpoint's own LM head, None where it has none
    logits_bias: Callable[[], torch.Tensor | None] | None
    device: torch.device
    dtype: torch.dtype


def _gguf_parts(
    file: Path, budget: DequantBudget, stages: Stages, *, device: str | torch.device, dtype: Any
) -> _Parts:
    """A GGUF: its header read once (the cache, the weights and the checks all take it), its config and
    tokenizer from the cache (read into it first where they are not there), its tensors from the file."""
    header = read_header(file)
    cached = cached_config(header, progress=stages.stage("config"))
    stages.drop_if_silent("config")  # found cached: the bar is the tensors'
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    tokenizer = _tokenizer(cached.folder, cached.checked, stages)
    network, read_head = gguf_weights.load_network(
        header,
        cached.names,
        cached.checked,
        budget,
        reading=stages.stage("weights"),
        building=stages.stage("build"),
    )
    return _Parts(
        file, cached.folder, cached.checked, tokenizer, network, read_head, None, torch_device, torch_dtype
    )


def _folder_parts(
    path: str | Path | None, stages: Stages, *, device: str | torch.device, dtype: Any
) -> _Parts:
    """A checkpoint folder (or a hub id, fetched): its files checked (reading no tensor: a broken checkpoint
    fails here, cheaply), then its weights converted to ours."""
    directory = checkpoint.local_directory(path) or checkpoint.fetch(str(path))
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    checked = check_files(directory)
    if isinstance(checked.config, Seq2SeqConfig):
        checked = checked._replace(config=_with_generation_config(checked.config, directory))
    converter, weight_files, _, config = checked
    tokenizer = _tokenizer(directory, checked, stages)
    network = build_network(config, converter, weight_files, progress=stages.stage("weights"))
    read_head = partial(_read_tensor, weight_files, converter.lm_head)
    logits_bias = None
    if converter.logits_bias is not None:
        logits_bias = partial(checkpoint.load_tensor, weight_files, converter.logits_bias)
    return _Parts(
        directory, directory, checked, tokenizer, network, read_head, logits_bias, torch_device, torch_dtype
    )


def _tokenizer(directory: Path, checked: Checked, stages: Stages) -> Any:
    """The checkpoint's tokenizer, read before the weights: it fails cheaply."""
    converter, config = checked.converter, checked.config
    tokenizer = checkpoint.load_tokenizer(directory, config.vocab_size, slow=converter.slow_tokenizer)
    report(stages.stage("prepare"), 1, 1)
    return tokenizer


def _finish(parts: _Parts, name: str, stages: Stages) -> LoadedNetwork:
    """The network on its device and in its dtype, checked finite, and what the model facade holds of it."""
    converter, _, hf_config, config = parts.checked
    report(stages.stage("build"), 1, 1)
    # As transformers places it: T5 in float16 keeps its feed-forward output projections in float32.
    network = cast_network(parts.network, device=parts.device, dtype=parts.dtype)
    _refuse_non_finite(network, parts.source, progress=stages.stage("finite"))
    info = ModelInfo.of(config, name=name, family=converter.family, device=parts.device, dtype=parts.dtype)
    chat_template = bool(getattr(parts.tokenizer, "chat_template", None))
    if chat_template:
        chat.prewarm()  # its renders run in a worker process (mha.text.chat): started now, not at first chat
    info = replace(info, chat_template=chat_template, byte_level=is_byte_level(parts.tokenizer))
    logger.info("loaded %r (%s) from %r on %s", name, converter.family, str(parts.source), parts.device)
    lm_head = logits_bias = None
    if isinstance(network, EncoderDecoder):
        # As transformers 5 loads them: the checkpoint's own head where it has one, else the tied one.
        lm_head = partial(_lm_head_weight, network.decoder, parts.read_head, False)
        logits_bias = parts.logits_bias
    elif isinstance(config, TransformerConfig) and config.causal:
        tied = bool(getattr(hf_config, "tie_word_embeddings", False))
        lm_head = partial(_lm_head_weight, network, parts.read_head, tied)
    eos = getattr(hf_config, "eos_token_id", None)
    loaded = LoadedNetwork(
        network,
        parts.tokenizer,
        info=info,
        pair_template=converter.pair_template,
        lm_head=lm_head,
        eos_ids=() if eos is None else (eos,) if isinstance(eos, int) else tuple(eos),
        logits_bias=logits_bias,
    )
    stages.finish()
    return loaded


def _refuse_non_finite(network: torch.nn.Module, source: Path | str, *, progress: Progress | None) -> None:
    """CheckpointNotFoundError naming the first weight that holds NaN or an infinity (in the dtype the
    model runs in): such a network computes nothing exact. One pass over the weights, ~0.1 s a 100 M."""
    tensors = [*network.named_parameters(), *network.named_buffers()]
    for i, (name, tensor) in enumerate(tensors):
        report(progress, i, len(tensors))
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise CheckpointNotFoundError(
                f"{source}: its weight {name} holds {bad:,} NaN or infinite values of {tensor.numel():,} "
                f"(in {str(tensor.dtype).removeprefix('torch.')}): damaged, or too large for this dtype"
            )


def _with_generation_config(config: Seq2SeqConfig, directory: Path) -> Seq2SeqConfig:
    """`config` with the forced first and last tokens and the banned ones (one-token bad_words_ids) of
    the checkpoint's generation_config.json, which transformers' generate reads before config.json's."""
    import json

    path = directory / "generation_config.json"
    try:
        settings = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError, RecursionError):  # RecursionError: JSON nested too deeply
        settings = {}  # transformers falls back to config.json's too
    if not isinstance(settings, dict):
        return config
    forced = forced_tokens(SimpleNamespace(**settings))
    bad = settings.get("bad_words_ids") or []
    # Only one-token entries: a banned sequence needs the history, which greedy_target does not track.
    banned = tuple(int(w[0]) for w in bad if isinstance(w, list) and len(w) == 1 and isinstance(w[0], int))
    return replace(
        config,
        banned_token_ids=banned or config.banned_token_ids,
        forced_bos_token_id=forced["forced_bos_token_id"]
        if "forced_bos_token_id" in settings
        else config.forced_bos_token_id,
        forced_eos_token_id=forced["forced_eos_token_id"]
        if "forced_eos_token_id" in settings
        else config.forced_eos_token_id,
    )


def build_network(
    config: TransformerConfig | Seq2SeqConfig,
    converter: Converter,
    weight_files: list[Path],
    *,
    progress: Progress | None = None,
) -> Transformer | EncoderDecoder:
    """Our network for `config` holding the checkpoint's weights, converted (every key problem reported
    at once, mha.loading.convert) and adopted as they are, on the CPU in the checkpoint's dtype.
    progress(i, n) as each of the n weight files is read."""
    read: dict[str, torch.Tensor] = {}
    for i, file in enumerate(weight_files):
        report(progress, i, len(weight_files))
        read.update(checkpoint.load_weights([file]))
    weights = convert_state_dict(read, converter.key_map(config), config, family=converter.family)
    with torch.device("meta"):
        network = make_network(config)
    # assign=True adopts the checkpoint's tensors instead of copying into freshly initialised ones.
    network.load_state_dict(weights, strict=True, assign=True)
    return cast("Transformer | EncoderDecoder", network.eval())


def _lm_head_weight(
    network: Transformer, read: Callable[[], torch.Tensor | None], tied: bool
) -> torch.Tensor:
    """The checkpoint's LM head, or the token embeddings where it ties them (GPT-2, Gemma, small Qwens)."""
    weight = None if tied else read()
    return network.embeddings.token.weight.detach() if weight is None else weight


def _read_tensor(files: list[Path], name: str) -> torch.Tensor | None:
    return checkpoint.load_tensor(files, name)


def random_network(
    *,
    layers: int = 4,
    heads: int = 8,
    embed_dim: int = 256,
    causal: bool = False,
    seed: int = 0,
    device: str | torch.device = "cpu",
    name: str | None = None,
) -> LoadedNetwork:
    """Our layers with random weights (any size) and the default model's tokenizer: an untrained baseline."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(default_model_path()))
    # TransformerConfig's defaults are BERT's (512 positions, 2 token types, post-LN); GPT-2's where causal.
    config = TransformerConfig(
        vocab_size=len(tokenizer),
        embed_dim=embed_dim,
        num_heads=heads,
        num_layers=layers,
        ffn_dim=4 * embed_dim,
    )
    if causal:
        config = replace(
            config, activation="gelu_tanh", layer_norm_eps=1e-5, architecture="decoder", embedding_norm=False
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
    name = name or f"random-{'decoder' if causal else 'encoder'}-L{layers}-H{heads}-E{embed_dim}"
    info = ModelInfo.of(config, name=name, family="random", device=torch_device, dtype=torch.float32)
    info = replace(info, byte_level=is_byte_level(tokenizer))
    return LoadedNetwork(network.eval(), tokenizer, info=info)
