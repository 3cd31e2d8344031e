"""Request and response models: the OpenAPI contract of the HTTP API (docs/design.md)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from app.settings import MAX_NEW_TOKENS
from mha.networks.translate import DEFAULT_NEW_TOKENS

# A character cap independent of the body limit, so a long text fails with a message about text, and the
# tokenizer never sees more than this many characters (512 tokens need far fewer).
MAX_TEXT_CHARS = 20_000
# The same for long inputs (/api/trace*): 8,192 tokens of English are ~35,000 characters. The request body
# limit (HEADSCOPE_MAX_BODY_BYTES) applies too.
TRACE_MAX_TEXT_CHARS = 200_000
MAX_MODEL_NAME_CHARS = 100

# "Not blank" as a JSON-schema pattern: one character that is not whitespace, spelled out as the set
# Python's str.isspace() knows (mha's notion of blank), so that JSON Schema's (ECMA-262) and
# Python's regex dialects, which disagree on `\s`, read it the same.
NOT_BLANK = r"[^\t-\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
_NOT_BLANK = re.compile(NOT_BLANK)


def _not_blank(value: str) -> str:
    if not _NOT_BLANK.search(value):
        raise ValueError("text is blank: give at least one non-space character")
    return value


def _blank_is_none(value: str | None) -> str | None:
    # An empty second box of a form means "no pair"; a pair of only spaces has no tokens to pair with.
    return value if value is not None and _NOT_BLANK.search(value) else None


Text = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_TEXT_CHARS,
        # The schema's copy of the rule; the validator applies it with a readable message.
        json_schema_extra={"pattern": NOT_BLANK},
        examples=["The cat sat on the mat because it was tired."],
    ),
    AfterValidator(_not_blank),
]

TextPair = Annotated[
    str | None,
    Field(
        max_length=MAX_TEXT_CHARS,
        description='Optional second segment (sentence pairs). null, "" or only whitespace: no pair.',
    ),
    AfterValidator(_blank_is_none),
]

# Text and TextPair with the long inputs' cap.
TraceText = Annotated[
    str,
    Field(min_length=1, max_length=TRACE_MAX_TEXT_CHARS, json_schema_extra={"pattern": NOT_BLANK}),
    AfterValidator(_not_blank),
]
TraceTextPair = Annotated[
    str | None,
    Field(max_length=TRACE_MAX_TEXT_CHARS, description="Optional second segment, as in /api/attention."),
    AfterValidator(_blank_is_none),  # after the cap: it may turn the value into None
]

# Marks the `model` fields: create_app() replaces the mark with an enum of the names it serves, so the
# schema lists exactly what GET /api/models does (and schema-driven clients and fuzzers use real names).
MODEL_NAME_MARK = "x-registered-model-name"

ModelName = Annotated[
    str | None,
    Field(
        default=None,
        max_length=MAX_MODEL_NAME_CHARS,
        description="A registered model name (see GET /api/models); null for the default. Never a path.",
        examples=[None],
        json_schema_extra={MODEL_NAME_MARK: True},
    ),
]


def _whole_number(value: Any) -> Any:
    """2.0 as 2: JSON Schema counts a number with a zero fraction as an integer, so the server does too
    (2.5 stays a float, which the strict integer refuses)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, float) and math.isfinite(value):  # pydantic's own words for lax mode
        raise PydanticCustomError(
            "int_from_float", "Input should be a valid integer, got a number with a fractional part"
        )
    return value


# The schema says boolean and integer, so the server takes exactly those: no "yes", 1 or "2" (pydantic's
# strict mode), and a whole number written 2.0 is the integer 2, as JSON Schema reads it. An integer's
# bounds go inside its type, before _WHOLE: bounds after a validator reach the schema as "ge" and "le",
# which JSON Schema does not know (so a schema-driven client would send -1).
StrictBool = Annotated[bool, Field(strict=True)]
_WHOLE = BeforeValidator(_whole_number)
Index = Annotated[int, Field(strict=True, ge=0), _WHOLE]
NewTokens = Annotated[int, Field(strict=True, ge=0, le=MAX_NEW_TOKENS), _WHOLE]


