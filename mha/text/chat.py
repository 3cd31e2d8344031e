"""Chat templates rendered with bounds: a template is untrusted code, so it runs in a worker process that
can be stopped.

A chat template comes with the checkpoint (tokenizer_config.json, chat_template.jinja, a GGUF's
`tokenizer.chat_template`), from anywhere. transformers renders it in a Jinja sandbox, which stops an
escape but not a loop (`range(100000)` nested), a 60 MB output or a deep recursion: in the calling thread
none of these can be stopped. Here transformers' own `render_jinja_template` (what
`apply_chat_template(tokenize=False)` calls, so the string is the same) runs in a worker process of a
small pool, under three bounds:

- time: a render longer than `RENDER_SECONDS` (or one whose caller cancels) kills its worker;
- memory: the worker's address space is capped at what it holds after start plus `RENDER_BYTES`;
- output: a rendered string longer than `MAX_RENDERED_CHARS` is refused.

Every failure is a `ChatTemplateError` (an `InputError`) whose sentence names the template and the bound
or the template's own error (syntax, sandbox, `raise_exception`, overflow, recursion).

The worker is `_chat_worker.py`, run by path in isolated mode (`python -I`), so it imports transformers'
chat-template utilities and jinja2, never torch or this package. Workers are kept between renders and
started again after a kill; `POOL_SIZE` renders run at once, later ones wait their turn, each wait bounded by
the renders before it.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mha.errors import Cancelled, ChatTemplateError

__all__ = ["MAX_RENDERED_CHARS", "RENDER_BYTES", "RENDER_SECONDS", "prewarm", "render_chat", "shutdown"]

# A real template renders a one-turn chat in about a millisecond; a worker's first render also pays
# transformers' import (~1.5 s of CPU, more under load), which the start wait covers, not this bound.
RENDER_SECONDS = 2.0
# A rendered chat is tokenized whole; a million characters is far past any model's context.
MAX_RENDERED_CHARS = 1_000_000
# What a render may allocate beyond the worker's started size: room for Jinja's output buffers at
# MAX_RENDERED_CHARS many times over, and small beside the machine.
RENDER_BYTES = 512 * 2**20
# A worker's start (python -I, transformers' chat utilities, jinja2): generous, since a loaded machine
# takes several seconds.
START_SECONDS = 60.0
POOL_SIZE = 2  # renders at once; each takes a process of ~60 MB

_WORKER = Path(__file__).with_name("_chat_worker.py")


class _Worker:
    """One worker process and its pipes; one render at a time."""

    def __init__(self) -> None:
        env = {key: value for key, value in os.environ.items() if key.startswith(("LANG", "LC_", "TZ"))}
        env["RENDER_BYTES"] = str(RENDER_BYTES)
        self.process = subprocess.Popen(  # noqa: S603 - our own script, by absolute path, no shell
            [sys.executable, "-I", str(_WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        self.buffer = b""
        self.ready = False

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()

    def read_line(self, deadline: float, cancel: Callable[[], bool] | None) -> bytes | None:
        """One line from the worker by `deadline`, polling `cancel`; None when the worker closed it."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        while b"\n" not in self.buffer:
            if cancel is not None and cancel():
                raise Cancelled()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            readable, _, _ = select.select([fd], [], [], min(left, 0.05))
            if readable:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    return None
                self.buffer += chunk
                if len(self.buffer) > 8 * MAX_RENDERED_CHARS + 4096:  # JSON escapes at most ~6x
                    raise ChatTemplateError(reason=f"wrote more than {MAX_RENDERED_CHARS:,} characters")
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line


class _Pool:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.slots = threading.Semaphore(POOL_SIZE)
        self.idle: list[_Worker] = []
        self.closed = False

    def take(self) -> _Worker:
        with self.lock:
            return self.idle.pop() if self.idle else _Worker()

    def give(self, worker: _Worker) -> None:
        with self.lock:
            if self.closed:
                worker.kill()
            else:
                self.idle.append(worker)

    def shutdown(self) -> None:
        with self.lock:
            workers, self.idle = self.idle, []
        for worker in workers:
            worker.kill()


