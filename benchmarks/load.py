"""Load test: the real server (uvicorn subprocess) under N concurrent clients over loopback.

Throughput, against the default model at ~32 tokens:
  varied     every request a different sentence (the cache never hits: this measures inference)
  identical  every request the same sentence (the LRU cache answers)
printed as requests/s, p50/p99 latency and errors next to the goals.

Isolation (a client must not stall another):
  heavy      GET /api/health every 50 ms and a 9-token request after another, first alone, then while
             512-token /api/attention JSON answers (the heaviest: ~140 MB each) are built and read
  abandon    the same 9-token requests, alone, then beside 20 clients that send 512-token texts and hang
             up after 1 s (their work must stop, not delay everyone)

Memory (--soak): varied requests, then 512-token JSON answers, then varied again (16 clients), printing
the server's RSS at the start, its peak, and after a few idle seconds; memory must come back.

Every phase counts dropped connections (a request that got no response) by cause.

    .venv/bin/python benchmarks/load.py                      # 16 clients, 20 s per phase, compact route
    .venv/bin/python benchmarks/load.py --route json --clients 32 --seconds 30
    .venv/bin/python benchmarks/load.py --phases heavy,abandon --no-gzip-table
    .venv/bin/python benchmarks/load.py --phases soak --soak 6000,500,3000
    MALLOC_ARENA_MAX=8 .venv/bin/python benchmarks/load.py --phases soak --env HEADSCOPE_MALLOC_TRIM=false
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from launch import serve

# The page asks for abs-uint8 (static/js/api.js), so that is what the load test measures.
ROUTES = {"compact": "/api/attention/compact?scheme=abs-uint8", "json": "/api/attention"}
GOAL_RPS, GOAL_P99_S = 40.0, 1.0
GOAL_HEALTH_S = 0.1  # /api/health while the heaviest answer is built
PHASES = ("load", "heavy", "abandon", "soak")

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


async def probe(base: str, stop: asyncio.Event, health: Timings, small: Timings) -> None:
    """GET /api/health every 50 ms, and one 9-token compact request after another (each unique)."""
    async with httpx.AsyncClient(base_url=base, timeout=120.0) as client:

        async def health_loop() -> None:
            while not stop.is_set():
                started = time.perf_counter()
                try:
                    r = await client.get("/api/health")
                    r.raise_for_status()
                    health.latencies.append(time.perf_counter() - started)
                except httpx.HTTPError as exc:
                    health.add_error(drop_name(exc))
                await asyncio.sleep(0.05)

        async def small_loop() -> None:
            counter = 0
            while not stop.is_set():
                counter += 1
                started = time.perf_counter()
                try:
                    r = await client.post(ROUTES["compact"], json={"text": small_text()})
                    await r.aread()
                    r.raise_for_status()
                    small.latencies.append(time.perf_counter() - started)
                except httpx.HTTPError as exc:
                    small.add_error(
                        drop_name(exc)
                        if not isinstance(exc, httpx.HTTPStatusError)
                        else str(exc.response.status_code)
                    )
                await asyncio.sleep(0.05)

        await asyncio.gather(health_loop(), small_loop())


async def raw_post(base: str, path: str, body: dict[str, object]) -> tuple[int, int]:
    """POST with `Connection: close` and read the answer to its end in 1 MiB reads: (status, bytes).
    A plain socket rather than httpx, so that reading a 140 MB answer costs this process little CPU
    on a small machine (httpx parses it at Python speed, which would slow the server beside it)."""
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        data = json.dumps(body).encode()
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
            + data
        )
        await writer.drain()
        first = await reader.read(1 << 20)
        if not first:
            raise ConnectionResetError("connection closed without a response")
        status = int(first.split(b" ", 2)[1])
        total = len(first)
        while chunk := await reader.read(1 << 20):
            total += len(chunk)
        return status, total
    finally:
        writer.close()


async def long_text_clients(
    base: str, stop: asyncio.Event, clients: int, done: Timings, *, seed: int, hang_up: float | None
) -> None:
    """Clients that each send a 512-token text to /api/attention (a new text each time, so every answer is
    built) again and again: reading the whole JSON answer, or hanging up after `hang_up` seconds."""
    rng = random.Random(seed)
    counter = iter(range(10**9))

    async def one() -> None:
        while not stop.is_set():
            started = time.perf_counter()
            try:
                async with asyncio.timeout(hang_up):
                    status, _ = await raw_post(base, ROUTES["json"], {"text": long_text(rng, next(counter))})
            except TimeoutError:
                done.add_error("hung up")
                continue
            except OSError as exc:
                done.add_error(drop_name(exc))
                continue
            if status != 200:
                done.add_error(str(status))
                continue
            done.latencies.append(time.perf_counter() - started)

    await asyncio.gather(*(one() for _ in range(clients)))


async def heavy_clients(base: str, stop: asyncio.Event, clients: int, done: Timings) -> None:
    """Clients that each ask for a 512-token /api/attention JSON answer and read all of it."""
    await long_text_clients(base, stop, clients, done, seed=3, hang_up=None)


async def abandoning_clients(
    base: str, stop: asyncio.Event, clients: int, after: float, gone: Timings
) -> None:
    """Clients that send a 512-token text to /api/attention and hang up after `after` seconds; those
    answered within `after` are timed."""
    await long_text_clients(base, stop, clients, gone, seed=4, hang_up=after)


async def isolation_phase(
    base: str, *, seconds: float, load: str, clients: int, after: float = 1.0
) -> tuple[Timings, Timings, Timings, Timings, Timings]:
    """(health alone, small alone, health under load, small under load, the load's own requests)."""
    alone_health, alone_small = Timings(), Timings()
    stop = asyncio.Event()
    task = asyncio.create_task(probe(base, stop, alone_health, alone_small))
    await asyncio.sleep(min(seconds, 10.0))
    stop.set()
    await task
    health, small, loaded = Timings(), Timings(), Timings()
    stop = asyncio.Event()
    if load == "heavy":
        work = heavy_clients(base, stop, clients, loaded)
    else:
        work = abandoning_clients(base, stop, clients, after, loaded)
    work_task = asyncio.create_task(work)
    await asyncio.sleep(1.0)  # let the load build up before measuring
    probe_task = asyncio.create_task(probe(base, stop, health, small))
    await asyncio.sleep(seconds)
    stop.set()
    await probe_task
    await work_task
    return alone_health, alone_small, health, small, loaded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20.0, help="per phase")
    parser.add_argument("--route", choices=sorted(ROUTES), default="compact")
    parser.add_argument("--threads", type=int, default=None, help="HEADSCOPE_THREADS for the server")
    parser.add_argument("--max-concurrency", type=int, default=None, help="HEADSCOPE_MAX_CONCURRENCY")
    parser.add_argument("--no-gzip-table", action="store_true", help="skip the gzip level table")
    parser.add_argument(
        "--phases", default="load,heavy,abandon", help=f"comma-separated, of {', '.join(PHASES)}"
    )
    parser.add_argument("--heavy-clients", type=int, default=2, help="512-token JSON readers in 'heavy'")
    parser.add_argument("--abandoners", type=int, default=20, help="clients that hang up in 'abandon'")
    parser.add_argument(
        "--soak", default="6000,500,3000", help="soak sizes: varied, then 512-token JSON, then varied"
    )
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for the server, repeatable")
    args = parser.parse_args()
    phases_wanted = [p.strip() for p in args.phases.split(",") if p.strip()]
    if unknown := set(phases_wanted) - set(PHASES):
        parser.error(f"unknown phases {sorted(unknown)}; choose from {PHASES}")
    if not args.no_gzip_table and "load" in phases_wanted:
        gzip_table()

    env: dict[str, str] = {"HEADSCOPE_DEVICE": "cpu", "HEADSCOPE_LOG_LEVEL": "warning"}
    if args.threads:
        env["HEADSCOPE_THREADS"] = str(args.threads)
    if args.max_concurrency:
        env["HEADSCOPE_MAX_CONCURRENCY"] = str(args.max_concurrency)
    for item in args.env:
        key, _, value = item.partition("=")
        env[key] = value
    samples: list[int] = []
    stop = threading.Event()
    report: list[str] = []
    quiet = ["--log-level", "warning", "--no-access-log"]
    with serve(env, uvicorn_args=quiet, start_s=60) as server:
        pid, base = server.process.pid, server.base

        def sample() -> None:
            while not stop.wait(0.25):
                samples.append(proc_status(pid)["VmRSS"])

        threading.Thread(target=sample, daemon=True).start()
        try:
            rss_loaded = proc_status(pid)["VmRSS"]
            route = ROUTES[args.route]
            # Warm-up: first calls pay for lazy allocations; not counted.
            warm_up = run_phase(Phase("warm-up"), base, route, clients=args.clients, seconds=3, varied=True)
            asyncio.run(warm_up)
            rss_warm = proc_status(pid)["VmRSS"]
            for name in phases_wanted:
                if name == "load":
                    report += load_report(args, base, route, pid, samples, rss_loaded)
                elif name in ("heavy", "abandon"):
                    report += isolation_report(args, base, name)
                else:
                    report += soak_report(args, base, pid, rss_warm)
        finally:
            stop.set()
    load = os.getloadavg()
    print(
        f"\nheadscope load test: POST {ROUTES[args.route]} and others, default model; {os.cpu_count()} CPUs, "
        f"load average {load[0]:.1f}; server env {' '.join(args.env) or '(defaults)'}"
    )
    print("\n".join(report))