def enumerate_model_names(openapi: dict[str, Any], names: Iterable[str]) -> dict[str, Any]:
    """Turn each marked `model` property of an OpenAPI document into an enum of `names` (or null)."""
    for component in openapi.get("components", {}).get("schemas", {}).values():
        for field in component.get("properties", {}).values():
            if field.pop(MODEL_NAME_MARK, False):
                field["anyOf"] = [{"type": "string", "enum": list(names)}, {"type": "null"}]
    return openapi


WORDS_DESCRIPTION = (
    "Merge each word's subword pieces first (by the tokenizer's word ids and offsets): attention TO a word "
    "is the sum over its pieces, FROM a word the mean, so rows still sum to 1; `tokens` are then the words "
    "as written in the text, and `segments`/`special` follow the words."
)


class InputText(BaseModel):
    """One input: a text, an optional pair, a model. The fields every attention body shares."""

    model_config = ConfigDict(extra="forbid")

    text: Text
    text_pair: TextPair = None
    model: ModelName = None
    max_new_tokens: NewTokens | None = Field(
        default=None,
        description="Decoder models: first continue the text greedily by up to this many tokens (as "
        "transformers' generate(do_sample=False), stopping at an end-of-sequence token), then answer for "
        "prompt and continuation; `generated` in the answer counts the tokens written. 0 or null: the text "
        "alone. Encoder-decoder models without a target: the most target tokens the model writes (null: "
        f"min({DEFAULT_NEW_TOKENS}, HEADSCOPE_MAX_NEW_TOKENS)). Above the service's "
        "HEADSCOPE_MAX_NEW_TOKENS, or for an encoder: 422.",
    )
    target: TextPair = Field(
        default=None,
        description="Encoder-decoder models (architecture encoder-decoder in /api/models): the target text "
        "the decoder reads (forced decoding; cut to the decoder's limit, then target_truncated is true). "
        'null, "" or only whitespace: the model writes its own target greedily, up to max_new_tokens. '
        "A target for any other model: 422 naming its architecture.",
    )
    generate: StrictBool = Field(
        default=False,
        description="Encoder-decoder models: the model writes its target greedily, up to max_new_tokens "
        "(what no target means too, said outright). With a target as well, or for any other model: 422.",
    )
    chat: StrictBool = Field(
        default=False,
        description="Put the text in the model's chat template as the user's turn, the assistant's turn "
        "opened (transformers' apply_chat_template(add_generation_prompt=True)): the tokens are the "
        "templated ones. Only for models whose /api/models entry has chat_template true, without "
        "text_pair; otherwise 422.",
    )

    @model_validator(mode="after")
    def _target_or_generate(self) -> InputText:
        if self.generate and self.target is not None:
            raise ValueError("send a target or generate: true, not both (generate writes the target)")
        return self


Weighting = Literal["weight", "norm"]
WEIGHTING_DESCRIPTION = (
    '"weight": the attention weights α_ij. "norm": weight × value norm (Kobayashi et al. 2020), what a head '
    "moves rather than where it looks: each head's α_ij ‖f_h(x_j)‖, f_h(x_j) = (x_j W_V^h + b_V^h) W_O^h "
    "(key j's value through the head's slice of the output projection; the output bias is in no head), "
    "each row divided by its total so that rows sum to 1 as weights do; every answer's maps, statistics and "
    "rollout are then of those shares, and `row_norms` gives each row's total (token level). An "
    "encoder-decoder's three attentions each so (cross attention: the source's values)."
)


class AttentionRequest(InputText):
    words: StrictBool = Field(default=False, description=WORDS_DESCRIPTION)
    weighting: Weighting = Field(default="weight", description=WEIGHTING_DESCRIPTION)


Kind = Literal["encoder", "decoder", "cross"]
KIND_DESCRIPTION = (
    "Which attention: \"encoder\" (every model's own: an encoder's, a decoder's, an encoder-decoder's "
    'encoder), or for an encoder-decoder "decoder" (the target\'s causal self-attention) or "cross" (target '
    "tokens, the queries, to source tokens, the keys). decoder or cross for another model: 422."
)


