"""A chat request's template rendered before any shared pool sees it (issue 33 item 3).

A chat template is untrusted code that mha.text.chat runs in a worker process, bounded in time, memory
and output. What waits for that worker must not be a thread other models need: the encoding threads
(encoding.py) are shared by every model, so a route that tokenizes a chat request there (head effects'
check, a trace's token count) first renders it here, on anyio's threads under a limiter of its own, and
its later encodings read the model's cache of rendered chats (TextEncoder.chat_text). A forward's
own rendering runs in that model's worker, which no other model uses.
"""

from __future__ import annotations

import anyio
from anyio import to_thread

import mha

__all__ = ["RENDERS_AT_ONCE", "prerender"]

# Renders waited for at once (each holds one anyio thread while its worker renders, 2 s at most); more
# wait on the limiter, holding no thread. mha.text.chat runs two renders at a time.
RENDERS_AT_ONCE = 4
_renders: anyio.CapacityLimiter | None = None


async def prerender(model: mha.AttentionModel, text: str, chat: bool) -> None:
    """Render `text` in `model`'s chat template when `chat` asks for it and the model has one; a template
    that fails raises its ChatTemplateError (a 422) here, before any work is queued."""
    global _renders
    if not chat or not model.encoder.has_chat_template:
        return
    if _renders is None:
        _renders = anyio.CapacityLimiter(RENDERS_AT_ONCE)
    await to_thread.run_sync(model.encoder.chat_text, text, limiter=_renders)
