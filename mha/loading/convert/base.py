"""What every converter shares: the KeyMap and Converter types, the config fields every family names
alike, a per-layer key table expanded to every layer, `check_shapes`, which reports every missing,
unexpected and mis-shaped key of a checkpoint together in one CheckpointMismatchError from the names and
shapes alone, and `convert_state_dict`, which checks so and applies a map.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, TypeVar

import torch

from mha.errors import CheckpointMismatchError, UnsupportedCheckpointError
from mha.networks.model import TransformerConfig
from mha.networks.seq2seq import Seq2SeqConfig

# What a converter builds: one stack, or an encoder-decoder (mha.networks.seq2seq)
NetworkConfig = TransformerConfig | Seq2SeqConfig
V = TypeVar("V")

__all__ = [
    "Converter",
    "KeyMap",
    "NetworkConfig",
    "activation_from_hf",
    "base_config",
    "check_shapes",
    "convert_state_dict",
    "expected_shapes",
    "forced_tokens",
    "layer_sources",
    "strip_prefix",
]


@dataclass(frozen=True)
class KeyMap:
    # our key -> their keys; several are concatenated on dim 0 (q, k, v -> our fused in_proj)
    sources: dict[str, tuple[str, ...]]
    # their keys stored as (in, out) Conv1D weights that must be transposed to Linear's (out, in)
    transposed: frozenset[str] = frozenset()
    # regexes of their keys that hold nothing we need (buffers, poolers, task heads)
    ignored: tuple[str, ...] = ()
    # prefixes a task model (BertForMaskedLM, GPT2LMHeadModel, ...) puts before the base model's keys
    prefixes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Converter:
    family: str
    config_from_hf: Callable[[Any], NetworkConfig]
    key_map: Callable[[Any], KeyMap]  # of the config config_from_hf returns
    # a regex one key of every checkpoint of the family matches, whatever its size (the first layer's query):
    # weights without it that match another family's were saved by that family (mha.loading.checkpoint_files)
    signature: str
    # what the tokenizer's template cannot do for this family (GPT-2 has no pair template)
    pair_template: bool = True
    # the LM head's name in a causal checkpoint (read only to continue a prompt)
    lm_head: str = "lm_head.weight"
    # the per-token bias BART and Marian add to the logits (read with the LM head)
    logits_bias: str | None = None
    # the family's transformers tokenizer is a Python SentencePiece one (Marian): mha.text.slow_tokenize
    slow_tokenizer: bool = False

    def matches(self, keys: Iterable[str]) -> bool:
        """Whether a checkpoint with these weight names is this family's: one matches its signature."""
        pattern = re.compile(self.signature)
        return any(pattern.search(k) for k in keys)


def activation_from_hf(name: str, *, family: str) -> str:
    """Hugging Face's activation names -> ours; anything else is a model we would not reproduce exactly."""
    table = {
        "gelu": "gelu",
        "gelu_new": "gelu_tanh",
        "gelu_pytorch_tanh": "gelu_tanh",
        "relu": "relu",
        "silu": "silu",
        "swish": "silu",
    }
    if name not in table:
        raise UnsupportedCheckpointError(
            f"{family} checkpoint uses activation {name!r}; supported: {', '.join(sorted(table))}"
        )
    return table[name]


def base_config(cfg: Any, **family_fields: Any) -> TransformerConfig:
    """A TransformerConfig from the fields every family's config answers to under one name (transformers'
    `attribute_map` maps GPT-2's n_embd, DistilBERT's dim, ... to hidden_size), plus the family's own."""
    return TransformerConfig(
        vocab_size=cfg.vocab_size,
        max_positions=cfg.max_position_embeddings,
        embed_dim=cfg.hidden_size,
        num_heads=cfg.num_attention_heads,
        num_layers=cfg.num_hidden_layers,
        **family_fields,
    )


class ForcedTokens(TypedDict):
    forced_bos_token_id: int | None
    forced_eos_token_id: int | None


def forced_tokens(cfg: Any) -> ForcedTokens:
    """An encoder-decoder config's forced_bos_token_id and forced_eos_token_id (a list: its first)."""

    def first(value: Any) -> int | None:
        if isinstance(value, list | tuple):
            value = value[0] if value else None
        return None if value is None else int(value)

    return ForcedTokens(
        forced_bos_token_id=first(getattr(cfg, "forced_bos_token_id", None)),
        forced_eos_token_id=first(getattr(cfg, "forced_eos_token_id", None)),
    )


def layer_sources(
    num_layers: int,
    layer_prefix: str,
    table: Mapping[str, tuple[str, ...]],
    *,
    ours: str = "layers",
    params: tuple[str, ...] = ("weight", "bias"),
) -> dict[str, tuple[str, ...]]:
    """A family's per-layer table (our module -> their modules, several fused on dim 0) for every layer
    and each of `params`: {"{ours}.{i}.{module}.{p}": ("{layer_prefix}{theirs}.{p}", ...)}.
    `layer_prefix` holds `{i}`, the layer's index; `ours` is our stack's prefix ("encoder.layers")."""
    sources: dict[str, tuple[str, ...]] = {}
    for i in range(num_layers):
        theirs = layer_prefix.format(i=i)
        for module, modules in table.items():
            for p in params:
                sources[f"{ours}.{i}.{module}.{p}"] = tuple(f"{theirs}{m}.{p}" for m in modules)
    return sources