class KindRequest(AttentionRequest):
    kind: Kind = Field(default="encoder", description=KIND_DESCRIPTION)


class HeadRequest(KindRequest):
    layer: Index = Field(description="0-based layer index, below the model's `layers`.")
    head: Index = Field(description="0-based head index, below the model's `heads`.")


class Health(BaseModel):
    status: str = Field(examples=["ok"])
    model: str = Field(description="The default model.")
    device: str | None = Field(description="Device the default model runs on; null until it is loaded.")


class ModelEntry(BaseModel):
    name: str
    family: str | None = Field(
        description="The checkpoint's model_type (bert, roberta, distilbert, gpt2, llama, mistral, qwen2, "
        "qwen3, gemma2, phi3) or random; null until loaded."
    )
    layers: int | None
    heads: int | None
    chat_template: bool | None = Field(
        default=None, description="The tokenizer has a chat template (the `chat` input); null until loaded."
    )
    kv_heads: int | None = Field(
        description="Key/value heads: query head h reads key/value head h // (heads / kv_heads) "
        "(grouped-query attention); equal to heads for a model without grouping. Null until loaded."
    )
    byte_level: bool | None = Field(
        default=None,
        description='The tokenizer is a byte-level BPE (GPT-2, RoBERTa, Llama 3, Qwen): a token\'s "Ġ", '
        '"Ċ", "ĉ" are the bytes of a space, newline and tab. Null until loaded.',
    )
    max_tokens: int | None
    architecture: str | None = Field(
        default=None,
        description="encoder (bidirectional), decoder (causal) or encoder-decoder (T5, BART, Marian: takes "
        "a `target`; layers and heads are its encoder's). Null until loaded.",
    )
    decoder_layers: int | None = Field(
        default=None, description="An encoder-decoder's decoder layers, when they differ from `layers`."
    )
    decoder_heads: int | None = Field(
        default=None, description="An encoder-decoder's decoder heads, when they differ from `heads`."
    )
    trace_max_tokens: int | None = Field(
        default=None,
        description="The longest input /api/trace takes: the model's max_tokens, capped by the tokens "
        "whose trace fits HEADSCOPE_TRACE_MAX_BYTES. Null until loaded.",
    )
    causal: bool | None
    pretrained: bool | None
    loaded: bool
    error: str | None = Field(description="Why the model failed to load, if it did.")


class ModelList(BaseModel):
    default: str
    models: list[ModelEntry]


class AttentionHeader(BaseModel):
    model: str
    tokens: list[str] = Field(description="Tokens as the tokenizer spells them, special tokens included.")
    segments: list[int] = Field(description="0 for the first text (and its specials), 1 for the pair.")
    special: list[bool] = Field(
        description="True for the control tokens the tokenizer adds or that steer the model ([CLS], [SEP], "
        "BOS, EOS, PAD, MASK, chat-template markers), typed or not: what the `special` statistic weighs."
    )
    unknown: list[bool] = Field(
        description="True for the tokenizer's unknown token ([UNK]): a word it cannot spell. Not special."
    )
    layers: int
    heads: int
    kv_heads: int = Field(
        description="Key/value heads; query head h shares key/value head h // (heads / kv_heads) with the "
        "other heads of its group. Equal to heads without grouped-query attention."
    )
    n: int = Field(description="Number of tokens; each head's matrix is n x n.")
    truncated: bool = Field(
        description="True when the input was longer than the model (or the service) takes and was cut "
        "to that many tokens; the answer covers the kept tokens only."
    )
    causal: bool = Field(description="True for decoder models: the upper triangle is exactly 0.")
    generated: int = Field(
        default=0,
        description="How many of the last tokens the model wrote itself (max_new_tokens). Token i was "
        "chosen from position i - 1, so attention row i - 1 is what the model looked at while writing it.",
    )
    weighting: Weighting = Field(
        default="weight",
        description='"norm" when the maps are weight × value norm shares (the request\'s `weighting`).',
    )
    byte_level: bool = Field(
        default=False,
        description="True when `tokens` are a byte-level BPE's (GPT-2, RoBERTa, Llama 3, Qwen): "
        '"Ġ", "Ċ", "ĉ" in a token are the bytes of a space, newline and tab. False for other '
        "tokenizers and for words (`words: true`), which are slices of the text.",
    )


