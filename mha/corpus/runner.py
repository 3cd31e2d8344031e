"""``run``: one corpus job, end to end: check the folder, process the missing shards, aggregate.

The engines share everything but the loop over shards: ``"local"`` runs ``CorpusWorker`` in this process
(``mha.corpus.local_engine``); ``"ray"`` runs it on Ray Data. The Ray engine is ``mha.corpus.ray_engine``,
imported only for it, and must provide::

    def process(job: Job, todo: Sequence[int], progress: Progress | None, info: ModelInfo) -> None

(``info``: the model's shape, which ``run`` reads from the checkpoint's config and weight headers
without its weights, refusing a broken checkpoint as load_pretrained would)
which, for every shard index in ``todo`` (sorted; shard k holds lines k·S + 1 .. (k+1)·S of the input,
S = job.shard_size, lines 1..job.records), writes the shard with
``shards.write_shard(job.out, k, rows, layers=..., heads=...)``: ``rows`` the ``CorpusWorker`` answers
(``CorpusWorker(job.model, **job.worker_kwargs())``) for that shard's records in line order, an empty
``worker.output_schema`` table for a shard without records. Records are ``source.read_records``'s
(bad ones included, ``error`` set, so they reach errors.jsonl); the worker is fed a shard's records in
consecutive batches of ``job.batch``, cut at the shard's end, so its padded batches are the local
engine's and the numbers equal. ``progress(done, job.records)`` may be called as records finish. A shard
is finished only once write_shard returns; ``run`` aggregates after ``process`` returns.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import logging
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch

from mha._memory import release_free_memory
from mha.analysis.stats import LABELS
from mha.corpus import local_engine
from mha.corpus.aggregate import aggregate
from mha.corpus.job import ENGINES, STATISTICS, WEIGHTINGS, Job, Progress
from mha.corpus.local_engine import records_in
from mha.corpus.shards import (
    done_shards,
    is_temporary,
    remove_temporaries,
    shard_count,
    shard_directory,
    write_atomic,
)
from mha.corpus.source import MAX_CHARS, CorpusInputError, input_format
from mha.corpus.worker import CorpusWorker
from mha.loading import checkpoint
from mha.loading.checkpoint import DEFAULT_MODEL_NAME, check_checkpoint
from mha.loading.checkpoint_files import check_files
from mha.model.attention_model import AttentionModel
from mha.networks.result import ModelInfo

__all__ = ["FORMAT", "CorpusOutError", "CorpusSettingsError", "model_info", "run"]

logger = logging.getLogger(__name__)

_NAMED = 10  # files named when a folder's are refused
FORMAT = 2  # run.json's "format" (2: examples.parquet holds snippets and lines, 1 held whole texts)


class CorpusOutError(ValueError):
    """``out`` cannot be this run's folder: it is not a folder, lies under a file, cannot be made, or holds
    files that are not a run's (the job would overwrite them)."""


class CorpusSettingsError(CorpusOutError):
    """``out`` holds a run of another input, model or settings: resuming it would mix two runs."""


