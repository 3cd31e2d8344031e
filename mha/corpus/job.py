"""What one corpus run is asked to do (Job), as both engines read it, and its identity in run.json."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mha.corpus.source import count_records, input_format

__all__ = ["ENGINES", "Job", "Progress"]

ENGINES = ("local", "ray")

# progress(records done, records in all): called after each batch (and once at the start of a resumed run).
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Job:
    source: Path  # the input file
    out: Path  # the run's folder
    model: str | None  # a name or path as load_pretrained takes it (None: the embedded default)
    name: str  # the model's name in run.json (the service's name for it, so the page can open it)
    records: int  # records in the input (lines 1..records); shards are cut by line
    engine: str = "local"
    batch: int = 32  # records per padded forward; a shard's last batch may be shorter
    words: bool = False
    shard_size: int = 1000  # records per shard: the unit of resuming
    max_tokens: int = 512  # tokens per text at most (the model's own limit if lower)
    device: str = "auto"
    num_gpus: float | None = None  # Ray: GPUs per worker (None: 1 where the cluster has GPUs, else 0)

    def worker_kwargs(self) -> dict[str, Any]:
        """CorpusWorker's keyword arguments, bar the model (Ray's fn_constructor_kwargs)."""
        return {"name": self.name, "words": self.words, "max_tokens": self.max_tokens, "device": self.device}

    def settings(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "words": self.words,
            "shard_size": self.shard_size,
            "max_tokens": self.max_tokens,
        }

    def input(self) -> dict[str, Any]:
        """run.json's "input": the file's name, format, size and content hash (what a resume checks)."""
        digest = hashlib.sha256()
        with self.source.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        return {
            "name": self.source.name,
            "format": input_format(self.source),
            "bytes": self.source.stat().st_size,
            "sha256": digest.hexdigest(),
        }

    @staticmethod
    def count(source: Path) -> int:
        return count_records(source)