class AttentionResponse(AttentionHeader):
    attention: list[list[list[list[float]]]] = Field(
        description="Indexed [layer][head][query][key]; each row sums to 1; rounded to 6 decimals. An "
        "encoder-decoder's: its encoder's, over the source `tokens`."
    )
    # An encoder-decoder's answer only (absent for the others):
    architecture: Literal["encoder-decoder"] | None = None
    target_tokens: list[str] | None = Field(
        default=None, description="The decoder's input: its start token, then the target's tokens (m)."
    )
    target_special: list[bool] | None = None
    target_unknown: list[bool] | None = None
    target_truncated: bool | None = Field(
        default=None,
        description="The target was cut to the decoder's limit (`generated` counts the "
        "tokens the model wrote when no target was sent).",
    )
    decoder_attentions: list[list[list[list[float]]]] | None = Field(
        default=None, description="[layer][head][query][key] over the target, m x m, causal; 6 decimals."
    )
    cross_attentions: list[list[list[list[float]]]] | None = Field(
        default=None, description="[layer][head][target query][source key], m x n; 6 decimals."
    )
    row_norms: list[list[list[float]]] | None = Field(
        default=None,
        description='weighting "norm" (token level): [layer][head][query] the row\'s total '
        "Σ_j α_ij ‖f_h(x_j)‖, what the head moves into that query; share × total is each cell's norm.",
    )


KEY_TOKENS = Field(
    default=None,
    description="An encoder-decoder's answer: the keys' tokens (the source's for cross attention, else "
    "`tokens`); absent for other models.",
)
ANSWER_KIND = Field(
    default=None, description="An encoder-decoder's answer: which attention (the request's `kind`)."
)


class HeadResponse(BaseModel):
    model: str
    tokens: list[str] = Field(description="The query tokens (an encoder-decoder's target for decoder/cross).")
    kind: Kind | None = ANSWER_KIND
    key_tokens: list[str] | None = KEY_TOKENS
    layer: int
    head: int
    attention: list[list[float]] = Field(description="[query][key] at full float32 precision.")
    weighting: Weighting = Field(default="weight", description="The request's `weighting`.")
    row_norms: list[float] | None = Field(
        default=None, description='weighting "norm" (token level): each query row\'s total, float32.'
    )


class ErrorResponse(BaseModel):
    detail: str = Field(examples=["text: text is blank: give at least one non-space character"])


# -- insight: head statistics, rollout, flow, comparison ------------------------------------

SIMILAR_HEADS = 5  # "heads like this one" listed per head in /api/analysis
# Rollout and flow mix this much identity into each layer (Abnar & Zuidema's 0.5); stated in every answer.
ROLLOUT_RESIDUAL = 0.5


class AnalysisResponse(BaseModel):
    model: str
    tokens: list[str] = Field(description="Tokens, or words with `words: true`.")
    n: int
    kind: Kind | None = Field(default=None, description='The request\'s `kind`, unless "encoder".')
    key_tokens: list[str] | None = Field(default=None, description="Cross attention's keys: the source.")
    layers: int
    heads: int
    words: bool
    stats: dict[str, list[list[float]]] = Field(
        description="Statistic name -> [layer][head] value (mha.analysis.head_stats; definitions in "
        "`stat_descriptions`)."
    )
    stat_descriptions: dict[str, str] = Field(description="Statistic name -> what it measures, one line.")
    labels: list[list[str]] = Field(
        description="[layer][head] role: previous-token, next-token, self, special-sink, first-token-sink, "
        "punctuation, broad, local or mixed (mha.analysis.head_labels, using `thresholds`). Cross "
        "attention: special-sink, first-token-sink, punctuation, alignment (the rows' maxima move "
        "monotonically through the source), broad or mixed (mha.analysis.cross_labels)."
    )
    thresholds: dict[str, float] = Field(
        description="pointer: a pointer label needs its statistic above this; broad: entropy_norm at least "
        "this; local: weight within 2 tokens at least this."
    )
    similar: list[list[list[list[float]]]] = Field(
        description=f"[layer][head] -> its most similar heads (up to {SIMILAR_HEADS}) as [layer, head, "
        "distance], nearest first: Euclidean distance between z-scored statistics "
        "(mha.analysis.similar_heads)."
    )