def run(
    source: str | Path,
    model: str | Path | AttentionModel | None,
    out: str | Path,
    *,
    engine: str = "local",
    batch: int = 32,
    words: bool = False,
    weighting: str = "weight",
    shard_size: int = 1000,
    max_tokens: int = 512,
    max_chars: int = MAX_CHARS,
    device: str = "auto",
    progress: Progress | None = None,
    name: str | None = None,
    num_gpus: float | None = None,
) -> dict[str, Any]:
    """Run the corpus job (docs/design.md "Corpus runs") and return run.json's content.

    ``model``: the embedded default's name (or None), a checkpoint directory, a hub id, or (local engine)
    a loaded AttentionModel; ``name`` the model's name in run.json (default: its directory's name).
    ``max_chars``: characters kept of each text and pair (mha.corpus.source.read_records), a cut text
    flagged ``truncated`` as one past ``max_tokens`` is. ``weighting``: "weight" (the attention weights) or
    "norm" (weight × value norm shares, CorpusWorker), recorded in run.json's settings like the others.
    A finished run in ``out`` with the same input and settings is returned as it is; an unfinished one is
    resumed (finished shards skipped; the temporary files a kill left, removed); one with another input,
    model or settings raises CorpusSettingsError naming what differs. An ``out`` that is not a folder (or
    lies under a file), or a folder of files without run.json, raises CorpusOutError before any work:
    nothing outside ``out``, and nothing in it that is not a run's, is overwritten.
    """
    source = Path(source)
    _check_arguments(source, model, engine, batch, shard_size, max_tokens, max_chars, num_gpus)
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting ({weighting!r}) must be one of {', '.join(WEIGHTINGS)}")
    _check_out(Path(out))
    loaded = model if isinstance(model, AttentionModel) else None
    given = None if isinstance(model, AttentionModel) or model is None else str(model)
    if given is not None:  # milliseconds, before the input is read: a broken checkpoint's error at once
        check_checkpoint(given)
    job = Job(
        source=source,
        out=Path(out),
        model=given,
        name=name or (loaded.info.name if loaded is not None else _default_name(given)),
        **Job.survey(source),
        engine=engine,
        batch=batch,
        words=words,
        weighting=weighting,
        shard_size=shard_size,
        max_tokens=max_tokens,
        max_chars=max_chars,
        device=device,
        num_gpus=num_gpus,
    )
    started = time.perf_counter()
    identity = {"model": job.name, "input": job.input(), "settings": job.settings()}
    previous = _previous_run(job.out, identity)
    if previous is not None and previous.get("complete"):
        logger.info("%r: this run is already complete; nothing to do", str(job.out))
        return previous
    worker, info = _load(job, loaded)  # the model first: a model that fails to load leaves no folder behind
    todo = _prepare_folder(job)
    record = _started_record(job, info, identity, previous)
    _write_json(job.out / "run.json", record)
    loading = time.perf_counter() - started
    if todo:
        if progress is not None:  # where a resumed run starts
            progress(job.records - records_in(job, todo), job.records)
        if worker is not None:
            local_engine.process(job, todo, worker, progress)
        else:
            _process_ray(job, todo, progress, info)
    return _finish(job, record, info, todo, started=started, loading=loading)


def _load(job: Job, loaded: AttentionModel | None) -> tuple[CorpusWorker | None, ModelInfo]:
    """(the local engine's worker, with its model loaded, or None for Ray; the model's shape)."""
    worker = None
    if job.engine == "local":
        worker = CorpusWorker(loaded if loaded is not None else job.model, **job.worker_kwargs())
        info = worker.model.info
    else:
        info = model_info(job)
    if job.words and info.seq2seq:  # CorpusWorker says the same; the Ray engine's would say it on a worker
        raise ValueError(f"words are not available for an encoder-decoder ({job.name!r}): use tokens")
    return worker, info


def _prepare_folder(job: Job) -> list[int]:
    """Make the run's folder, remove what a stopped job left half-written, and return the shards to do."""
    try:
        job.out.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # no permission, a read-only disk, a file put there since _check_out
        raise CorpusOutError(f"cannot make the folder {job.out} ({error.strerror or error})") from None
    for folder in (job.out, shard_directory(job.out)):
        removed = remove_temporaries(folder)  # a job killed mid-write (while aggregating, say) left them
        if removed:
            logger.info(
                "%r: removed %s, left by a job that was stopped", str(folder), ", ".join(map(repr, removed))
            )
    shards = shard_count(job.records, job.shard_size)
    done = done_shards(job.out)
    todo = [k for k in range(shards) if k not in done]
    if done:
        logger.info("%r: resuming, %d of %d shards already done", str(job.out), shards - len(todo), shards)
    return todo


