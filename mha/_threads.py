"""CPU work split across Python threads, each running torch on one thread of its own.

torch releases the GIL inside its operators, so T Python threads with one intra-op thread each keep T
cores busy with one barrier per piece of work, where torch's own T threads split every operator and
meet at a barrier after each: thousands a second on small operators, and each one stalls every thread
whenever one of them is descheduled on a busy machine. Results are those of a one-thread run, whichever
thread computes them.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import TypeVar

import torch

__all__ = ["deal", "in_order", "one_thread_each", "prefetched"]

K = TypeVar("K")
A = TypeVar("A")
R = TypeVar("R")
T = TypeVar("T")

_WORKERS: dict[int, ThreadPoolExecutor] = {}  # by their count, made on first use
_WORKERS_LOCK = threading.Lock()


@contextmanager
def one_thread_each(threads: int) -> Iterator[ThreadPoolExecutor]:
    """`threads` Python workers whose torch operations each run on one thread, torch's intra-op threads
    restored after. The setting is process-wide: one such section at a time, so two concurrent sections
    never restore each other's one thread."""
    with _WORKERS_LOCK:
        if threads not in _WORKERS:
            _WORKERS[threads] = ThreadPoolExecutor(threads, thread_name_prefix="one-thread")
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            yield _WORKERS[threads]
        finally:
            torch.set_num_threads(before)


def in_order(function: Callable[[A], R], items: Iterable[tuple[K, A]], threads: int) -> Iterator[tuple[K, R]]:
    """(key, function(argument)) for each (key, argument) of `items`, in their order, computed `threads` at
    a time in a one_thread_each section (threads == 1: in this thread, torch's threads untouched). At most
    2 × threads items are taken ahead of the one yielded, so memory stays a few items whatever the input."""
    if threads <= 1:
        for key, argument in items:
            yield key, function(argument)
        return
    with one_thread_each(threads) as workers:
        pending: deque[tuple[K, Future[R]]] = deque()
        try:
            yield from _ahead(workers, function, items, 2 * threads - 1, pending)
        finally:
            wait([future for _, future in pending])  # none still running once torch's threads are restored


def prefetched(function: Callable[[A], R], items: Iterable[tuple[K, A]], ahead: int) -> Iterator[tuple[K, R]]:
    """(key, function(argument)) for each of `items`, in order, each computed in one background thread up
    to `ahead` items before the caller takes it: the host's work on the next items overlaps what the
    caller does with this one (an accelerator's loop queuing kernels). `items` is read in this thread;
    torch's threads are left as they are. Python holds one lock at a time (the GIL), so what overlaps is
    what releases it: a tokenizer's native code, numpy, Arrow, torch's operators."""
    if ahead < 1:
        raise ValueError(f"ahead ({ahead}) must be at least 1")
    with ThreadPoolExecutor(1, thread_name_prefix="prefetch") as worker:
        pending: deque[tuple[K, Future[R]]] = deque()
        try:
            yield from _ahead(worker, function, items, ahead, pending)
        finally:
            for _, future in pending:  # a caller that stops early: nothing left running behind it
                future.cancel()


def _ahead(
    workers: ThreadPoolExecutor,
    function: Callable[[A], R],
    items: Iterable[tuple[K, A]],
    ahead: int,
    pending: deque[tuple[K, Future[R]]],
) -> Iterator[tuple[K, R]]:
    """(key, function(argument)) for each of `items`, in order, submitted to `workers` up to `ahead` items
    before the one yielded. `pending` holds what is submitted and not yet yielded, for the caller to wait
    for or cancel when it stops early."""
    for key, argument in items:
        pending.append((key, workers.submit(function, argument)))
        if len(pending) > ahead:
            first, future = pending.popleft()
            yield first, future.result()
    while pending:
        first, future = pending.popleft()
        yield first, future.result()


def deal(work: Callable[[int, Iterator[T]], None], blocks: Sequence[T], threads: int) -> None:
    """work(i, its blocks) for each i < threads on its own CPU thread, torch on one thread in each
    (one_thread_each); each thread's iterator hands it the next block when it asks, the last first.

    Each thread runs its blocks alone, as SDPA's kernel gives each thread its own tiles: a block's dozen
    operations, each split across the threads, made as many barriers where a thread descheduled by a busy
    machine stalls the other. Handed out one at a time, a descheduled thread holds back only the block it
    is in, not a fixed share; the last blocks first, as a decoder's see the most keys."""
    lock, left = threading.Lock(), list(blocks)

    def take() -> Iterator[T]:
        while True:
            with lock:
                if not left:
                    return
                block = left.pop()
            yield block

    with one_thread_each(threads) as workers:
        done = [workers.submit(work, i, take()) for i in range(threads)]
        wait(done)  # all finished before an error is raised or the threads restored
        for future in done:
            future.result()
