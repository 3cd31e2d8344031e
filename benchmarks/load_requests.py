"""What the load test's clients send and count (benchmarks/load.py and its phases): the routes, the texts
(each request's own, so that only the identical phase hits the cache), one kind of request's latencies and
errors, and the server's resident memory.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field

from resident import status_kib

# The page asks for abs-uint8 (app/static/js/api.js), so that is what the load test measures.
ROUTES = {"compact": "/api/attention/compact?scheme=abs-uint8", "json": "/api/attention"}

SUBJECTS = [
    "The old sailor",
    "A curious child",
    "My neighbour's dog",
    "The committee",
    "Every student",
    "The tired engineer",
    "A small robot",
    "The orchestra",
    "Our new teacher",
    "The black cat",
]
VERBS = [
    "carefully explained",
    "quietly watched",
    "suddenly remembered",
    "happily described",
    "never forgot",
    "slowly repaired",
    "loudly announced",
    "secretly admired",
    "briefly studied",
    "gladly shared",
]
OBJECTS = [
    "the strange map that was found under the floor of the library",
    "a long story about the winter when the river froze over",
    "the reasons why the bridge had to be closed for the whole summer",
    "how the garden changed after the storm broke the old fence",
    "the small wooden box that nobody had opened for years",
    "what happened at the station when the last train was late again",
]
ENDINGS = [
    "before the sun went down.",
    "to everyone in the room.",
    "while it was raining outside.",
    "without saying another word.",
    "as the bells began to ring.",
]


def sentence(rng: random.Random, i: int) -> str:
    """~32 tokens, different every call (the index makes repeats impossible)."""
    return f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(ENDINGS)} ({i})"


def long_text(rng: random.Random, i: int) -> str:
    """Over 512 tokens (truncated to 512 by the service), different every call."""
    return " ".join(sentence(rng, 1000 * i + j) for j in range(20))


SMALL = itertools.count(1000)  # a new number for every small request of the run: never a cache hit


def small_text() -> str:
    return f"A small request {next(SMALL)} here."  # 9 tokens with [CLS] and [SEP] (number: 2 pieces)


def rss_mib(pid: int, key: str = "VmRSS") -> int:
    """The server's VmRSS (or VmHWM) in MiB."""
    return status_kib(key, pid) // 1024


def drop_name(exc: BaseException) -> str:
    """httpx's name for how a request failed; RemoteProtocolError is a connection closed without a
    response (the server dropped it)."""
    return type(exc).__name__


@dataclass
class Timings:
    latencies: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)

    def add_error(self, name: str) -> None:
        self.errors[name] = self.errors.get(name, 0) + 1

    def pct(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def row(self) -> str:
        return (
            f"{len(self.latencies):>6} {1000 * self.pct(0.5):>8.1f} {1000 * self.pct(0.99):>8.1f} "
            f"{1000 * max(self.latencies, default=float('nan')):>8.1f} {sum(self.errors.values()):>6}"
        )
