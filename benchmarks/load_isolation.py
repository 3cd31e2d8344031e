"""benchmarks/load.py's isolation phases (a client must not stall another): /api/health and small requests
timed alone, then beside clients reading 512-token JSON answers (heavy) or hanging up after 1 s (abandon).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

import httpx
from load_requests import ROUTES, Timings, drop_name, long_text, small_text

GOAL_HEALTH_S = 0.1  # /api/health while the heaviest answer is built


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