def build_network(config: NetworkConfig) -> torch.nn.Module:
    """The network a config describes: a Transformer, or an EncoderDecoder."""
    from mha.networks.model import Transformer
    from mha.networks.seq2seq import EncoderDecoder

    return EncoderDecoder(config) if isinstance(config, Seq2SeqConfig) else Transformer(config)


# repr(config) -> expected_shapes: a check and the load after it ask for the same config, and building
# even on the meta device costs ~30 ms for MiniLM. Keyed by repr: a config holds dicts (RoPE scaling), so it
# is not hashable, and its repr spells every field exactly.
_SHAPES: dict[str, dict[str, torch.Size]] = {}
_SHAPES_KEPT = 64  # configs remembered; a process sees a few


def expected_shapes(config: NetworkConfig) -> dict[str, torch.Size]:
    """Our parameter names and shapes for a config, without allocating the weights."""
    key = repr(config)
    shapes = _SHAPES.get(key)
    if shapes is None:
        with torch.device("meta"):
            model = build_network(config)
        shapes = {name: p.shape for name, p in model.state_dict().items()}
        if len(_SHAPES) >= _SHAPES_KEPT:
            _SHAPES.clear()
        _SHAPES[key] = shapes
    return dict(shapes)


def strip_prefix(theirs: Mapping[str, V], key_map: KeyMap) -> tuple[dict[str, V], list[str]]:
    """Drop a task model's prefix; keys outside the base model (its heads) are returned as skipped."""
    wanted = {k for keys in key_map.sources.values() for k in keys}
    best, hits = "", sum(k in wanted for k in theirs)
    for prefix in key_map.prefixes:
        n = sum(k.startswith(prefix) and k[len(prefix) :] in wanted for k in theirs)
        if n > hits:
            best, hits = prefix, n
    if not best:
        return dict(theirs), []
    inside = {k[len(best) :]: v for k, v in theirs.items() if k.startswith(best)}
    return inside, [k for k in theirs if not k.startswith(best)]


def _joined_shape(parts: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    """The shape torch.cat(parts, dim=0) has; None where it would raise (0-d parts, unequal widths)."""
    if any(not p or p[1:] != parts[0][1:] for p in parts):
        return None
    return (sum(p[0] for p in parts), *parts[0][1:])


def check_shapes(
    theirs: Mapping[str, Sequence[int]], key_map: KeyMap, config: NetworkConfig, *, family: str
) -> None:
    """Raise one CheckpointMismatchError listing every missing, unexpected and mis-shaped key of a
    checkpoint whose weights have these names and shapes (their names: a task model's prefix is dropped
    here), as convert_state_dict would; from the shapes alone, so a check reads no tensor."""
    shapes, _heads = strip_prefix({k: tuple(v) for k, v in theirs.items()}, key_map)
    expected = expected_shapes(config)
    ignored = [re.compile(p) for p in key_map.ignored]
    missing: list[str] = []
    misshaped: list[str] = []
    used: set[str] = set()
    for our_key, their_keys in key_map.sources.items():
        absent = [k for k in their_keys if k not in shapes]
        if absent:
            missing.extend(absent)
            continue
        used.update(their_keys)
        want = expected.get(our_key)
        # Transposed as loading does: .t() raises past 2-D, so such a part is mis-shaped.
        parts = [shapes[k][::-1] if k in key_map.transposed else shapes[k] for k in their_keys]
        if any(k in key_map.transposed and len(shapes[k]) > 2 for k in their_keys):
            got_shape = None
        else:
            got_shape = parts[0] if len(parts) == 1 else _joined_shape(parts)
        if want is None or got_shape != tuple(want):
            got = ", ".join(f"{k} {shapes[k]}" for k in their_keys)
            misshaped.append(f"{got} (expected {tuple(want) if want is not None else '?'} for {our_key})")
    unexpected = sorted(k for k in shapes if k not in used and not any(p.search(k) for p in ignored))
    unmapped = sorted(set(expected) - set(key_map.sources))  # a key map that forgot one of our weights
    if missing or unexpected or misshaped or unmapped:
        lines = [f"checkpoint does not match the {family} architecture:"]
        if missing:
            lines.append(f"  missing keys ({len(missing)}): {', '.join(missing)}")
        if unexpected:
            lines.append(f"  unexpected keys ({len(unexpected)}): {', '.join(unexpected)}")
        if misshaped:
            lines.append(f"  mis-shaped keys ({len(misshaped)}): {'; '.join(misshaped)}")
        if unmapped:
            lines.append(f"  weights with no source ({len(unmapped)}): {', '.join(unmapped)}")
        raise CheckpointMismatchError("\n".join(lines))


def convert_state_dict(
    theirs: Mapping[str, torch.Tensor], key_map: KeyMap, config: NetworkConfig, *, family: str
) -> dict[str, torch.Tensor]:
    """Their state dict -> ours, or check_shapes' one CheckpointMismatchError listing every problem."""
    check_shapes({k: v.shape for k, v in theirs.items()}, key_map, config, family=family)
    theirs, _heads = strip_prefix(theirs, key_map)
    ours: dict[str, torch.Tensor] = {}
    for our_key, their_keys in key_map.sources.items():
        parts = [theirs[k].t() if k in key_map.transposed else theirs[k] for k in their_keys]
        ours[our_key] = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
    return ours