def _started_record(
    job: Job, info: ModelInfo, identity: dict[str, Any], previous: dict[str, Any] | None
) -> dict[str, Any]:
    """run.json as the run starts: what it is (model, input, settings, the statistics' names), not done."""
    return {
        "format": FORMAT,
        "complete": False,
        "name": job.out.name,
        "engine": job.engine,
        "kind": "encoder" if info.seq2seq else "self",
        "model": {
            "name": job.name,
            "family": info.family,
            "architecture": info.architecture,
            "layers": info.layers,
            "heads": info.heads,
        },
        "input": identity["input"],
        "settings": identity["settings"],
        "stats": list(STATISTICS),
        "labels": list(LABELS),
        "started": (previous or {}).get("started") or _now(),
    }


def _finish(
    job: Job, record: dict[str, Any], info: ModelInfo, todo: list[int], *, started: float, loading: float
) -> dict[str, Any]:
    """Aggregate the shards, and write and return run.json complete, with counts, timings and versions."""
    shards = shard_count(job.records, job.shard_size)
    counts = _counts(job.out, shards)
    aggregate(job.out, range(shards), layers=info.layers, heads=info.heads)
    release_memory()
    seconds = time.perf_counter() - started
    texts_now = sum(c["texts"] for k, c in done_shards(job.out).items() if k in set(todo))
    working = max(seconds - loading, 1e-9)
    record.update(
        complete=True,
        counts={**counts, "shards": shards},
        # texts_per_second: the texts this invocation processed over its time after loading the model
        timings={
            "seconds": round(seconds, 3),
            "load_seconds": round(loading, 3),
            "texts_per_second": round(texts_now / working, 3),
        },
        versions=_versions(job.engine),
        finished=_now(),
    )
    _write_json(job.out / "run.json", record)
    logger.info(
        "%r: %d texts, %d errors, %d truncated",
        str(job.out),
        counts["texts"],
        counts["errors"],
        counts["truncated"],
    )
    return record


def _check_arguments(
    source: Path,
    model: object,
    engine: str,
    batch: int,
    shard_size: int,
    max_tokens: int,
    max_chars: int,
    num_gpus: float | None,
) -> None:
    if engine not in ENGINES:
        raise ValueError(f"engine ({engine!r}) must be one of {', '.join(ENGINES)}")
    sizes = (
        ("batch", batch),
        ("shard_size", shard_size),
        ("max_tokens", max_tokens),
        ("max_chars", max_chars),
    )
    for label, value in sizes:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{label} ({value!r}) must be a positive integer")
    if num_gpus is not None and num_gpus < 0:
        raise ValueError(f"num_gpus ({num_gpus!r}) must be 0 or more")
    if engine == "ray" and isinstance(model, AttentionModel):
        raise ValueError("the Ray engine loads the model on each worker: pass its name or directory")
    if engine == "ray" and importlib.util.find_spec("ray") is None:
        raise RuntimeError('the Ray engine needs Ray Data: pip install "headscope[ray]" (or --engine local)')
    input_format(source)  # an unknown suffix fails before the file is looked at
    if not source.is_file():
        raise CorpusInputError(f"input {str(source)!r} is not a file")


def _default_name(model: str | Path | None) -> str:
    """The name load_pretrained gives ``model``: the embedded default's, else its directory's."""
    if model is None or str(model) == DEFAULT_MODEL_NAME:
        return DEFAULT_MODEL_NAME
    return Path(str(model)).name


def _check_out(out: Path) -> None:
    """CorpusOutError when ``out`` cannot be a folder: something else is there, or above it."""
    for folder in (out, *out.parents):
        if folder.is_dir():
            return
        if folder.exists() or folder.is_symlink():  # a file, a link to nowhere, ...
            where = "is not a folder" if folder == out else f"lies under {folder}, which is not a folder"
            raise CorpusOutError(f"--out {out} {where}: choose another --out")


