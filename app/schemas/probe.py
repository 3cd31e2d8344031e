"""The head atlas (POST /api/probe, app/routes/probe.py): the request, with its bounds, and the last line of
its answer's stream. Values come from mha's probe (model.probe_heads: TransformerLens's detection patterns
scored on a seeded random sequence repeated once, Olsson et al.'s induction input)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.schemas.common import WHOLE, ModelName
from mha.model import PROBE_MAX_SEQUENCES

# The kinds the probe scores, in the order the page lists them (mha.analysis.detection KINDS).
ProbeKind = Literal["previous_token", "duplicate_token", "induction"]
MAX_SEED = 2**32 - 1  # any unsigned 32-bit seed: the same tokens on every machine
MAX_SEQUENCES = PROBE_MAX_SEQUENCES  # 32: mha's bound (the mean's standard error is already spread / 5.7)
# The schema's ceiling on `length`; the service allows at most (limit - 1) // 2 for the model's limit (its
# max_tokens, capped by HEADSCOPE_MAX_TOKENS): the start token and the random part twice must fit.
MAX_LENGTH = 4096

Seed = Annotated[int, Field(strict=True, ge=0, le=MAX_SEED), WHOLE]
Sequences = Annotated[int, Field(strict=True, ge=1, le=MAX_SEQUENCES), WHOLE]
Length = Annotated[int, Field(strict=True, ge=2, le=MAX_LENGTH), WHOLE]


class ProbeRequest(BaseModel):
    """Which model to probe and the probe's input: `sequences` rows, each a start token, then `length`
    tokens drawn (by `seed`) from the vocabulary's ordinary tokens, then the same `length` tokens again. An
    encoder-decoder's rows are its decoder's target (the source is the empty text)."""

    model_config = ConfigDict(extra="forbid")

    model: ModelName = None
    seed: Seed = Field(default=0, description=f"The random draw's seed, 0..{MAX_SEED}.")
    sequences: Sequences = Field(
        default=8, description=f"How many random sequences, 1..{MAX_SEQUENCES}: the scores are their mean."
    )
    length: Length = Field(
        default=50,
        description="Tokens drawn for each sequence, which is then repeated once: each row is "
        "2·length + 1 tokens (the start token first). At least 2; at most (limit − 1) // 2 for the model's "
        "limit (its max_tokens, an encoder-decoder's decoder's, capped by HEADSCOPE_MAX_TOKENS): 255 for "
        f"MiniLM's 512; a longer one is 422. The schema's own ceiling is {MAX_LENGTH}.",
    )


class ProbeDone(BaseModel):
    """The last line of /api/probe's stream: every head's detection scores on the probe's input."""

    event: Literal["done"] = "done"
    model: str
    seed: int
    sequences: int
    length: int
    layers: int
    heads: int
    kind: str = Field(
        description='The attention probed: "self" for an encoder or decoder; an encoder-decoder\'s '
        '"decoder" self-attention.'
    )
    kinds: list[ProbeKind] = Field(description="The scores' kinds, in order.")
    scores: dict[ProbeKind, list[list[float | None]]] = Field(
        description="[layer][head]: the probe's measure, the share of each query row's attention on the "
        "pattern's keys, averaged over the rows that have one, then over the sequences. null where no row "
        "of any sequence has a pattern key (a duplicate-free draw has no duplicate-token or induction key)."
    )
    chance: dict[ProbeKind, list[list[float | None]]] = Field(
        description="[layer][head]: what attention spread evenly over the keys the model's masks leave each "
        "query (its causal triangle, a layer's sliding window) would score on the same ids: the chance level "
        "a label must clear by `margin`. The same for every head of a layer."
    )
    spread: dict[ProbeKind, list[list[float | None]]] = Field(
        description="[layer][head]: the score's standard deviation over the sequences."
    )
    labels: list[list[list[ProbeKind]]] = Field(
        description="[layer][head]: the kinds the probe labels the head with, those whose score is at "
        "least `threshold` and at least its chance level + `margin` (usually none)."
    )
    threshold: float
    margin: float
    tokens: list[str] = Field(description="The first sequence's tokens, as the tokenizer spells them.")
    token_ids: list[int] = Field(
        description="The first sequence's ids: 2·length + 1 (the start token first: BOS, else CLS), or "
        "2·length for a tokenizer with neither."
    )
    byte_level: bool = Field(description='As in /api/attention: "Ġ", "Ċ", "ĉ" are a space, newline, tab.')
    causal: bool
