"""The long inputs' schemas (app/routes/trace.py): a trace, then windows, rows and the overview of it."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.schemas.common import WHOLE, Index, ModelName, StrictBool, TraceText, TraceTextPair

Reduce = Literal["max", "mean"]
REDUCE_DESCRIPTION = (
    'How a block of cells is pooled into one: "max" keeps a single sharp spike visible, "mean" keeps mass '
    "(masked cells count as 0)."
)
MAX_OVERVIEW_SIZE = 512
MAX_WINDOW_CELLS = 512
# Cells or blocks per side, 1..the maximum (strict integers, 2.0 taken as 2, as Index).
OverviewSize = Annotated[int, Field(strict=True, ge=1, le=MAX_OVERVIEW_SIZE), WHOLE]
WindowCells = Annotated[int, Field(strict=True, ge=1, le=MAX_WINDOW_CELLS), WHOLE]


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
