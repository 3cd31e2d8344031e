"""The Corpus view's answers (app/routes/corpus.py): finished `headscope corpus` runs read back. The
files behind them are the contract of docs/design.md "Corpus runs"; run.json is passed on as it is, once
RunMeta has checked the fields the answers read."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# -- requests: a path's integers -----------------------------------------------------------------------

_DIGITS = re.compile(r"[0-9]+")


def digits_only(value: Any) -> Any:
    """A path's integer as written: ASCII digits only. int() and pydantic's lax mode also take " 1", "1.0",
    "+1", "1_0" and other scripts' digits, so one line or layer would have many spellings (and "-1" would
    reach the range check as a number)."""
    if isinstance(value, str) and not _DIGITS.fullmatch(value):
        raise ValueError("Input should be a non-negative whole number written in the digits 0-9")
    return value


# -- run.json: the fields the answers read, checked before any is used ---------------------------------


class _Strict(BaseModel):
    # run.json is written by mha.corpus as JSON: a count written "3", 3.0 or true is a damaged file. Other
    # fields are passed on as they are (RunDetail.run), so unknown ones are allowed.
    model_config = ConfigDict(strict=True, extra="allow")


class RunModel(_Strict):
    name: str
    layers: int = Field(ge=1)
    heads: int = Field(ge=1)


class RunSettings(_Strict):
    shard_size: int = Field(ge=1)
    words: bool = False
    weighting: Literal["weight", "norm"] = "weight"  # a run from before --weighting read the weights


class RunCounts(_Strict):
    __pydantic_extra__: dict[str, int] = Field(init=False)  # a count added later is a count too

    records: int = Field(ge=0)
    texts: int = Field(ge=0)
    errors: int = Field(ge=0)
    truncated: int = Field(ge=0)
    shards: int = Field(ge=0)


class RunMeta(_Strict):
    """A finished run's run.json (docs/design.md "Corpus runs"), as far as the answers read it."""

    complete: bool
    model: RunModel
    settings: RunSettings
    counts: RunCounts
    stats: list[str]
    kind: str | None = None
    finished: str | None = None


# -- answers -------------------------------------------------------------------------------------------


class RunSummary(BaseModel):
    name: str = Field(description="The run's folder name in HEADSCOPE_RUNS_DIR: how requests name it.")
    model: str = Field(description="The model the run measured (run.json model.name).")
    layers: int | None
    heads: int | None
    kind: str | None = Field(description='"self", or "encoder" for an encoder-decoder\'s encoder.')
    words: bool = Field(description="Whether the statistics were taken on words (the page's Words mode).")
    weighting: str = Field(
        description='"weight": the statistics read the attention weights; "norm": weight × value norm '
        "shares (`headscope corpus --weighting norm`, the page's Weight × value norm)."
    )
    counts: dict[str, Any] = Field(description="records, texts, errors, truncated, shards (run.json).")
    finished: str | None
    stats: list[str] = Field(description="The statistics measured, as `head_stats` names them.")
    served: bool = Field(description="Whether this server runs the run's model, so a text opens in full.")


class RunList(BaseModel):
    configured: bool = Field(description="Whether HEADSCOPE_RUNS_DIR is set.")
    hint: str | None = Field(description="How to set it, when it is not.")
    runs: list[RunSummary]


class RunDetail(RunSummary):
    run: dict[str, Any] = Field(description="run.json as written by the job.")
    stat_descriptions: dict[str, str] = Field(description="What each statistic measures (one line each).")
    per_head: dict[str, list[Any]] = Field(
        description="per_head.parquet as columns (layer, head, count, <stat>_mean|_std|_p05|_p50|_p95, "
        "label_<label>), one entry per head, ordered by layer then head."
    )


class Example(BaseModel):
    side: str = Field(description='"top" (highest values) or "bottom" (lowest).')
    rank: int
    value: float | None
    id: str
    line: int = Field(description="The text's line: GET .../texts/{line} gives it whole.")
    snippet: str = Field(description="The text's first characters (300 at most).")
    snippet_pair: str | None = Field(description="Its pair's first characters, if it has a pair.")
    cut: bool = Field(description="Whether the snippet or its pair stops short of the whole.")


class HeadValues(BaseModel):
    name: str
    layer: int
    head: int
    stat: str
    values: list[float | None] = Field(description="The statistic for each text, in input order.")
    ids: list[str] = Field(description="Each text's id (the input's `id`, else its line).")
    lines: list[int] = Field(description="Each text's line (record number) in the input.")
    top: list[Example] = Field(description="The texts where the statistic is highest, rank 1 first.")
    bottom: list[Example] = Field(description="The texts where it is lowest, rank 1 first.")


class CorpusText(BaseModel):
    name: str
    line: int = Field(description="The text's line (record number) in the input.")
    id: str = Field(description="The text's id (the input's `id`, else its line).")
    text: str
    text_pair: str | None