class RolloutResponse(BaseModel):
    model: str
    tokens: list[str]
    n: int
    layers: int
    residual: float = Field(
        description=f"Weight of the identity mixed into each layer's head-mean ({ROLLOUT_RESIDUAL})."
    )
    rollout: list[list[float]] = Field(
        description="[output token][input token]: R = Ã_L···Ã_1; rows sum to 1; rounded to 6 decimals."
    )
    per_layer: list[list[list[float]]] = Field(
        description="[layer][output][input]: the cumulative rollout R_l after each layer (the last is "
        "`rollout`); rounded to 6 decimals."
    )


class FlowResponse(BaseModel):
    model: str
    tokens: list[str]
    n: int
    flow: list[list[float]] = Field(
        description="[output token][input token]: the raw max-flow through the layered attention graph, "
        "each in [0, 1] (rows do not sum to 1); rounded to 6 decimals (mha.analysis.attention_flow)."
    )
    flow_normalized: list[list[float]] = Field(
        description="`flow` with each row divided by its sum, as Abnar & Zuidema publish it: a distribution "
        "over input tokens like rollout's rows (a row with no flow stays 0); rounded to 6 decimals."
    )


class CompareRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    a: InputText
    b: InputText
    words: StrictBool = Field(default=False, description=WORDS_DESCRIPTION)
    weighting: Weighting = Field(default="weight", description=WEIGHTING_DESCRIPTION)
    kind: Kind = Field(default="encoder", description=KIND_DESCRIPTION + " Both sides compare that kind.")


class CompareHeadRequest(CompareRequest):
    layer: Index = Field(description="0-based layer index, below the models' `layers`.")
    head: Index = Field(description="0-based head index, below the models' `heads`.")


PerHead = list[list[float]]  # [layer][head]


class CompareSide(BaseModel):
    model: str
    tokens: list[str]


class CompareResponse(BaseModel):
    a: CompareSide
    b: CompareSide
    kind: Kind | None = Field(default=None, description='The request\'s `kind`, unless "encoder".')
    pairs: list[list[int]] = Field(
        description="Aligned (index in a, index in b), in order: equal tokens (difflib on the tokens as "
        "spelled, or the words), and a replaced run of equal length position by position."
    )
    tokens: list[str] = Field(description="The aligned tokens' labels, taken from a.")
    layers: int
    heads: int
    score: PerHead = Field(
        description="[layer][head]: mean Jensen-Shannon divergence (nats, 0..ln 2) between aligned rows "
        "restricted to aligned keys and renormalised; 0 = unchanged."
    )
    kept_a: PerHead = Field(description="[layer][head]: mean share of a's row weight on aligned keys.")
    kept_b: PerHead = Field(description="[layer][head]: mean share of b's row weight on aligned keys.")


class CompareHeadResponse(BaseModel):
    tokens: list[str] = Field(description="The aligned tokens' labels, taken from a.")
    kind: Kind | None = Field(default=None, description='"cross" for cross attention, else absent.')
    key_tokens: list[str] | None = Field(default=None, description="Cross attention's keys: a's source.")
    layer: int
    head: int
    a: list[list[float]] = Field(
        description="[query][key] a's head on the aligned tokens, rows renormalised."
    )
    b: list[list[float]] = Field(
        description="[query][key] b's head on the aligned tokens, rows renormalised."
    )
    diff: list[list[float]] = Field(description="a - b.")


# -- long inputs: a trace, then windows, rows and the overview of it ---------------------------------

