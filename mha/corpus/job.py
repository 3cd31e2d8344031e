"""What one corpus run is asked to do (Job), as both engines read it, and its identity in run.json."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mha.analysis.batched import STATS
from mha.analysis.detection import KINDS
from mha.corpus.source import MAX_CHARS, Tally, count_records, input_format

__all__ = ["ENGINES", "SCORES", "STATISTICS", "WEIGHTINGS", "Job", "Progress"]

ENGINES = ("local", "ray")
# What the statistics read: the attention weights, or weight × value norm shares (CorpusWorker).
WEIGHTINGS = ("weight", "norm")
# The per-text statistics a run writes, in its files' order: head_stats' (mha.analysis.batched), then the
# detection scores by the probe's measure (mha.analysis.detection), null where the text has no row with a
# pattern key (no repeated token: no duplicate or induction score), left out of the corpus means.
SCORES = KINDS
STATISTICS = (*STATS, *SCORES)

# progress(records done, records in all): called after each batch (and once at the start of a resumed run).
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Job:
    source: Path  # the input file
    out: Path  # the run's folder
    model: str | None  # a name or path as load_pretrained takes it (None: the embedded default)
    name: str  # the model's name in run.json (the service's name for it, so the page can open it)
    records: int  # records in the input (lines 1..records); shards are cut by line
    input_bytes: int  # the input's size and SHA-256 (hex), read with the count (Job.survey)
    input_sha256: str
    engine: str = "local"
    batch: int = 32  # records per padded forward; a shard's last batch may be shorter
    words: bool = False
    weighting: str = "weight"  # one of WEIGHTINGS
    shard_size: int = 1000  # records per shard: the unit of resuming
    max_tokens: int = 512  # tokens per text at most (the model's own limit if lower)
    max_chars: int = MAX_CHARS  # characters per text (and pair) at most, cut as the input is read
    device: str = "auto"
    num_gpus: float | None = None  # Ray: GPUs per worker (None: 1 where the cluster has GPUs, else 0)

    def worker_kwargs(self) -> dict[str, Any]:
        """CorpusWorker's keyword arguments, bar the model (Ray's fn_constructor_kwargs)."""
        return {
            "name": self.name,
            "words": self.words,
            "weighting": self.weighting,
            "max_tokens": self.max_tokens,
            "device": self.device,
        }

    def settings(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "words": self.words,
            "weighting": self.weighting,
            "shard_size": self.shard_size,
            "max_tokens": self.max_tokens,
            "max_chars": self.max_chars,
        }

    def input(self) -> dict[str, Any]:
        """run.json's "input": the file's name, format, size and content hash (what a resume checks)."""
        return {
            "name": self.source.name,
            "format": input_format(self.source),
            "bytes": self.input_bytes,
            "sha256": self.input_sha256,
        }

    @staticmethod
    def survey(source: Path) -> dict[str, Any]:
        """Job's `records`, `input_bytes` and `input_sha256` of `source`, from one read of the file (the
        work pass reads it once more: three reads of a large corpus were two too many)."""
        tally = Tally()
        records = count_records(source, tally)
        return {"records": records, "input_bytes": tally.bytes, "input_sha256": tally.sha256.hexdigest()}
