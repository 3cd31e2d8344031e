"""`Views`: what every answer of a text is built from. A request becomes its input (`Input`: the resolved
model and what the forward depends on); the forward's token-level result (forwards.py) is weighted by the
value norms (weighting "norm") and merged to words (`words`) in the encoding threads, each view cached
apart in the answers' LRU; an answer is then encode(view), off the loop, cached under its kind."""

from __future__ import annotations

import threading

from app.errors import InvalidInputError
from app.schemas.attention import AttentionRequest, InputText
from app.service import bodies
from app.service.answers import Input, cache_key
from app.service.computed import Computed, merge_words, weigh_by_norm
from app.service.forwards import GENERATE
from app.service.parts import Parts


class Views:
    """Inputs, their views and the answers encoded from them, over the parts they are made with."""

    def __init__(self, parts: Parts) -> None:
        self.settings = parts.settings
        self._models, self._answers, self._forwards = parts.models, parts.answers, parts.forwards
        self._encoders = parts.encoders

    def input(self, request: InputText) -> Input:
        name = self._models.resolve(request.model)
        if request.max_new_tokens is not None and request.max_new_tokens > self.settings.max_new_tokens:
            raise InvalidInputError(
                f"max_new_tokens ({request.max_new_tokens}) is over this service's limit "
                f"({self.settings.max_new_tokens}, HEADSCOPE_MAX_NEW_TOKENS)"
            )
        # generate: "" (a blank target never gets here as one: the schema makes it None), so a model that
        # cannot write a target refuses it in the forward, and the cache keeps it apart from a plain request.
        target = GENERATE if request.generate else request.target
        probe = None if request.probe is None else (request.probe.seed, request.probe.length)
        return (name, request.text, request.text_pair, request.max_new_tokens, request.chat, target, probe)

    async def encoded(self, kind: str, request: AttentionRequest, encode: bodies.Encoder) -> bytes:
        """The cached answer of `kind`: encode(view) of the request's view, off the loop."""
        source = self.input(request)

        async def compute(abandoned: threading.Event) -> bytes:
            view = await self.view(source, words=request.words, weighting=request.weighting)
            return await self._encoders.off_loop(encode, view, abandoned)

        key = cache_key(kind, source, extra=(request.words, request.weighting))
        return await self._answers.cached(key, compute)

    async def view(self, source: Input, *, words: bool, weighting: str = "weight") -> Computed:
        """The token-level result; weighted by norm (computed.weigh_by_norm) for weighting "norm"; then
        (words) merged to words. Each view is cached apart in the same LRU."""
        off_loop = self._encoders.off_loop
        computed = await self._forwards.computed(source, norms=weighting == "norm")
        if weighting == "norm":
            token_level = computed
            computed = await self._answers.cached(
                cache_key("norm", source), lambda _abandoned: off_loop(weigh_by_norm, token_level)
            )
        if not words:
            return computed
        weighted = computed
        return await self._answers.cached(
            cache_key("words", source, extra=(weighting,)), lambda _abandoned: off_loop(merge_words, weighted)
        )
