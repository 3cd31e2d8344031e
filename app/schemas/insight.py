"""The insight's schemas (app/routes/insight.py): head statistics, rollout, flow, and the comparison of two
inputs. Their requests are the attention's (KindRequest, InputText: app/schemas/attention.py)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from app.schemas.attention import (
    KIND_DESCRIPTION,
    WEIGHTING_DESCRIPTION,
    WORDS_DESCRIPTION,
    InputText,
    Kind,
    Weighting,
)
from app.schemas.common import Index, StrictBool

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
    stats: dict[str, list[list[float | None]]] = Field(
        description="Statistic name -> [layer][head] value (mha.analysis.head_stats; definitions in "
        "`stat_descriptions`); null where a statistic is absent (the duplicate-token and induction scores "
        "of a text with no repeated token)."
    )
    stat_descriptions: dict[str, str] = Field(description="Statistic name -> what it measures, one line.")
    labels: list[list[str]] = Field(
        description="[layer][head] role: previous-token, next-token, self, special-sink, first-token-sink, "
        "punctuation, broad, local, mixed or induction (mha.analysis.head_labels, using `thresholds`). Cross "
        "attention: special-sink, first-token-sink, punctuation, alignment (the rows' maxima move "
        "monotonically through the source), broad or mixed (mha.analysis.cross_labels)."
    )
    thresholds: dict[str, float] = Field(
        description="pointer: a pointer label needs its statistic above this; broad: entropy_norm at least "
        "this; local: weight within 2 tokens at least this; induction and induction_margin: the induction "
        "score at least the first and at least the second above its chance (not for cross attention)."
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
