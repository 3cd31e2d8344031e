"""`Parts`: the service's shared parts, each with one job, that a route family's part is made with: the
settings, model access, the answers' cache and flights, the forwards and the encoding threads. One bundle
handed over, so that a part's constructor names only what is its own."""

from __future__ import annotations

from dataclasses import dataclass

from app.service.answers import Answers
from app.service.encoding import EncodingThreads
from app.service.forwards import Forwards
from app.service.model_access import ModelAccess
from app.settings import Settings


@dataclass(frozen=True)
class Parts:
    settings: Settings
    models: ModelAccess  # registry, loads, health and the models list
    answers: Answers  # the LRU cache of answers and the flights of identical requests
    forwards: Forwards  # each model's batcher and workers
    encoders: EncodingThreads  # the threads answers are encoded in, off the loop
