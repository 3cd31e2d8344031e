"""The one module of app/ that uses `mha`: models, inference off the event loop, caching, encoding.

Routes call `AttentionService`; it resolves the model by registered name, runs `model.attend` in a worker
thread under `torch.inference_mode()` with at most `max_concurrency` inferences per model, and caches
finished answers (the result tensor, the JSON bytes, the gzipped compact bytes) by (model, text, pair).
"""

from __future__ import annotations

import gzip
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import anyio
import numpy as np
import torch
from anyio import to_thread

import mha
from app import compact
from app.cache import LRUCache
from app.errors import InvalidInputError
from app.registry import Registry, scan_models_dir
from app.schemas import AttentionRequest, HeadRequest, Health, ModelEntry, ModelList
from app.settings import DEFAULT_MODEL, Settings

logger = logging.getLogger(__name__)

T = TypeVar("T")

# The size of the "random" model (our layers, untrained weights), documented in /api/models and README.
RANDOM_MODEL = "random"
RANDOM_SIZE = {"layers": 4, "heads": 8, "embed_dim": 256}


@dataclass(frozen=True)
class Computed:
    """What the service keeps of an `mha.AttentionResult`: the header fields and the attention."""

    header: dict[str, Any]
    attentions: torch.Tensor  # float32 CPU [L, H, n, n]


def _dtype(name: str) -> torch.dtype | None:
    return None if name == "auto" else getattr(torch, name)


def build_loaders(settings: Settings) -> dict[str, Callable[[], Any]]:
    """name -> zero-argument loader. Operator entries override scanned ones, which override built-ins."""
    dtype = _dtype(settings.dtype)
    loaders: dict[str, Callable[[], Any]] = {
        DEFAULT_MODEL: partial(mha.load_pretrained, device=settings.device, dtype=dtype, name=DEFAULT_MODEL)
    }
    if settings.random_model:
        loaders[RANDOM_MODEL] = partial(
            mha.random_model, **RANDOM_SIZE, causal=False, seed=0, device=settings.device, name=RANDOM_MODEL
        )
    paths = scan_models_dir(settings.models_dir) if settings.models_dir is not None else {}
    paths.update(settings.models)
    for name, path in paths.items():
        loaders[name] = partial(
            mha.load_pretrained, str(path), device=settings.device, dtype=dtype, name=name
        )
    return loaders