def load_report(
    args: argparse.Namespace, base: str, route: str, pid: int, samples: list[int], rss_loaded: int
) -> list[str]:
    phases = []
    for name, varied in (("varied", True), ("identical", False)):
        phase = Phase(name, rss_start=proc_status(pid)["VmRSS"])
        asyncio.run(run_phase(phase, base, route, clients=args.clients, seconds=args.seconds, varied=varied))
        phase.rss_end = proc_status(pid)["VmRSS"]
        phases.append(phase)
    lines = [
        f"\nthroughput: {args.clients} clients, {args.seconds:.0f} s per phase, ~32-token sentences",
        f"{'phase':<10} {'requests':>8} {'req/s':>7} {'goal':>5} {'ratio':>6} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'goal':>5} {'errors':>6} {'B/resp':>7} {'RSS MiB start->end':>19}",
    ]
    for p in phases:
        errors = sum(p.errors.values())
        lines.append(
            f"{p.name:<10} {len(p.latencies):>8} {p.rps:>7.1f} {GOAL_RPS:>5.0f} {p.rps / GOAL_RPS:>5.2f}x "
            f"{1000 * p.pct(0.5):>7.1f} {1000 * p.pct(0.99):>7.1f} {1000 * GOAL_P99_S:>5.0f} {errors:>6} "
            f"{p.wire_bytes / max(1, len(p.latencies)):>7.0f} {p.rss_start:>9} -> {p.rss_end:<7}"
        )
        if p.errors:
            lines.append(f"           errors: {p.errors}")
    total = sum(len(p.latencies) for p in phases)
    steady = samples[len(samples) // 10 :] or samples
    lines.append(
        f"server RSS: {rss_loaded} MiB after loading, {min(steady)}..{max(steady)} MiB over {total} timed "
        f"requests ({len(samples)} samples), peak VmHWM {proc_status(pid)['VmHWM']} MiB"
    )
    if total:
        median = statistics.median(lat for p in phases for lat in p.latencies)
        lines.append(f"p50 over all: {1000 * median:.1f} ms")
    return lines


def isolation_report(args: argparse.Namespace, base: str, name: str) -> list[str]:
    clients = args.heavy_clients if name == "heavy" else args.abandoners
    alone_health, alone_small, health, small, loaded = asyncio.run(
        isolation_phase(base, seconds=args.seconds, load=name, clients=clients)
    )
    if name == "heavy":
        title = f"{clients} clients reading 512-token /api/attention JSON answers ({args.seconds:.0f} s)"
        load_line = (
            f"the 512-token answers: {len(loaded.latencies)} read in full, p50 {loaded.pct(0.5):.1f} s"
        )
    else:
        title = f"{clients} clients sending 512-token texts to /api/attention, hanging up after 1 s"
        load_line = f"their requests: {len(loaded.latencies)} answered within 1 s, outcomes {loaded.errors}"
    lines = [
        f"\n{name}: {title}",
        f"{'':<34} {'n':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'errors':>6}",
        f"{'GET /api/health, alone':<34} {alone_health.row()}",
        f"{'GET /api/health, ' + name:<34} {health.row()}   goal p99 < {1000 * GOAL_HEALTH_S:.0f} ms",
        f"{'9-token request, alone':<34} {alone_small.row()}",
        f"{'9-token request, ' + name:<34} {small.row()}",
        load_line,
    ]
    for label, timings in (("health", health), ("9-token", small)):
        if timings.errors:
            lines.append(f"{label} errors (dropped connections by cause): {timings.errors}")
    if name == "heavy" and loaded.errors:
        lines.append(f"512-token readers' errors (dropped connections by cause): {loaded.errors}")
    return lines


def soak_report(args: argparse.Namespace, base: str, pid: int, rss_warm: int) -> list[str]:
    varied_a, long_count, varied_b = (int(x) for x in args.soak.split(","))
    peak = 0
    rows = []

    def note() -> None:
        nonlocal peak
        peak = max(peak, proc_status(pid)["VmHWM"])

    async def count_phase(count: int, *, long: bool) -> Timings:
        timings = Timings()
        rng = random.Random(5 if long else 6)
        counter = iter(range(count))
        route = ROUTES["json"] if long else ROUTES[args.route]
        async with httpx.AsyncClient(
            base_url=base, timeout=600.0, limits=httpx.Limits(max_connections=args.clients)
        ) as client:

            async def worker() -> None:
                for i in counter:
                    text = long_text(rng, i) if long else sentence(rng, i)
                    started = time.perf_counter()
                    try:
                        async with client.stream("POST", route, json={"text": text}) as r:
                            async for _ in r.aiter_raw():
                                pass
                        if r.status_code != 200:
                            timings.add_error(str(r.status_code))
                            continue
                        timings.latencies.append(time.perf_counter() - started)
                    except httpx.HTTPError as exc:
                        timings.add_error(drop_name(exc))

            await asyncio.gather(*(worker() for _ in range(args.clients)))
        return timings

    start = proc_status(pid)["VmRSS"]
    for label, count, long in (
        (f"{varied_a} varied", varied_a, False),
        (f"{long_count} at 512 tokens (JSON)", long_count, True),
        (f"{varied_b} varied", varied_b, False),
    ):
        started = time.perf_counter()
        timings = asyncio.run(count_phase(count, long=long))
        note()
        rows.append((label, timings, time.perf_counter() - started, proc_status(pid)["VmRSS"]))
    time.sleep(5.0)  # idle: the server hands freed memory back after about a second
    idle = proc_status(pid)["VmRSS"]
    lines = [
        f"\nsoak: {args.clients} clients; server RSS after warm-up {rss_warm} MiB",
        f"{'step':<28} {'n':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'errors':>6} {'s':>6} "
        f"{'RSS MiB after':>14}",
    ]
    for label, timings, seconds, rss in rows:
        lines.append(f"{label:<28} {timings.row()} {seconds:>6.0f} {rss:>14}")
        if timings.errors:
            lines.append(f"           errors (dropped connections by cause): {timings.errors}")
    lines.append(f"server RSS: start {start} MiB, peak {peak} MiB, idle after 5 s {idle} MiB")
    return lines


if __name__ == "__main__":
    main()
