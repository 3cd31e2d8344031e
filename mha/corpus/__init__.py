"""The corpus job: what every head does across a whole corpus (docs/design.md "Corpus runs").

- ``source``: the input file streamed as records (.txt, .jsonl, .csv, .parquet); bad ones kept with why.
- ``worker``: ``CorpusWorker``, one model loaded once; a batch of records -> a row of statistics each.
- ``shards``: the shard files (atomic, done markers) both engines write and a resumed job skips.
- ``aggregate``: per_text, per_head, examples and errors from the shards, in bounded memory.
- ``runner``: ``run(source, model, out, ...)``: the folder checked, the missing shards processed by the
  local engine (``local_engine``) or the Ray engine (``ray_engine``), then aggregated.

May import: ``mha.model`` (each worker loads its model once), ``mha.loading``, ``mha.analysis``,
``mha.networks``, ``mha.text``, ``mha.errors`` and ``mha``'s private helpers: the top floor of ``mha``, beside
the service.
Never web code.
"""

from mha.corpus.aggregate import snippets
from mha.corpus.job import ENGINES, WEIGHTINGS, Job, Progress
from mha.corpus.runner import CorpusOutError, CorpusSettingsError, run
from mha.corpus.shards import shard_of, shard_path
from mha.corpus.source import MAX_CHARS, CorpusInputError, Record, read_records
from mha.corpus.worker import CorpusWorker

__all__ = [
    "ENGINES",
    "MAX_CHARS",
    "WEIGHTINGS",
    "CorpusInputError",
    "CorpusOutError",
    "CorpusSettingsError",
    "CorpusWorker",
    "Job",
    "Progress",
    "Record",
    "read_records",
    "run",
    "shard_of",
    "shard_path",
    "snippets",
]
