"""What a model is (ModelInfo) and what one `attend` gives (AttentionResult), apart from the code that makes
them, so that mha.model.attention_model and mha.networks.continuation both build results without importing
each other."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Self

import torch

from mha.core.config import TransformerConfig
from mha.devices import dtype_name
from mha.networks.seq2seq import Seq2SeqConfig
from mha.text.tokenize import Encoded

__all__ = ["ARCHITECTURES", "AttentionResult", "ModelInfo", "Seq2SeqResult", "owned"]

# What a result keeps of each encoded side's tokens (its source's; an encoder-decoder's target's as
# target_*), under Encoded's own names
MARKS = ("special", "unknown", "offsets", "word_ids", "truncated")


def marks_of(encoded: Encoded, prefix: str = "") -> dict[str, Any]:
    """`encoded`'s MARKS as a result's fields: {prefix + name: its value}."""
    return {prefix + name: getattr(encoded, name) for name in MARKS}


# What ModelInfo.architecture says: bidirectional, causal, or an encoder read by a causal decoder
ARCHITECTURES = ("encoder", "decoder", "encoder-decoder")


@dataclass(frozen=True)
class ModelInfo:
    name: str
    family: str  # a model_type of mha.loading.convert.CONVERTERS ("bert", "llama", ...), or "random"
    layers: int
    heads: int
    # key/value heads: query heads h and h' share one when h // (heads // kv_heads) agree (grouped-query
    # attention); equal to `heads` for a model without grouping
    kv_heads: int
    max_tokens: int  # the longest input, special tokens included
    causal: bool
    pretrained: bool
    device: str
    dtype: str  # "float32", "float16" or "bfloat16"
    chat_template: bool = False  # the tokenizer has a chat template (attend(..., chat=True))
    byte_level: bool = False  # a byte-level BPE tokenizer: "Ġ" in a token is a space (tokenize.is_byte_level)
    # One of ARCHITECTURES. For an "encoder-decoder" layers, heads and max_tokens are its encoder's (what
    # `attentions` holds) and the decoder_* fields its decoder's; None for the others.
    architecture: str = "encoder"
    decoder_layers: int | None = None
    decoder_heads: int | None = None
    decoder_max_tokens: int | None = None  # the longest target, the decoder start token included

    @property
    def seq2seq(self) -> bool:
        return self.architecture == "encoder-decoder"

    @classmethod
    def of(
        cls,
        config: TransformerConfig | Seq2SeqConfig,
        *,
        name: str,
        family: str,
        device: torch.device,
        dtype: torch.dtype,
    ) -> ModelInfo:
        """The info of a network built from `config`; pretrained unless the family is "random"."""
        stack = config.encoder if isinstance(config, Seq2SeqConfig) else config
        info = cls(
            name=name,
            family=family,
            layers=stack.num_layers,
            heads=stack.num_heads,
            kv_heads=stack.num_kv_heads or stack.num_heads,
            max_tokens=stack.max_tokens,
            causal=stack.causal,
            pretrained=family != "random",
            device=str(device),
            dtype=dtype_name(dtype),
            architecture=stack.architecture,
        )
        if not isinstance(config, Seq2SeqConfig):
            return info
        decoder = config.decoder
        return replace(
            info,
            architecture="encoder-decoder",
            decoder_layers=decoder.num_layers,
            decoder_heads=decoder.num_heads,
            decoder_max_tokens=decoder.max_tokens,
        )


@dataclass
class AttentionResult:
    tokens: list[str]  # as the tokenizer spells them, special tokens included
    token_ids: list[int]
    # float32, CPU, contiguous, [L, H, n, n]; rows sum to 1. Owns its storage: never a view into the
    # batch's buffer, so keeping, changing or freeing it leaves every other result alone. Two exceptions
    # (attend_batch): from a CUDA model a batch's results are disjoint views of the one buffer they were
    # copied into (changing one still leaves the others alone), and on_device=True leaves them on the
    # model's device.
    attentions: torch.Tensor
    segments: list[int]  # for display: 0 for the first text and its specials, 1 for the pair
    # What the model was fed as token type ids: the tokenizer's own (as transformers feeds them), zeros when
    # it gives none or the model has no segment embeddings. Not `segments`: RoBERTa's tokenizer gives none.
    type_ids: list[int]
    # A control token ([CLS], [SEP], BOS, EOS, PAD, MASK, chat markers), typed in the text or not; never
    # [UNK] (rule: mha.text.tokenize's docstring)
    special: list[bool]
    unknown: list[bool]  # the tokenizer's [UNK], standing for a word it cannot spell: for display
    # Character spans into the segment's own text, a typed special token's included; (0, 0) for the
    # special tokens the tokenizer's template adds.
    offsets: list[tuple[int, int]]
    word_ids: list[int | None]  # the tokenizer's word index per token; None for special tokens
    truncated: bool
    hidden_state: (
        torch.Tensor | None
    )  # float32, CPU, [n, E], owned: the last layer's output (None if not asked)
    # Tokens the model wrote after the prompt (attend(..., max_new_tokens=k)): the last `generated` tokens.
    # Token i was chosen from position i - 1: attention row i - 1 is what the model looked at writing it.
    generated: int = 0
    # The strings `offsets` index into: (text, text_pair) as given, or (the rendered chat template, None).
    texts: tuple[str, str | None] = ("", None)
    # float32, CPU, owned, [L, n, H, H] (attend(..., norms=True); else None): for key j and query heads h,
    # g, <f_h(x_j), f_g(x_j)>, f_h(x_j) key j's value through head h's slice of the output projection
    # (mha.analysis.norms states every convention). From the forward that made `attentions`.
    value_products: torch.Tensor | None = None

    @property
    def n(self) -> int:
        return len(self.tokens)

    @property
    def norms(self) -> torch.Tensor | None:
        """[L, H, n]: ‖f_h(x_j)‖, the size of what head h moves from key j per unit of weight (Kobayashi
        et al. 2020); None unless attend(..., norms=True)."""
        return norms_of(self.value_products)

    @property
    def prompt_n(self) -> int:
        """Tokens of the prompt: the attention's first prompt_n rows and columns."""
        return self.n - self.generated

    @classmethod
    def of(
        cls,
        encoded: Encoded,
        tokens: list[str],
        attentions: torch.Tensor,
        hidden_state: torch.Tensor | None,
        *,
        generated: int = 0,
        value_products: torch.Tensor | None = None,
        shared: bool = False,
    ) -> Self:
        """The result of one encoded input: `attentions` (L, H, n, n), `hidden_state` (n, E) and
        `value_products` (L, n, H, H) on the CPU in float32, made to own their storage; shared=True takes
        them as they are: contiguous, disjoint parts of one buffer that a batch's results share (the one
        copy of attend_batch from a CUDA model)."""
        keep = _as_is if shared else owned
        return cls(
            tokens=tokens,
            token_ids=encoded.ids,
            attentions=keep(attentions),
            segments=encoded.segments,
            type_ids=encoded.type_ids,
            hidden_state=None if hidden_state is None else keep(hidden_state),
            generated=generated,
            texts=encoded.texts,
            value_products=None if value_products is None else keep(value_products),
            **marks_of(encoded),
        )


