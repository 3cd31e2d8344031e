"""`ModelAccess`: the models the service serves. Every folder and store is scanned once (offers.py); the
registry (app/registry.py) holds each registered model, loaded lazily within the memory budget, with what
each load needs read before it (`load_needs`); loads run on threads of their own (loads.py), the startup's
in the background. Here too what the service says of its models: health and the models list."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import mha
from app.registry import Entry, Registry
from app.schemas.attention import Health, ModelEntry, ModelList, ModelSource
from app.service.loads import Loads, warm_imports
from app.service.offers import default_model, find_models
from app.service.work_watch import WorkWatch
from app.settings import Settings
from mha.loading import gguf
from mha.loading.sources import SOURCES


def load_needs(
    paths: Mapping[str, str | Path], *, dequant_cache_bytes: int | None
) -> Callable[[str, object], int | None]:
    """What loading a registered model needs, read before loading it (Registry's `estimate`): for a GGUF,
    the larger of its predicted first-load memory (mha.loading.gguf.memory: from its header, milliseconds;
    issue 33's stated model of a load) and what its model holds once loaded, its dequantized-weight cache
    at what it can fill included, as the registry counts it after the load (issue 48 E4: the two agree, so
    a model over the budget is refused before it is loaded); else its weights' size on disk (a lower
    bound: a folder's weights load at least as large); None when its startup check read no file."""
    cache = gguf.DEFAULT_DEQUANT_CACHE_BYTES if dequant_cache_bytes is None else dequant_cache_bytes

    def needs(name: str, found: object) -> int | None:
        if not isinstance(found, mha.CheckpointFacts):
            return None
        file = gguf.find_gguf(paths.get(name))
        if file is None:
            return found.size_bytes
        return max(found.size_bytes, gguf.load_need(gguf.read_header(file), cache))

    return needs


def _facts(found: object) -> mha.CheckpointFacts | None:
    """What an entry's passing startup check read (mha.describe_checkpoint), if it read a file."""
    return found if isinstance(found, mha.CheckpointFacts) else None


def _differs(value: int | None, base: int) -> int | None:
    return value if value is not None and value != base else None


class ModelAccess:
    """The registry, where each model came from, and its loads; `watch` hears each load's progress."""

    def __init__(self, settings: Settings, watch: WorkWatch) -> None:
        offers = find_models(settings, progress=watch.load_reporter)  # every folder and store, once
        self.sources = {name: offer.source for name, offer in offers.items()}  # for /api/models
        self.registry: Registry[mha.AttentionModel] = Registry(
            {name: offer.loader for name, offer in offers.items()},
            default=default_model(settings),
            checks={name: offer.check for name, offer in offers.items() if offer.check is not None},
            retry_seconds=settings.load_retry_seconds,
            retry_max_seconds=settings.load_retry_max_seconds,
            max_bytes=settings.models_budget(),
            size_of=lambda model: model.nbytes,
            estimate=load_needs(
                {n: o.path for n, o in offers.items() if o.path is not None},
                dequant_cache_bytes=settings.dequant_cache_bytes,
            ),
        )
        # The registry is looked up at each use: a test may put another in its place before the start.
        self.loads = Loads(lambda: self.registry, prepare=warm_imports, ended=watch.load_ended)

    @property
    def names(self) -> list[str]:
        return self.registry.names

    def resolve(self, name: str | None) -> str:
        """The registered name a request's `model` means (None: the default); UnknownModelError if none."""
        return self.registry.resolve(name)

    async def model(self, name: str) -> mha.AttentionModel:
        """The loaded model, awaited while it loads on a loader thread (loads.py)."""
        return await self.loads.model(name)

    def get(self, name: str) -> mha.AttentionModel:
        """The loaded model (blocking: a worker thread waits here for its model's load)."""
        return self.loads.get(name)

    def loading(self, name: str) -> bool:
        """A load of `name` is in flight, whoever asked for it."""
        return self.loads.loading(name)

    def health(self) -> tuple[bool, Health]:
        """(answering, body): "ok" once the default model is loaded; "loading" while its load is in flight
        (or the startup has yet to begin it); "unavailable" (503) once that load has failed; "unloaded" when
        the memory budget has unloaded it and nothing loads it now (it loads again on its next request).
        Each says what the server is doing, never what it is not (issue 48 E5)."""
        default = self.registry.default
        model = self.registry.loaded(default)
        states = {entry.name: self.state(entry) for entry in self.registry}
        loading = [name for name, state in states.items() if state == "loading"]
        if model is not None:
            status = "ok"
        elif default in loading:
            status = "loading"
        elif states[default] == "failed":
            status = "unavailable"
        else:
            status = "loading" if not self.loads.started.is_set() else "unloaded"
        return status != "unavailable", Health(
            status=status,
            model=default,
            device=str(model.info.device) if model is not None else None,
            loading=loading,
            checking=[name for name, state in states.items() if state == "checking"],
        )

    def state(self, entry: Entry[mha.AttentionModel]) -> str:
        """The entry's state as /api/models and health say it: the registry's, but "loading" from the moment
        a load is asked for (it may wait for the loads' one-time preparation before the registry sees it)."""
        state = self.registry.state(entry)
        return "loading" if state != "loaded" and self.loads.loading(entry.name) else state

    def listing(self, trace_max_tokens: Callable[[mha.AttentionModel], int]) -> ModelList:
        """/api/models: every registered model, what is known of it loaded or not, and the budget."""
        return ModelList(
            default=self.registry.default,
            models=[self._entry(entry, trace_max_tokens) for entry in self.registry],
            sources=[ModelSource(id=source.id, label=source.label) for source in SOURCES],
            memory_budget_bytes=self.registry.max_bytes,
            memory_held_bytes=self.registry.held_bytes(),
        )

    def _entry(
        self, entry: Entry[mha.AttentionModel], trace_max_tokens: Callable[[mha.AttentionModel], int]
    ) -> ModelEntry:
        info = entry.model.info if entry.model is not None else None
        facts = _facts(entry.found)
        # unloaded: what its startup check read from the config (None for a hub id)
        known = loaded_fields(info) if info else {**UNLOADED, "architecture": facts and facts.architecture}
        return ModelEntry(
            name=entry.name,
            **known,
            trace_max_tokens=trace_max_tokens(entry.model) if entry.model is not None else None,
            loaded=info is not None,
            error=entry.error,
            source=self.sources.get(entry.name, "bundled"),
            header_family=facts.family if facts else None,
            parameters=facts.parameters if facts else None,
            quantization=facts.quantization if facts else None,
            size_bytes=facts.size_bytes if facts else None,
            state=self.state(entry),
            memory_bytes=entry.nbytes if entry.model is not None else None,
        )


def loaded_fields(info: mha.ModelInfo) -> dict[str, Any]:
    """What /api/models says of a loaded model from its info alone (a snapshot's entry is this too)."""
    return {
        "family": info.family,
        "layers": info.layers,
        "heads": info.heads,
        "kv_heads": info.kv_heads,
        "chat_template": info.chat_template,
        "byte_level": info.byte_level,
        "max_tokens": info.max_tokens,
        "architecture": info.architecture,
        # the decoder's own shape, when it differs from the encoder's
        "decoder_layers": _differs(info.decoder_layers, info.layers),
        "decoder_heads": _differs(info.decoder_heads, info.heads),
        "causal": info.causal,
        "pretrained": info.pretrained,
    }


# An entry not loaded yet: nothing of its info is known.
UNLOADED: dict[str, Any] = dict.fromkeys(
    ("family", "layers", "heads", "kv_heads", "chat_template", "byte_level", "max_tokens", "architecture")
    + ("decoder_layers", "decoder_heads", "causal", "pretrained")
)
