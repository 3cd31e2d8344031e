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

The isolation phases live in load_isolation.py, the soak in load_soak.py, and what every phase sends and
counts (routes, texts, latencies, the server's RSS) in load_requests.py.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from launch import serve
from load_isolation import isolation_report
from load_requests import ROUTES, Timings, rss_mib, sentence
from load_soak import soak_report

GOAL_RPS, GOAL_P99_S = 40.0, 1.0
PHASES = ("load", "heavy", "abandon", "soak")


@dataclass
class Phase(Timings):
    """One throughput phase: its requests' latencies and errors, the bytes they got, the server's RSS."""

    name: str = ""
    wire_bytes: int = 0
    seconds: float = 0.0
    rss_start: int = 0
    rss_end: int = 0

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds else 0.0


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
                    phase.add_error(type(exc).__name__)
                    continue
                if r.status_code != 200:
                    phase.add_error(str(r.status_code))
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
                samples.append(rss_mib(pid))

        threading.Thread(target=sample, daemon=True).start()
        try:
            rss_loaded = rss_mib(pid)
            route = ROUTES[args.route]
            # Warm-up: first calls pay for lazy allocations; not counted.
            warm_up = run_phase(
                Phase(name="warm-up"), base, route, clients=args.clients, seconds=3, varied=True
            )
            asyncio.run(warm_up)
            rss_warm = rss_mib(pid)
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
        phase = Phase(name=name, rss_start=rss_mib(pid))
        asyncio.run(run_phase(phase, base, route, clients=args.clients, seconds=args.seconds, varied=varied))
        phase.rss_end = rss_mib(pid)
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
        f"requests ({len(samples)} samples), peak VmHWM {rss_mib(pid, 'VmHWM')} MiB"
    )
    if total:
        median = statistics.median(lat for p in phases for lat in p.latencies)
        lines.append(f"p50 over all: {1000 * median:.1f} ms")
    return lines


if __name__ == "__main__":
    main()