@dataclass
class Seq2SeqResult(AttentionResult):
    """An encoder-decoder's attention: the AttentionResult fields describe the source (the encoder's
    input; `attentions` is the encoder's self-attention, so code written for encoders reads it as
    before), the target_* fields the decoder's input: the decoder start token, then the target's tokens
    (given, or written by the model: the last `generated` of them). Tensors float32, CPU, owned."""

    target_tokens: list[str] = field(default_factory=list)
    target_ids: list[int] = field(default_factory=list)
    target_special: list[bool] = field(default_factory=list)
    target_unknown: list[bool] = field(default_factory=list)
    # spans into `target` (the text as given); (0, 0) for the start token, specials and written tokens
    target_offsets: list[tuple[int, int]] = field(default_factory=list)
    target_word_ids: list[int | None] = field(default_factory=list)
    target_truncated: bool = False
    target: str = ""  # the target text as given ("" when the model wrote it)
    decoder_attentions: torch.Tensor = field(default_factory=lambda: torch.empty(0))  # [L_dec, H, m, m]
    cross_attentions: torch.Tensor = field(default_factory=lambda: torch.empty(0))  # [L_dec, H, m, n]

    decoder_hidden_state: torch.Tensor | None = None  # [m, E], the decoder's last layer (None if not asked)
    # attend(..., norms=True): the decoder's self-attention's value products [L_dec, m, H, H], and cross
    # attention's [L_dec, n, H, H] (its keys and values are the encoder's output, one per source token).
    decoder_value_products: torch.Tensor | None = None
    cross_value_products: torch.Tensor | None = None

    @property
    def prompt_n(self) -> int:
        """All of the source: what the model wrote (`generated`) is in the target."""
        return self.n

    @property
    def encoder_attentions(self) -> torch.Tensor:
        """[L_enc, H, n, n]: the encoder's self-attention, `attentions` by its seq2seq name."""
        return self.attentions

    @property
    def m(self) -> int:
        """Decoder tokens: the start token and the target's."""
        return len(self.target_tokens)

    @property
    def decoder_norms(self) -> torch.Tensor | None:
        """[L_dec, H, m]: ‖f_h(x_j)‖ of the decoder's self-attention (None unless norms=True)."""
        return norms_of(self.decoder_value_products)

    @property
    def cross_norms(self) -> torch.Tensor | None:
        """[L_dec, H, n]: ‖f_h(x_j)‖ of cross attention, x_j source token j's encoder output."""
        return norms_of(self.cross_value_products)


def norms_of(value_products: torch.Tensor | None) -> torch.Tensor | None:
    """[L, H, keys] from value products [L, keys, H, H]: the root of each diagonal (rounding may leave a
    zero norm's square at -1e-12: clamped)."""
    if value_products is None:
        return None
    return value_products.diagonal(dim1=-2, dim2=-1).clamp(min=0).sqrt().transpose(1, 2).contiguous()


def _as_is(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def owned(view: torch.Tensor) -> torch.Tensor:
    """`view` as a contiguous tensor that owns its storage. A view spanning all of it (a batch of one) is
    kept as is; any other is copied, so no result keeps the batch's buffer alive or shares memory with
    another (even where a slice happens to be contiguous: one layer, or the longest text)."""
    whole = (
        view.storage_offset() == 0 and view.untyped_storage().nbytes() == view.numel() * view.element_size()
    )
    return view if whole and view.is_contiguous() else view.clone(memory_format=torch.contiguous_format)