Reduce = Literal["max", "mean"]
REDUCE_DESCRIPTION = (
    'How a block of cells is pooled into one: "max" keeps a single sharp spike visible, "mean" keeps mass '
    "(masked cells count as 0)."
)
MAX_OVERVIEW_SIZE = 512
MAX_WINDOW_CELLS = 512
# Cells or blocks per side, 1..the maximum (strict integers, 2.0 taken as 2, as Index).
OverviewSize = Annotated[int, Field(strict=True, ge=1, le=MAX_OVERVIEW_SIZE), _WHOLE]
WindowCells = Annotated[int, Field(strict=True, ge=1, le=MAX_WINDOW_CELLS), _WHOLE]


class TraceRequest(BaseModel):
    """A long input: traced once (cached by model, text, pair, chat), then read window by window."""

    model_config = ConfigDict(extra="forbid")

    text: TraceText
    text_pair: TraceTextPair = None
    model: ModelName = None
    chat: StrictBool = Field(default=False, description="As in /api/attention.")


class TraceOverviewRequest(TraceRequest):
    size: OverviewSize = Field(
        default=128, description="Blocks per side: every head pooled to s x s, s = min(size, n)."
    )
    reduce: Reduce = Field(default="max", description=REDUCE_DESCRIPTION)


class TraceHeadRequest(TraceRequest):
    layer: Index = Field(description="0-based layer index, below the model's `layers`.")
    head: Index = Field(description="0-based head index, below the model's `heads`.")


class TraceWindowRequest(TraceHeadRequest):
    rows: tuple[Index, Index] | None = Field(
        default=None, description="Query tokens [q0, q1): q0 < q1 <= n. null: all."
    )
    cols: tuple[Index, Index] | None = Field(
        default=None, description="Key tokens [k0, k1): k0 < k1 <= n. null: all."
    )
    max_cells: WindowCells = Field(
        default=MAX_WINDOW_CELLS,
        description="Cells per side: a side longer than this is pooled into this many blocks.",
    )
    reduce: Reduce = Field(default="max", description=REDUCE_DESCRIPTION)


class TraceRowRequest(TraceHeadRequest):
    q: Index = Field(description="0-based query token, below n.")


class TraceDone(BaseModel):
    """The last line of /api/trace's stream when the trace is ready."""

    event: Literal["done"] = "done"
    model: str
    n: int
    tokens: list[str]
    segments: list[int]
    special: list[bool]
    unknown: list[bool]
    truncated: bool
    layers: int
    heads: int
    kv_heads: int
    causal: bool
    byte_level: bool
    overview_size: int = Field(description="s of the overview pooled during the forward (s = min(128, n)).")
    stats_available: bool = Field(
        description="n is within HEADSCOPE_MAX_TOKENS: /api/attention, /api/analysis and /api/rollout "
        "take this input too (they cut longer ones)."
    )
    path: str = Field(
        description="How the forward ran (mha Trace.path): a fused kernel's name (fused-flash-cpu, "
        "fused-efficient-cuda, fused-flash-cuda) or blocked (soft-capped logits, a sliding window shorter "
        "than the input); several joined by + where layers differ."
    )


class TraceTokens(BaseModel):
    """An input's length in tokens (the tokenizer alone: no forward) and the two limits it meets."""

    model: str
    n: int = Field(description="Tokens of the input, special and template tokens included, uncut.")
    max_tokens: int = Field(
        description="The most /api/attention, /api/analysis and /api/rollout read: they cut longer inputs."
    )
    trace_max_tokens: int = Field(description="The most /api/trace takes: longer inputs get 413.")


class TraceWindowResponse(BaseModel):
    values: list[list[float]] = Field(description="[row block][col block], rounded to 6 decimals.")
    row_edges: list[int] = Field(description="Block r covers query tokens row_edges[r] .. row_edges[r+1]-1.")
    col_edges: list[int] = Field(description="Block c covers key tokens col_edges[c] .. col_edges[c+1]-1.")
    exact: bool = Field(description="One token per block on both axes: the values are the weights.")
    reduce: Reduce
    factor: list[int] = Field(description="The largest block's [rows, cols] in tokens: pooled x k.")


class TraceRowResponse(BaseModel):
    q: int
    n: int
    values: list[float] = Field(description="Query q's weight on every key, rounded to 6 decimals.")
