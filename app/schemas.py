"""Request and response models: the OpenAPI contract of the HTTP API (docs/design.md)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

# A character cap independent of the body limit, so a long text fails with a message about text, and the
# tokenizer never sees more than this many characters (512 tokens need far fewer).
MAX_TEXT_CHARS = 20_000
MAX_MODEL_NAME_CHARS = 100


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("text is blank: give at least one non-space character")
    return value


Text = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_TEXT_CHARS,
        # Documents "non-blank" in the schema; the validator gives the readable message.
        json_schema_extra={"pattern": r"\S"},
        examples=["The cat sat on the mat because it was tired."],
    ),
    AfterValidator(_not_blank),
]

ModelName = Annotated[
    str | None,
    Field(
        default=None,
        max_length=MAX_MODEL_NAME_CHARS,
        description="A registered model name (see GET /api/models); null for the default. Never a path.",
        examples=[None],
    ),
]


class AttentionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: Text
    text_pair: Annotated[
        str | None,
        Field(max_length=MAX_TEXT_CHARS, description="Optional second segment (sentence pairs)."),
        AfterValidator(lambda v: v if v is None else _not_blank(v)),
    ] = None
    model: ModelName = None


class HeadRequest(AttentionRequest):
    layer: Annotated[int, Field(ge=0, description="0-based layer index, below the model's `layers`.")]
    head: Annotated[int, Field(ge=0, description="0-based head index, below the model's `heads`.")]


class Health(BaseModel):
    status: str = Field(examples=["ok"])
    model: str = Field(description="The default model.")
    device: str | None = Field(description="Device the default model runs on; null until it is loaded.")


class ModelEntry(BaseModel):
    name: str
    family: str | None = Field(description="bert, roberta, distilbert, gpt2 or random; null until loaded.")
    layers: int | None
    heads: int | None
    max_tokens: int | None
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
    special: list[bool] = Field(description="True for the tokenizer's special tokens.")
    layers: int
    heads: int
    n: int = Field(description="Number of tokens; each head's matrix is n x n.")
    truncated: bool = Field(
        description="True when the input was longer than the model (or the service) takes and was cut "
        "to that many tokens; the answer covers the kept tokens only."
    )
    causal: bool = Field(description="True for decoder models: the upper triangle is exactly 0.")


class AttentionResponse(AttentionHeader):
    attention: list[list[list[list[float]]]] = Field(
        description="Indexed [layer][head][query][key]; each row sums to 1; rounded to 6 decimals."
    )


class HeadResponse(BaseModel):
    model: str
    tokens: list[str]
    layer: int
    head: int
    attention: list[list[float]] = Field(description="[query][key] at full float32 precision.")


class ErrorResponse(BaseModel):
    detail: str = Field(examples=["text: text is blank: give at least one non-space character"])
