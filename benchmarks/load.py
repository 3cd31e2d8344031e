"""Load test: the real server (uvicorn subprocess) under N concurrent clients over loopback.

Two phases against the default model at ~32 tokens:
  varied     every request a different sentence (the cache never hits: this measures inference)
  identical  every request the same sentence (the LRU cache answers)
and prints requests/s, p50/p99 latency and errors next to the goals, plus the server's RSS sampled over
the whole run (VmRSS after warm-up and at the end of each phase, and VmHWM, the peak) to show memory is
flat.

    .venv/bin/python benchmarks/load.py                      # 16 clients, 20 s per phase, compact route
    .venv/bin/python benchmarks/load.py --route json --clients 32 --seconds 30
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
# The page asks for abs-uint8 (static/js/api.js), so that is what the load test measures.
ROUTES = {"compact": "/api/attention/compact?scheme=abs-uint8", "json": "/api/attention"}
GOAL_RPS, GOAL_P99_S = 40.0, 1.0

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM in MiB from /proc/<pid>/status."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) // 1024
    return out


@dataclass
class Phase:
    name: str
    latencies: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    wire_bytes: int = 0
    seconds: float = 0.0
    rss_start: int = 0
    rss_end: int = 0

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds else 0.0

    def pct(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_phase(
    phase: Phase, base: str, route: str, *, clients: int, seconds: float, varied: bool
) -> None:
    rng = random.Random(0)
    counter = iter(range(10**9))
    fixed = sentence(random.Random(1), 0)
    deadline = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30.0) as client:

        async def worker() -> None:
            while time.perf_counter() < deadline:
                text = sentence(rng, next(counter)) if varied else fixed
                started = time.perf_counter()
                try:
                    r = await client.post(route, json={"text": text})
                    await r.aread()
                except httpx.HTTPError as exc:
                    phase.errors[type(exc).__name__] = phase.errors.get(type(exc).__name__, 0) + 1
                    continue
                if r.status_code != 200:
                    phase.errors[str(r.status_code)] = phase.errors.get(str(r.status_code), 0) + 1
                    continue
                phase.latencies.append(time.perf_counter() - started)
                phase.wire_bytes += int(r.headers.get("content-length", len(r.content)))

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        phase.seconds = time.perf_counter() - started


def gzip_table() -> None:
    """Deflate settings vs time vs bytes per value of the compact form, in-process: why app/compact.py
    uses its settings (level N, default strategy, and the app's own `compact.compress`)."""
    import zlib

    import mha
    from app import compact

    model = mha.load_pretrained(device="cpu")
    rng = random.Random(2)
    settings: list[tuple[str, Callable[[bytes], bytes]]] = [
        (f"L{level}", lambda raw, level=level: zlib.compress(raw, level)) for level in (1, 3, 6, 9)
    ]
    settings.append(("app", compact.compress))
    print("\ndeflate settings for the compact form (default model; app = level 6, Z_RLE, gzip container)")
    print(f"{'tokens':>6} {'scheme':<14} " + " ".join(f"{f'{name} B/val  ms':>15}" for name, _ in settings))
    for sentences in (1, 4, 16):
        text = " ".join(sentence(rng, i) for i in range(sentences))
        attentions = model.attend(text).attentions
        values = attentions.numel()
        for scheme in compact.SCHEMES:
            raw = compact.encode({"n": attentions.shape[-1]}, attentions, scheme=scheme)
            cells = []
            for _, deflate in settings:
                started = time.perf_counter()
                size = len(deflate(raw))
                cells.append(f"{size / values:>6.3f} {1000 * (time.perf_counter() - started):>7.1f}")
            print(f"{attentions.shape[-1]:>6} {scheme:<14} " + " ".join(f"{c:>15}" for c in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20.0, help="per phase")
    parser.add_argument("--route", choices=sorted(ROUTES), default="compact")
    parser.add_argument("--threads", type=int, default=None, help="HEADSCOPE_THREADS for the server")
    parser.add_argument("--max-concurrency", type=int, default=None, help="HEADSCOPE_MAX_CONCURRENCY")
    parser.add_argument("--no-gzip-table", action="store_true", help="skip the gzip level table")
    args = parser.parse_args()
    if not args.no_gzip_table:
        gzip_table()

    port = free_port()
    env = dict(os.environ, HEADSCOPE_DEVICE="cpu", HEADSCOPE_LOG_LEVEL="warning")
    if args.threads:
        env["HEADSCOPE_THREADS"] = str(args.threads)
    if args.max_concurrency:
        env["HEADSCOPE_MAX_CONCURRENCY"] = str(args.max_concurrency)
    cmd = [
        sys.executable,
        "-m",
        "uvicorn",
        "app.main:app",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--no-access-log",
    ]
    server = subprocess.Popen(cmd, cwd=ROOT, env=env)
    base = f"http://127.0.0.1:{port}"
    samples: list[int] = []
    stop = threading.Event()
    try:
        for _ in range(600):
            try:
                if httpx.get(base + "/api/health", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None:
                raise SystemExit(f"server exited with {server.returncode}")
            time.sleep(0.1)
        else:
            raise SystemExit("server did not become healthy in 60 s")

        def sample() -> None:
            while not stop.wait(0.25):
                samples.append(proc_status(server.pid)["VmRSS"])

        threading.Thread(target=sample, daemon=True).start()
        rss_loaded = proc_status(server.pid)["VmRSS"]
        route = ROUTES[args.route]
        # Warm-up: first calls pay for lazy allocations; not counted.
        asyncio.run(run_phase(Phase("warm-up"), base, route, clients=args.clients, seconds=3, varied=True))
        phases = []
        for name, varied in (("varied", True), ("identical", False)):
            phase = Phase(name, rss_start=proc_status(server.pid)["VmRSS"])
            asyncio.run(
                run_phase(phase, base, route, clients=args.clients, seconds=args.seconds, varied=varied)
            )
            phase.rss_end = proc_status(server.pid)["VmRSS"]
            phases.append(phase)
        peak = proc_status(server.pid)["VmHWM"]
    finally:
        stop.set()
        server.terminate()
        server.wait(10)

    load = os.getloadavg()
    print(
        f"\nheadscope load test: {args.clients} clients, {args.seconds:.0f} s per phase, POST {route}, "
        f"default model, ~32-token sentences; {os.cpu_count()} CPUs, load average {load[0]:.1f}"
    )
    print(
        f"{'phase':<10} {'requests':>8} {'req/s':>7} {'goal':>5} {'ratio':>6} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'goal':>5} {'errors':>6} {'B/resp':>7} {'RSS MiB start->end':>19}"
    )
    for p in phases:
        errors = sum(p.errors.values())
        print(
            f"{p.name:<10} {len(p.latencies):>8} {p.rps:>7.1f} {GOAL_RPS:>5.0f} {p.rps / GOAL_RPS:>5.2f}x "
            f"{1000 * p.pct(0.5):>7.1f} {1000 * p.pct(0.99):>7.1f} {1000 * GOAL_P99_S:>5.0f} {errors:>6} "
            f"{p.wire_bytes / max(1, len(p.latencies)):>7.0f} {p.rss_start:>9} -> {p.rss_end:<7}"
        )
        if p.errors:
            print(f"           errors: {p.errors}")
    total = sum(len(p.latencies) for p in phases)
    steady = samples[len(samples) // 10 :] or samples
    print(
        f"server RSS: {rss_loaded} MiB after loading, {min(steady)}..{max(steady)} MiB over {total} timed "
        f"requests ({len(samples)} samples), peak VmHWM {peak} MiB"
    )
    if total:
        median = statistics.median(lat for p in phases for lat in p.latencies)
        print(f"p50 over all: {1000 * median:.1f} ms")


if __name__ == "__main__":
    main()