class AttentionService:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.registry: Registry[Any] = Registry(build_loaders(settings), default=settings.default_model)
        self.cache = LRUCache(max_entries=settings.cache_size, max_bytes=settings.cache_max_bytes)
        self._limiters: dict[str, anyio.CapacityLimiter] = {}

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Called from the lifespan, inside the event loop: thread settings, limiters, the default model."""
        # One pool of intra-op threads for the whole process; with max_concurrency requests in flight
        # more threads than cores only adds contention.
        torch.set_num_threads(self.settings.threads)
        self._limiters = {
            name: anyio.CapacityLimiter(self.settings.max_concurrency) for name in self.registry.names
        }
        started = time.perf_counter()
        try:
            await to_thread.run_sync(self.registry.get, None)
        except Exception:
            # Reported by /api/health and /api/models; the rest of the service still answers.
            logger.exception("default model %r failed to load", self.registry.default)
        else:
            logger.info("default model ready in %.1f s", time.perf_counter() - started)

    # -- descriptions ----------------------------------------------------------------------------

    def health(self) -> tuple[bool, Health]:
        model = self.registry.loaded(self.registry.default)
        device = str(model.info.device) if model is not None else None
        return model is not None, Health(
            status="ok" if model is not None else "loading", model=self.registry.default, device=device
        )

    def models(self) -> ModelList:
        entries = []
        for entry in self.registry:
            info = entry.model.info if entry.model is not None else None
            entries.append(
                ModelEntry(
                    name=entry.name,
                    family=info.family if info else None,
                    layers=info.layers if info else None,
                    heads=info.heads if info else None,
                    max_tokens=info.max_tokens if info else None,
                    causal=info.causal if info else None,
                    pretrained=info.pretrained if info else None,
                    loaded=info is not None,
                    error=entry.error,
                )
            )
        return ModelList(default=self.registry.default, models=entries)

    # -- answers ---------------------------------------------------------------------------------

    async def attention_json(self, request: AttentionRequest) -> bytes:
        return await self._cached("json", request, self._encode_json)

    async def attention_compact(self, request: AttentionRequest, *, gzipped: bool, scheme: str) -> bytes:
        body = await self._cached(f"hsa1.gz:{scheme}", request, partial(self._encode_compact, scheme=scheme))
        # Almost every client accepts gzip; the rare one that does not pays for one decompression.
        return body if gzipped else gzip.decompress(body)

    async def head(self, request: HeadRequest) -> dict[str, Any]:
        name = self.registry.resolve(request.model)
        computed = await self._run(name, partial(self._compute, name, request.text, request.text_pair))
        layers, heads = computed.header["layers"], computed.header["heads"]
        if request.layer >= layers:
            raise InvalidInputError(
                f"layer {request.layer} is out of range: model {name!r} has layers 0..{layers - 1}"
            )
        if request.head >= heads:
            raise InvalidInputError(
                f"head {request.head} is out of range: model {name!r} has heads 0..{heads - 1}"
            )
        return {
            "model": name,
            "tokens": computed.header["tokens"],
            "layer": request.layer,
            "head": request.head,
            # float32 -> Python float is exact, so this is the model's full precision.
            "attention": computed.attentions[request.layer, request.head].tolist(),
        }

    # -- internals -------------------------------------------------------------------------------

    async def _cached(
        self, kind: str, request: AttentionRequest, encode: Callable[[Computed], bytes]
    ) -> bytes:
        name = self.registry.resolve(request.model)
        key = (kind, name, request.text, request.text_pair)
        hit = self.cache.get(key)
        if hit is not None:
            return hit  # type: ignore[no-any-return]

        def work() -> bytes:
            # Another request may have finished the same answer while this one waited for a slot.
            again = self.cache.get(key)
            if again is not None:
                return again  # type: ignore[no-any-return]
            body = encode(self._compute(name, request.text, request.text_pair))
            self.cache.put(key, body, size=len(body))
            return body

        return await self._run(name, work)

    async def _run(self, name: str, fn: Callable[[], T]) -> T:
        limiter = self._limiters.get(name)
        if limiter is None:  # start() not run (a bare service in a script): create on first use
            limiter = self._limiters[name] = anyio.CapacityLimiter(self.settings.max_concurrency)
        return await to_thread.run_sync(fn, limiter=limiter)

    def _compute(self, name: str, text: str, pair: str | None) -> Computed:
        """Blocking: the model's answer for (text, pair), from the cache or one forward pass."""
        key = ("result", name, text, pair)
        hit = self.cache.get(key)
        if hit is not None:
            return hit  # type: ignore[no-any-return]
        _, model = self.registry.get(name)
        limit = min(self.settings.max_tokens, model.info.max_tokens)
        started = time.perf_counter()
        try:
            with torch.inference_mode():
                result = model.attend(text, pair, max_tokens=limit)
        except mha.EmptyInputError as exc:
            raise InvalidInputError(f"{exc}; give text the tokenizer turns into at least one token") from exc
        attentions = result.attentions.to(device="cpu", dtype=torch.float32).contiguous()
        L, H, n, _ = attentions.shape
        header = {
            "model": name,
            "tokens": list(result.tokens),
            "segments": list(result.segments),
            "special": [bool(s) for s in result.special],
            "layers": int(L),
            "heads": int(H),
            "n": int(n),
            "truncated": bool(result.truncated),
            "causal": bool(model.info.causal),
        }
        # Never log the text itself: only its size and what it cost.
        logger.debug("model %r: %d tokens in %.1f ms", name, n, 1000 * (time.perf_counter() - started))
        computed = Computed(header, attentions)
        self.cache.put(key, computed, size=attentions.numel() * 4)
        return computed

    @staticmethod
    def _encode_json(computed: Computed) -> bytes:
        rounded = np.round(computed.attentions.numpy().astype(np.float64), 6)
        body = {**computed.header, "attention": rounded.tolist()}
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")

    @staticmethod
    def _encode_compact(computed: Computed, *, scheme: str) -> bytes:
        return compact.compress(compact.encode(computed.header, computed.attentions, scheme=scheme))