_pool = _Pool()
atexit.register(_pool.shutdown)


def prewarm() -> None:
    """Start a worker now, when none is idle, so that the first chat a model renders does not wait for
    its start (a model with a chat template calls this at load). Returns at once."""
    with _pool.lock:
        if not _pool.idle and not _pool.closed:
            _pool.idle.append(_Worker())


def shutdown() -> None:
    """Stop the idle workers (a later render starts new ones)."""
    _pool.shutdown()


def render_chat(
    template: str,
    messages: list[dict[str, str]],
    variables: Mapping[str, Any],
    *,
    add_generation_prompt: bool = True,
    cancel: Callable[[], bool] | None = None,
    seconds: float | None = None,
) -> str:
    """`messages` rendered by `template` as transformers' apply_chat_template(tokenize=False) renders them
    (`variables`: the tokenizer's special tokens, as it passes them), within the module's bounds.

    Raises ChatTemplateError (the template failed or passed a bound; its worker is stopped) or Cancelled
    (`cancel()` turned true while it rendered; its worker is stopped too). `seconds`: the time bound,
    RENDER_SECONDS (read at the call) when None."""
    job = json.dumps(
        {
            "template": template,
            "messages": messages,
            "variables": dict(variables),
            "add_generation_prompt": add_generation_prompt,
        }
    ).encode()
    with _pool.slots:
        worker = _pool.take()
        try:
            reply = _run(worker, job, cancel, RENDER_SECONDS if seconds is None else seconds)
        except BaseException:
            worker.kill()  # a worker stopped mid-render is never reused
            raise
        _pool.give(worker)  # the template's own error left its worker as it was: reused
    if isinstance(reply, ChatTemplateError):
        raise reply
    return reply


def _run(
    worker: _Worker, job: bytes, cancel: Callable[[], bool] | None, seconds: float
) -> str | ChatTemplateError:
    """The rendered string, or the error the template itself raised in a worker that is still sound; a
    raise here (time, memory, a broken worker, cancel) means the worker must be stopped."""
    if not worker.ready:
        line = worker.read_line(time.monotonic() + START_SECONDS, cancel)
        if line != b"ready":
            raise ChatTemplateError(reason="could not be rendered: the template worker did not start")
        worker.ready = True
    assert worker.process.stdin is not None
    try:
        worker.process.stdin.write(job + b"\n")
        worker.process.stdin.flush()
    except BrokenPipeError:
        raise ChatTemplateError(reason="could not be rendered: the template worker stopped") from None
    try:
        line = worker.read_line(time.monotonic() + seconds, cancel)
    except TimeoutError:
        raise ChatTemplateError(reason=f"took longer than {seconds:g} s to render and was stopped") from None
    if line is None:  # killed under the memory cap, or crashed
        raise ChatTemplateError(
            reason=f"was stopped: rendering it needed more than {RENDER_BYTES // 2**20} MiB of memory"
        )
    reply = json.loads(line)
    if reply["ok"]:
        rendered: str = reply["text"]
        if len(rendered) > MAX_RENDERED_CHARS:
            return ChatTemplateError(reason=f"wrote more than {MAX_RENDERED_CHARS:,} characters")
        return rendered
    return ChatTemplateError(reason=_reason(reply["kind"], reply["message"]))


def _reason(kind: str, message: str) -> str:
    """The sentence's end for a worker's error `kind` (the exception's class name)."""
    message = message.strip().splitlines()[0][:300] if message.strip() else ""
    if kind == "TemplateSyntaxError":
        return f"is not valid Jinja: {message}"
    if kind == "SecurityError":
        return f"tried something the sandbox forbids: {message}"
    if kind == "TemplateError":  # the template's own raise_exception(): it refuses this chat
        return f"refused this input: {message}"
    if kind == "MemoryError":
        return f"was stopped: rendering it needed more than {RENDER_BYTES // 2**20} MiB of memory"
    if kind == "RecursionError":
        return "recursed too deeply and was stopped"
    if kind == "TooLong":
        return f"wrote more than {MAX_RENDERED_CHARS:,} characters"
    return f"failed to render ({kind}: {message})" if message else f"failed to render ({kind})"
