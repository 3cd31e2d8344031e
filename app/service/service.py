"""`AttentionService`: what the routes call, one per app, made in create_app() and started by its lifespan.
It holds the service's parts, each with one job, and hands each the parts it uses: model access (registry,
loads, health and the models list), the answers' cache and flights, the forwards (each model's batcher and
workers), the encoding threads, the watch of work in flight; then one part per route family made from them
(`attention`, `insight`, `traces`, `effects`, `probes`, `corpus`). Nothing is inherited."""

from __future__ import annotations

import asyncio
from functools import partial

import torch

from app import memory
from app.schemas.attention import ModelList
from app.service.answers import Answers, cache_key
from app.service.attention import Attention
from app.service.corpus import CorpusRuns
from app.service.effects import HeadAblations
from app.service.encoding import EncodingThreads
from app.service.forwards import Forwards
from app.service.insight import Insight
from app.service.model_access import ModelAccess
from app.service.parts import Parts
from app.service.probe import HeadProbes
from app.service.traces import Traces
from app.service.trim import Trimmer
from app.service.views import Views
from app.service.work_watch import WorkWatch
from app.settings import Settings


class AttentionService:
    """The service (module docstring)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.watch = WorkWatch()  # loads' and forwards' progress, for those watching (work_watch.py)
        self.models = ModelAccess(settings, self.watch)
        self.answers = Answers(settings)
        # The C heap handed back after large answers, once nothing is in flight (trim.py).
        self.trimmer = Trimmer(enabled=settings.malloc_trim, busy=self._busy)
        self.forwards = Forwards(
            settings, self.models, self.answers, self.watch, answered=self.trimmer.answered
        )
        self.encoders = EncodingThreads(settings.max_concurrency)
        parts = Parts(settings, self.models, self.answers, self.forwards, self.encoders)
        self.views = Views(parts)
        self.attention = Attention(
            settings,
            self.views,
            self.answers,
            self.encoders,
            self.forwards,
            self.watch,
            done=self.trimmer.large_answer_done,
        )
        self.insight = Insight(settings, self.views, self.answers, self.encoders)
        # freed: a trace's forward ended, or a trace was freed
        self.traces = Traces(parts, freed=self.trimmer.large_answer_done)
        self.effects = HeadAblations(parts, key=partial(cache_key, "head-effects"))
        self.probes = HeadProbes(parts, key=partial(cache_key, "probe"))
        self.corpus = CorpusRuns(settings.runs_dir, served=lambda: self.models.names)

    def _busy(self) -> bool:
        """Work is in flight: answers, streams or traces (the idle trim waits for it)."""
        return self.answers.busy or self.attention.streaming or self.traces.busy

    async def start(self) -> None:
        """Called from the lifespan: allocator and thread settings; the startup checks and the default
        model's load start in the background (loads.py), so this returns at once."""
        if self.settings.malloc_arena_max:
            memory.limit_arenas(self.settings.malloc_arena_max)  # before the workers' threads allocate
        # One pool of intra-op threads for the whole process; with max_concurrency forwards in flight
        # more threads than cores only adds contention.
        torch.set_num_threads(self.settings.threads)
        self.watch.bind(asyncio.get_running_loop())
        self.attention.start()
        self.encoders.start()
        self.models.loads.start()

    def stop(self) -> None:
        self.trimmer.cancel()
        self.models.loads.stop()
        self.forwards.close()
        self.encoders.stop()

    def model_list(self) -> ModelList:
        """/api/models: every model, with the longest input a loaded one traces."""
        return self.models.listing(self.traces.max_tokens)
