"""Which heads matter: `HeadAblations` runs a model's head ablation (mha.analysis.ablation's
model.head_effects, each head's output zeroed in turn, L·H/2 forwards' worth, whose result is mha's
`HeadEffects`) on the model's workers and answers it as NDJSON: a progress line per layer for models of more
than PROGRESS_HEADS heads, then the result (`HeadEffectsDone`).

The result's line is cached in the service's LRU by (model, text, pair, new tokens, chat, target), and
identical requests in flight share one computation (the service's `cached`: Flights); each client streaming
it hears its progress from the next layer on. When every client has hung up, the ablations stop before the
next layer. What the input cannot be (an unknown model, an encoder asked to continue, a target for a model
that is not an encoder-decoder, a text without tokens) is refused before the stream begins, as a plain 4xx.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable, Hashable
from functools import partial
from typing import Any

import torch

import mha
from app.errors import InvalidInputError
from app.schemas.effects import PROGRESS_HEADS, EffectsSection, HeadEffectsDone, HeadEffectsRequest
from app.service.cached_lines import CachedLines
from app.service.computed import article
from app.service.flights import settled
from app.service.parts import Parts
from app.service.templates import prerender
from mha.analysis import HeadEffects
from mha.errors import NotCausalError
from mha.networks import DEFAULT_NEW_TOKENS

# (registered model name, text, pair, tokens to write (None: none; an encoder-decoder's resolved to what it
# writes), chat, an encoder-decoder's target): what an ablation depends on, as the attention's Input, for
# the service's one key builder.
Source = tuple[str, str, str | None, int | None, bool, str | None]


def _floats(values: torch.Tensor | None) -> Any:
    # float32 -> the Python floats they equal; JSON writes each as the shortest decimal that reads back
    return None if values is None else values.tolist()


def done_line(name: str, model: mha.AttentionModel, effects: HeadEffects) -> bytes:
    """The result as the stream's last line (encoding thread)."""
    info = model.info
    sections = None
    if effects.sections is not None:
        sections = {
            kind: EffectsSection(
                layers=int(part.effects.shape[0]),
                heads=int(part.effects.shape[1]),
                effects=_floats(part.effects),
                steps=_floats(part.steps),
            )
            for kind, part in effects.sections.items()
        }
    done = HeadEffectsDone(
        model=name,
        tokens=effects.tokens,
        n=len(effects.tokens),
        truncated=effects.truncated,
        byte_level=info.byte_level,
        causal=info.causal,
        layers=effects.layers,
        heads=effects.heads,
        measure=effects.measure,  # type: ignore[arg-type]
        effects=_floats(effects.effects),
        generated=effects.generated,
        positions=effects.positions,
        steps=_floats(effects.steps),
        top_tokens=effects.top_tokens,
        top_probs=effects.top_probs,
        pooled=_floats(effects.pooled),
        sections=sections,  # type: ignore[arg-type]
        source_tokens=effects.source_tokens,
    )
    return done.model_dump_json().encode() + b"\n"


class HeadAblations:
    """The service's head ablations (module docstring), run on the model's workers by a CachedLines of the
    service's parts."""

    def __init__(self, parts: Parts, *, key: Callable[[Source], Hashable]) -> None:
        self._work = CachedLines(
            parts,
            key=key,
            event=lambda done, layers: {"event": "progress", "done": done, "layers": layers},
            what="the head effects",
            failed="measuring the head effects failed on the server (logged)",
        )

    async def stream(self, request: HeadEffectsRequest) -> AsyncIterator[bytes]:
        """NDJSON lines: {"event": "progress", "done": d, "layers": L} after each layer's ablations (models
        of more than PROGRESS_HEADS heads), then the result, or {"event": "error", "detail": ...}. Errors
        found before the work (unknown model, a target it cannot take, the input's own) are raised here,
        for a 4xx."""
        name = self._work.models.resolve(request.model)
        new_tokens = request.max_new_tokens
        if new_tokens is not None and new_tokens > self._work.settings.max_new_tokens:
            raise InvalidInputError(
                f"max_new_tokens ({new_tokens}) is over this service's limit "
                f"({self._work.settings.max_new_tokens}, HEADSCOPE_MAX_NEW_TOKENS)"
            )
        model = await self._work.models.model(name)  # loaded on a loader thread; at once once loaded
        info = model.info
        if request.target is not None and info.seq2seq:
            new_tokens = None  # the target is read, nothing written
        elif info.seq2seq and new_tokens is None:  # it writes its target first, as /api/attention
            new_tokens = min(DEFAULT_NEW_TOKENS, self._work.settings.max_new_tokens)
        elif not info.seq2seq:
            new_tokens = new_tokens or None  # 0 and null: the text alone
        source: Source = (name, request.text, request.text_pair, new_tokens, request.chat, request.target)
        key = self._work.key(source)
        hit = self._work.get(key)
        if hit is None:
            await prerender(model, request.text, request.chat)  # not in the shared encoding threads
            await self._work.off_loop(self._check, model, source)
        return self._work.events(key, partial(self._compute, source, key), hit=hit)

    def _check(self, model: mha.AttentionModel, source: Source) -> None:
        """Refuse what the ablation cannot take, before any work (encoding thread: the tokenizer alone)."""
        name, text, pair, new_tokens, chat, target = source
        info = model.info
        if target is not None and not info.seq2seq:
            raise InvalidInputError(
                f"{name!r} is {article(info.architecture)} model: only encoder-decoder models take a target "
                "(T5, BART, Marian); send no target"
            )
        if new_tokens and not (info.causal or info.seq2seq):
            raise NotCausalError(name)
        model.encoder.encode_batch([(text, pair)], self._limit(model), chat=chat)  # an InputError: 422
        if target is not None:
            model.encoder.encode_target(target, self._limit(model))

    def _limit(self, model: mha.AttentionModel) -> int:
        return self._work.settings.tokens_for(model.info.max_tokens)

    async def _compute(self, source: Source, key: Hashable, abandoned: threading.Event) -> bytes:
        name, text, pair, new_tokens, chat, target = source
        report = self._work.progress.reporter(key)

        def work(model: mha.AttentionModel) -> tuple[mha.AttentionModel, HeadEffects]:
            info = model.info
            heads = info.layers * info.heads
            if info.seq2seq:  # its three attentions' heads
                heads += 2 * (info.decoder_layers or 0) * (info.decoder_heads or 0)
            with torch.inference_mode():
                effects = model.head_effects(
                    text,
                    pair,
                    max_tokens=self._limit(model),
                    max_new_tokens=new_tokens,
                    target=target,
                    chat=chat,
                    cancel=abandoned.is_set,  # asked before each layer: stop once nobody waits
                    progress=report if heads > PROGRESS_HEADS else None,
                )
            return model, effects

        model, effects = await settled(self._work.submit(name, work, abandoned))
        body: bytes = await self._work.off_loop(done_line, name, model, effects)
        return body
