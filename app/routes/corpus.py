"""Finished corpus runs for the Corpus view: the list, one run's per-head table, one head's values.
Thin: names are checked and files read in the service (app/service/corpus.py), off the event loop."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path, Query, Request, Response
from pydantic import BeforeValidator

from app.deps import ServiceDep
from app.routes.common import ApiRouter, json_answer
from app.schemas.common import ErrorResponse
from app.schemas.corpus import CorpusText, HeadValues, RunDetail, RunList, digits_only

router = ApiRouter(tags=["corpus"])


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorResponse, "description": description}


RUN_ERRORS: dict[int | str, dict[str, Any]] = {
    404: _error("No such finished run in HEADSCOPE_RUNS_DIR (the detail lists them), or none is set."),
    409: _error("The run's files cannot be read or break the format."),
    422: _error("A malformed name."),
}
HEAD_ERRORS: dict[int | str, dict[str, Any]] = {
    **RUN_ERRORS,
    422: _error(
        "A layer or head beyond the run's model, a statistic it did not measure, or a malformed name, "
        "layer, head or stat."
    ),
}
TEXT_ERRORS: dict[int | str, dict[str, Any]] = {
    404: _error("No such finished run, or no text at that line (beyond the run, or a bad record)."),
    409: _error("The run's files (its shards' texts) cannot be read."),
    422: _error("A malformed name or line."),
}

RunName = Annotated[str, Path(min_length=1, max_length=255, description="A run's name, as listed.")]
# Digits only: the schema's integer is all a path takes (the validator after Path, so the schema keeps
# Path's minimum and maximum).
Index = Annotated[int, Path(ge=0, le=32767), BeforeValidator(digits_only)]


@router.get("/corpus/runs", response_model=RunList)
async def corpus_runs(request: Request, service: ServiceDep) -> Response:
    """The finished runs of HEADSCOPE_RUNS_DIR (subfolders whose run.json says `complete`), by name, with
    their model (`served`: this server runs it), kind, counts, finish time and statistics."""
    return await json_answer(request, service.corpus.listing())


@router.get("/corpus/runs/{name}", response_model=RunDetail, responses=RUN_ERRORS)
async def corpus_run(name: RunName, request: Request, service: ServiceDep) -> Response:
    """One run: its run.json and its per-head table (per_head.parquet) as columns."""
    return await json_answer(request, service.corpus.run(name))


@router.get("/corpus/runs/{name}/heads/{layer}/{head}", response_model=HeadValues, responses=HEAD_ERRORS)
async def corpus_head(
    name: RunName,
    layer: Index,
    head: Index,
    request: Request,
    service: ServiceDep,
    stat: Annotated[str, Query(min_length=1, max_length=64, description="A statistic the run measured.")],
) -> Response:
    """One head's statistic over the corpus: its value for each text (per_text.parquet), and the texts
    where it is highest and lowest (examples.parquet)."""
    return await json_answer(request, service.corpus.head(name, layer, head, stat))


@router.get("/corpus/runs/{name}/texts/{line}", response_model=CorpusText, responses=TEXT_ERRORS)
async def corpus_text(
    name: RunName,
    line: Annotated[
        int,
        Path(ge=1, le=2**53, description="A record's line in the run's input."),
        BeforeValidator(digits_only),
    ],
    request: Request,
    service: ServiceDep,
) -> Response:
    """One text of the run (and its pair) by its line: what a point of a head's distribution opens."""
    return await json_answer(request, service.corpus.text(name, line))