def _previous_run(out: Path, identity: dict[str, Any]) -> dict[str, Any] | None:
    """run.json of a run already in ``out`` (None: none, ``out`` empty or absent); CorpusSettingsError when
    it is another run's, CorpusOutError when ``out`` holds files and no run.json (not a run's: a job would
    overwrite them). Our own temporary files (a job killed before its first run.json) do not count."""
    path = out / "run.json"
    if not path.is_file():
        found = sorted(p.name for p in out.iterdir() if not is_temporary(p.name)) if out.is_dir() else []
        if found:
            shown = ", ".join(found[:_NAMED]) + (
                f" and {len(found) - _NAMED} more" if len(found) > _NAMED else ""
            )
            raise CorpusOutError(
                f"{out} holds files but no run.json, so they are not a corpus run's and a run would "
                f"overwrite them ({shown}): choose a new or empty folder for --out"
            )
        return None
    try:
        previous = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise CorpusOutError(f"cannot read {path} ({error.strerror or error})") from None
    except ValueError as error:
        raise CorpusSettingsError(f"{path} is not valid JSON ({error}); use another --out") from None
    if not isinstance(previous, dict):
        raise CorpusSettingsError(
            f"{path} is not a corpus run's (a JSON {type(previous).__name__}); use another --out"
        )
    model = previous.get("model")
    theirs = _flatten(
        {
            **{k: previous.get(k) for k in identity},
            "model": model.get("name") if isinstance(model, dict) else model,
        }
    )
    theirs.setdefault("settings.weighting", "weight")  # a run from before --weighting read the weights
    differences = [
        f"{key} {theirs.get(key)!r} there, {value!r} now"
        for key, value in _flatten(identity).items()
        if theirs.get(key) != value
    ]
    if differences:
        raise CorpusSettingsError(
            f"{out} holds a run with other settings ({'; '.join(differences)}): rerun with the same "
            "arguments to resume it, or choose another --out"
        )
    return previous


def _flatten(value: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, item in value.items():
        if isinstance(item, dict):
            flat.update(_flatten(item, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = item
    return flat


def model_info(job: Job) -> ModelInfo:
    """The model's shape without its weights (the Ray engine loads them on its workers only), from
    check_files, as load_pretrained checks a checkpoint: weights that are cut short, of another family or
    mis-shaped are refused here, with load_pretrained's error, not on a worker after the job began."""
    directory = checkpoint.local_directory(job.model) or checkpoint.fetch(str(job.model))
    converter, _, _, config = check_files(directory)
    cpu, dtype = torch.device("cpu"), torch.float32
    return ModelInfo.of(config, name=job.name, family=converter.family, device=cpu, dtype=dtype)


def _process_ray(job: Job, todo: Sequence[int], progress: Progress | None, info: ModelInfo) -> None:
    try:
        engine = importlib.import_module("mha.corpus.ray_engine")  # imports ray: only when asked for
    except ModuleNotFoundError as error:
        if error.name != "mha.corpus.ray_engine":
            raise
        raise RuntimeError("this headscope has no Ray engine (mha/corpus/ray_engine.py)") from None
    engine.process(job, todo, progress, info)


def release_memory() -> None:
    """Free memory back to the system: the C heap's (torch's tensors) and pyarrow's pool."""
    release_free_memory()
    pa.default_memory_pool().release_unused()


def _counts(out: Path, shards: int) -> dict[str, int]:
    done = done_shards(out)
    missing = [k for k in range(shards) if k not in done]
    if missing:
        raise RuntimeError(f"shards {missing} of {out} were not written: the engine stopped early")
    return {
        key: sum(done[k][key] for k in range(shards)) for key in ("records", "texts", "errors", "truncated")
    }


def _versions(engine: str) -> dict[str, str]:
    names = ["headscope", "torch", "transformers", "pyarrow", *(["ray"] if engine == "ray" else [])]
    versions = {}
    for package in names:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "unknown"
    return versions


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _write_json(path: Path, value: dict[str, Any]) -> None:
    write_atomic(path, lambda p: p.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n"))
