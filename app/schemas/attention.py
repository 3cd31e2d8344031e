"""The attention's schemas (app/routes/api.py, and the insight routes' bodies, which build on these): one
input (`InputText`), the attention and head requests, the models list and health, and their answers."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from app.schemas.common import (
    MAX_TEXT_CHARS,
    NOT_BLANK,
    Index,
    NewTokens,
    StrictBool,
    TextInput,
    TextPair,
    not_blank,
)
from app.schemas.probe import Length, Seed
from mha.networks import DEFAULT_NEW_TOKENS

WORDS_DESCRIPTION = (
    "Merge each word's subword pieces first (by the tokenizer's word ids and offsets): attention TO a word "
    "is the sum over its pieces, FROM a word the mean, so rows still sum to 1; `tokens` are then the words "
    "as written in the text, and `segments`/`special` follow the words."
)


# A probe input's own refusals, rules between fields that the schema does not state (its descriptions do).
PROBE_ALONE = "with probe set"
NO_TEXT = "text is empty: give a text, or a probe"


def _blank_unless_empty(value: str) -> str:
    # "" is the probe's (checked against `probe` by the model); a text of only spaces is refused as ever
    return value if value == "" else not_blank(value)


# The text, or "" beside a probe: the schema's pattern says "empty, or one non-space character".
InputTextField = Annotated[
    str,
    Field(
        max_length=MAX_TEXT_CHARS,
        json_schema_extra={"pattern": f"^$|{NOT_BLANK}"},
        examples=["The cat sat on the mat because it was tired."],
        description='The text. "" (or absent) only with `probe`, which then is the input.',
    ),
    AfterValidator(_blank_unless_empty),
]


class ProbeInput(BaseModel):
    """The head probe's first sequence (/api/probe's row 0 for the same seed and length, whatever its
    `sequences`): a start token, `length` tokens drawn by `seed`, the same tokens again."""

    model_config = ConfigDict(extra="forbid")

    seed: Seed = Field(default=0, description="The probe's seed, as /api/probe's.")
    length: Length = Field(
        default=50,
        description="Tokens drawn, then repeated once, as /api/probe's `length` (at most "
        "(limit − 1) // 2 for the model's limit: a longer one is 422).",
    )


class InputText(TextInput):
    """One input: a text, an optional pair, a model; or the head probe's first sequence (`probe`). The
    fields every attention body shares."""

    text: InputTextField = ""
    probe: ProbeInput | None = Field(
        default=None,
        description="Instead of a text: the head probe's first sequence (POST /api/probe's row 0 for this "
        "seed and length), its ids as drawn, tokens as the tokenizer spells them; an encoder-decoder's is "
        "its decoder's target, the source the empty text. With probe set, text must be empty and "
        "text_pair, chat, max_new_tokens, target and generate absent or default, and words false and "
        'weighting "weight" where the body has them: otherwise 422.',
    )

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

    @model_validator(mode="after")
    def _text_or_probe(self) -> InputText:
        if self.probe is None:
            if self.text == "":
                raise ValueError(NO_TEXT)
            return self
        others = {
            "text": self.text != "",
            "text_pair": self.text_pair is not None,
            "chat": self.chat,
            "max_new_tokens": bool(self.max_new_tokens),
            "target": self.target is not None,
            "generate": self.generate,
        }
        if any(others.values()):
            sent = ", ".join(name for name, given in others.items() if given)
            raise ValueError(
                f"{PROBE_ALONE}, send no text, text_pair, chat, max_new_tokens, target or generate "
                f"(got {sent})"
            )
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

    @model_validator(mode="after")
    def _probe_as_drawn(self) -> AttentionRequest:
        # The probe's ids have no words (no offsets) and are run without the value norms.
        if self.probe is not None and (self.words or self.weighting != "weight"):
            raise ValueError(f'{PROBE_ALONE}, words must be false and weighting "weight" (the ids as drawn)')
        return self


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
    status: str = Field(
        examples=["ok"],
        description='"ok" once the default model is loaded; "loading" (also 200) while the server answers '
        'and the default model still loads (a request for it waits for that load); "unavailable" (503) '
        "when it failed to load (/api/models says why; it is loaded again by itself after a back-off); "
        '"unloaded" (200) when the memory budget unloaded it to make room and nothing loads it now: it loads '
        "again on its next request.",
    )
    model: str = Field(description="The default model.")
    device: str | None = Field(description="Device the default model runs on; null until it is loaded.")
    loading: list[str] = Field(default_factory=list, description="The models whose load is in progress.")
    checking: list[str] = Field(
        default_factory=list,
        description="The models whose startup check (their files and headers) has not run yet.",
    )


class ModelEntry(BaseModel):
    name: str
    family: str | None = Field(
        description="The checkpoint's model_type (bert, roberta, distilbert, gpt2, llama, mistral, qwen2, "
        "qwen3, gemma2, gemma3, phi3, ...) or random; null until loaded."
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
    # -- what its file's headers say, read at startup (no tensor read): known before it is loaded --
    source: str = Field(
        default="bundled",
        description="Where it comes from: bundled (with headscope), models_dir (HEADSCOPE_MODELS_DIR), "
        "operator (HEADSCOPE_MODELS), ollama, lmstudio or huggingface (a store found by itself); the "
        "list's `sources` says what each is called.",
    )
    header_family: str | None = Field(
        default=None,
        description="The family its file names (a GGUF's general.architecture, a folder's config.json "
        "model_type), before it is loaded; null until its startup check has passed, or for random.",
    )
    parameters: int | None = Field(default=None, description="Weights in all, from its tensors' shapes.")
    quantization: str | None = Field(
        default=None,
        description="A GGUF's quantization as llama.cpp names it (Q4_K_M, Q8_0, F16, ...: general.file_type, "
        "else the type holding the most weights), or a folder's float type (F32, F16, BF16).",
    )
    size_bytes: int | None = Field(default=None, description="Its weight files' size on disk.")
    state: str = Field(
        default="available",
        examples=["loaded"],
        description='"checking" (its startup check has not run yet), "loading", "loaded", "failed" (`error` '
        'says why; tried again on a request after a back-off) or "available" (checked; loaded on its '
        "first request; or loaded before and unloaded to make room within memory_budget_bytes).",
    )
    memory_bytes: int | None = Field(
        default=None,
        description="Bytes the loaded model holds in memory (weights, a GGUF's packed blocks, what it keeps "
        "dequantized at most); null when not loaded.",
    )


class ModelSource(BaseModel):
    id: str = Field(examples=["lmstudio"], description="The `source` of the models it offers.")
    label: str = Field(examples=["LM Studio"], description="What the page calls it: its menu group's title.")


class ModelList(BaseModel):
    default: str
    models: list[ModelEntry]
    sources: list[ModelSource] = Field(
        default_factory=list,
        description="Every source of models, in the model menu's order (one group each, empty ones left "
        "out), whether or not it offers a model now.",
    )
    memory_budget_bytes: int | None = Field(
        default=None,
        description="Bytes the loaded models may hold together (HEADSCOPE_MODELS_MAX_BYTES); to load "
        "another, the least recently used are unloaded. Null: no budget.",
    )
    memory_held_bytes: int = Field(
        default=0,
        description="Bytes the loaded models hold now, with unloaded ones still answering requests.",
    )


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
