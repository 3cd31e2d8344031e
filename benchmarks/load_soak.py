"""benchmarks/load.py --phases soak: varied requests, then 512-token JSON answers, then varied again, with
the server's RSS at the start, its peak, and after a few idle seconds: memory must come back.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

import httpx
from load_requests import ROUTES, Timings, drop_name, long_text, rss_mib, sentence


def soak_report(args: argparse.Namespace, base: str, pid: int, rss_warm: int) -> list[str]:
    varied_a, long_count, varied_b = (int(x) for x in args.soak.split(","))
    peak = 0
    rows = []

    def note() -> None:
        nonlocal peak
        peak = max(peak, rss_mib(pid, "VmHWM"))

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

    start = rss_mib(pid)
    for label, count, long in (
        (f"{varied_a} varied", varied_a, False),
        (f"{long_count} at 512 tokens (JSON)", long_count, True),
        (f"{varied_b} varied", varied_b, False),
    ):
        started = time.perf_counter()
        timings = asyncio.run(count_phase(count, long=long))
        note()
        rows.append((label, timings, time.perf_counter() - started, rss_mib(pid)))
    time.sleep(5.0)  # idle: the server hands freed memory back after about a second
    idle = rss_mib(pid)
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
