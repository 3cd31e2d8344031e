"""What every route family's schemas share: the text, pair and model fields with their limits, the strict
booleans and integers, one input's base model (`TextInput`), the error body, and the step that lists the
served model names in the OpenAPI document."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError

from app.settings import MAX_NEW_TOKENS

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


def not_blank(value: str) -> str:
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
    AfterValidator(not_blank),
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
    AfterValidator(not_blank),
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
# bounds go inside its type, before WHOLE: bounds after a validator reach the schema as "ge" and "le",
# which JSON Schema does not know (so a schema-driven client would send -1).
StrictBool = Annotated[bool, Field(strict=True)]
WHOLE = BeforeValidator(_whole_number)
Index = Annotated[int, Field(strict=True, ge=0), WHOLE]
NewTokens = Annotated[int, Field(strict=True, ge=0, le=MAX_NEW_TOKENS), WHOLE]


def enumerate_model_names(openapi: dict[str, Any], names: Iterable[str]) -> dict[str, Any]:
    """Turn each marked `model` property of an OpenAPI document into an enum of `names` (or null)."""
    for component in openapi.get("components", {}).get("schemas", {}).values():
        for field in component.get("properties", {}).values():
            if field.pop(MODEL_NAME_MARK, False):
                field["anyOf"] = [{"type": "string", "enum": list(names)}, {"type": "null"}]
    return openapi


def bound_new_tokens(openapi: dict[str, Any], maximum: int) -> dict[str, Any]:
    """Give every `max_new_tokens` property of an OpenAPI document the service's own maximum
    (HEADSCOPE_MAX_NEW_TOKENS), not the schema's ceiling (MAX_NEW_TOKENS): the document states the bound
    the service enforces (issue 48), so a client or fuzzer reading it sends only what may be answered."""
    for component in openapi.get("components", {}).get("schemas", {}).values():
        field = component.get("properties", {}).get("max_new_tokens")
        if field is None:
            continue
        for branch in [field, *field.get("anyOf", [])]:
            if branch.get("type") == "integer":
                branch["maximum"] = min(maximum, branch.get("maximum", maximum))
    return openapi


class ErrorResponse(BaseModel):
    detail: str = Field(examples=["text: text is blank: give at least one non-space character"])


class TextInput(BaseModel):
    """A text, an optional pair, a model: the fields that open every body taking one input of
    /api/attention's kind (InputText, HeadEffectsRequest). Not itself a body: no schema of its own."""

    model_config = ConfigDict(extra="forbid")

    text: Text
    text_pair: TextPair = None
    model: ModelName = None
