"""Which heads matter (POST /api/head-effects, app/routes/effects.py): the request, and the last line of
its answer's stream. Values come from mha.analysis.ablation (model.head_effects)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from app.schemas.common import NewTokens, StrictBool, TextInput, TextPair

# Models with more heads than this (layers x heads) stream a progress line per layer: their ablations take
# seconds (270 heads of SmolLM2-135M, L·H/2 forwards' worth); smaller ones answer in well under a second.
PROGRESS_HEADS = 100


class HeadEffectsRequest(TextInput):
    """One input, as /api/attention takes it (no words or weighting: what zeroing a head changes is read
    from the model's output, not from its attention maps)."""

    max_new_tokens: NewTokens | None = Field(
        default=None,
        description="Decoder models: first continue the text greedily by up to this many tokens (as "
        "/api/attention), then measure each head's effect at every step that wrote one too (`steps`). "
        "0 or null: the text alone. Encoder-decoder models without a target: the most target tokens the "
        "model writes first, as /api/attention (null: its default). For an encoder, or above "
        "HEADSCOPE_MAX_NEW_TOKENS: 422.",
    )
    target: TextPair = Field(
        default=None,
        description="Encoder-decoder models: the target the decoder reads (forced decoding), as in "
        "/api/attention; null: the model writes its own first. For any other model: 422.",
    )
    chat: StrictBool = Field(default=False, description="As in /api/attention.")


class EffectsSection(BaseModel):
    """One attention of an encoder-decoder: its heads' effects on the decoder's next-token distribution."""

    layers: int
    heads: int
    effects: list[list[float]] = Field(description="[layer][head]: the KL at the last decoder position.")
    steps: list[list[list[float]]] = Field(description="[layer][head][step]: the KL at each of `positions`.")


class HeadEffectsDone(BaseModel):
    """The last line of /api/head-effects' stream: every head's effect on the output."""

    event: Literal["done"] = "done"
    model: str
    tokens: list[str] = Field(
        description="The input's tokens (and the written ones), as the tokenizer spells."
    )
    n: int
    truncated: bool = Field(description="The input was cut to the service's max_tokens.")
    byte_level: bool = Field(description='As in /api/attention: "Ġ", "Ċ", "ĉ" are a space, newline, tab.')
    causal: bool
    layers: int
    heads: int
    measure: Literal["kl", "cosine"] = Field(
        description='"kl" (decoders, encoder-decoders): KL(p_full ‖ p_ablated) of the next-token '
        'distribution, nats. "cosine" (encoders): 1 − cosine similarity of the final hidden state.'
    )
    effects: list[list[float]] = Field(
        description="[layer][head]: the effect of zeroing that head's output (its slice before the output "
        "projection). Decoders: at the last position, the prediction of the next token (`top_tokens[-1]`). "
        "Encoders: on the first token's final state ([CLS]). Encoder-decoders: the encoder's heads, as "
        "`sections.encoder`. Full float32 precision; ≥ 0 up to rounding (a value within ~1e-16 of 0 may be "
        "negative)."
    )
    generated: int = Field(default=0, description="Tokens the model wrote first (max_new_tokens).")
    positions: list[int] | None = Field(
        default=None,
        description="Decoders: the positions measured, the last prompt token's up to the last token's (one "
        "per written token, then the last): position i predicts token i + 1. Encoder-decoders: every "
        "position of the decoder's input (`tokens`: the start token, then the target).",
    )
    steps: list[list[list[float]]] | None = Field(
        default=None, description="Decoders: [layer][head][step], the KL at each of `positions`."
    )
    top_tokens: list[str] | None = Field(
        default=None,
        description="Decoders: the output each step's KL refers to: the unablated model's most likely "
        "token at each of `positions` (the written tokens, then the predicted next one).",
    )
    top_probs: list[float] | None = Field(default=None, description="Decoders: its probability.")
    pooled: list[list[float]] | None = Field(
        default=None, description="Encoders: [layer][head], 1 − cosine of the mean-pooled final state."
    )
    sections: dict[Literal["encoder", "decoder", "cross"], EffectsSection] | None = Field(
        default=None,
        description="Encoder-decoders: the heads of each attention (the encoder's self-attention, the "
        "decoder's, cross-attention), each zeroed in turn and read at the decoder's next-token "
        "distribution. `tokens` are then the decoder's input and `source_tokens` the source's.",
    )
    source_tokens: list[str] | None = Field(
        default=None, description="Encoder-decoders: the source's tokens."
    )
