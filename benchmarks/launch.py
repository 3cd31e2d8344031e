"""Start the real app and Debian's Chromium: one helper for tests/browser/ and the benchmarks.

    from launch import launch_chromium, serve             # a script in benchmarks/ (its own folder)
    from benchmarks.launch import launch_chromium, serve  # tests (the repository root is on sys.path)

`serve` runs uvicorn on a free loopback port, waits for GET /api/health to say "ok" (the default model
loaded; it answers 200 "loading" before) and stops the server on exit (`wait_up` is that wait, for a
server started otherwise); `launch_chromium` starts
/usr/bin/chromium (never a downloaded browser) headless, offline-quiet; `OnlyFile` blocks a page's every
request but its own file's.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")  # Debian's; `make chromium` installs it
# Playwright's own --disable-features (playwright-core's chromiumSwitches.ts, 1.65). Chromium keeps only the
# last --disable-features it is given, so ours repeats them; tests/browser/test_launch.py checks that the
# installed Playwright asks for no other.
PLAYWRIGHT_DISABLED_FEATURES = (
    "AvoidUnnecessaryBeforeUnloadCheckSync",
    "DestroyProfileOnBrowserClose",
    "HttpsUpgrades",
    "HttpsFirstBalancedModeAutoEnable",
    "LensOverlay",
    "MediaRouter",
    "PaintHolding",
    "ThirdPartyStoragePartitioning",
    "AvoidCorsURLLoaderRestartOnRedirect",
    "TcpPortRandomizationWin",
    "OptimizationHints",
    "NetworkTimeServiceQuerying",
    "AimEnabled",
    "PreconnectToSearch",
    "msForceBrowserSignIn",
    "msEdgeUpdateLaunchServicesPreferredVersion",
)
# Headless Chromium builds the address bar's two popups (WebUI pages in a renderer of their own) for every
# window it opens, and a page is a window: in tests/browser/ that renderer took a quarter of all renderer CPU.
# Nothing headless ever shows them.
HIDDEN_UI_FEATURES = ("WebUIOmniboxPopup", "WebUIOmniboxAimPopup")
# No GPU, no QUIC, and none of the background fetches (updates, sync, field trials) a fresh profile makes:
# the page must never reach past the app's base URL, and the tests watch every request.
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-features=" + ",".join(PLAYWRIGHT_DISABLED_FEATURES + HIDDEN_UI_FEATURES),
)
HEALTH_POLL_S = 0.3


def free_port() -> int:
    """A loopback port nothing listens on right now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def health(base: str) -> dict[str, Any] | None:
    """GET {base}/api/health's body when it answers 200, else None (not listening yet, or 503)."""
    try:
        with urllib.request.urlopen(f"{base}/api/health", timeout=5) as response:  # noqa: S310 (loopback)
            return dict(json.load(response))
    except (OSError, ValueError):
        return None


def healthy(base: str) -> bool:
    """True when GET {base}/api/health answers {"status": "ok"}: the default model is loaded."""
    return (health(base) or {}).get("status") == "ok"


@dataclass(frozen=True)
class Server:
    process: subprocess.Popen[bytes]
    base: str  # http://127.0.0.1:<port>, no trailing slash


@contextmanager
def serve(
    env: Mapping[str, str] | None = None,
    *,
    log: Path | None = None,
    uvicorn_args: Sequence[str] = (),
    start_s: float = 180,
    until: Callable[[str], bool] = healthy,
    poll_s: float = HEALTH_POLL_S,
) -> Iterator[Server]:
    """`app.main:app` under uvicorn on a free port, healthy before it is yielded, stopped after.

    `env` adds to os.environ; `log` takes the server's output (else it shares this process's); `start_s`
    bounds the wait for health (loading the default model on a busy machine takes a while); `until(base)`
    says when the server is up (`healthy`, polled every `poll_s`).
    Raises RuntimeError when the server exits or stays unhealthy, naming the log.
    """
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "uvicorn", "app.main:app", "--host", "127.0.0.1", "--port", str(port)]
    where = f"; see {log}" if log else ""
    with ExitStack() as stack:
        sink = None
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            sink = stack.enter_context(log.open("wb"))
        process = subprocess.Popen(
            [*command, *uvicorn_args],
            cwd=REPO,
            env={**os.environ, **(env or {})},
            stdout=sink,
            stderr=subprocess.STDOUT if sink else None,
        )
        try:
            try:
                wait_up(process, base, until=until, start_s=start_s, poll_s=poll_s)
            except RuntimeError as error:
                raise RuntimeError(f"{error}{where}") from None
            yield Server(process, base)
        finally:
            stop(process)


def wait_up(
    process: subprocess.Popen[bytes],
    base: str,
    *,
    until: Callable[[str], bool] = healthy,
    start_s: float = 180,
    poll_s: float = HEALTH_POLL_S,
) -> None:
    """Return once `until(base)` holds, asked every `poll_s`, for a server `process` just started (serve's,
    or a test's `headscope serve`). RuntimeError when the process exits first, or after `start_s`."""
    deadline = time.monotonic() + start_s
    while not until(base):
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server was not up after {start_s:g} s")
        time.sleep(poll_s)


def stop(process: subprocess.Popen[bytes], *, timeout: float = 10) -> None:
    """Stop a server process: SIGTERM, then SIGKILL after `timeout` s if it is still busy with queued
    work (a graceful shutdown waits for it)."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _chromium() -> str:
    """CHROMIUM's path, or RuntimeError saying how to install it."""
    if not CHROMIUM.exists():
        raise RuntimeError(f"no Chromium at {CHROMIUM} (make chromium installs Debian's)")
    return str(CHROMIUM)


def launch_chromium(playwright: Any) -> Any:
    """Debian's Chromium through Playwright, with CHROMIUM_ARGS; the caller closes it."""
    return playwright.chromium.launch(executable_path=_chromium(), args=list(CHROMIUM_ARGS))


def launch_profile(playwright: Any, user_data_dir: Path, **options: Any) -> Any:
    """Debian's Chromium with CHROMIUM_ARGS on a profile kept in `user_data_dir`: a persistent context, whose
    `options` are new_context's (viewport, accept_downloads, ...); the caller closes it. Its pages share V8's
    code cache, which Playwright's other contexts (each a private profile, in memory) never keep: from its
    third load on, plotly.js's script took ~120 ms of the renderer, against ~330 ms in a fresh context."""
    return playwright.chromium.launch_persistent_context(
        str(user_data_dir), executable_path=_chromium(), args=list(CHROMIUM_ARGS), **options
    )


class OnlyFile:
    """A Playwright route handler (`page.route("**/*", only)`) that lets `url` alone load: every other
    request is aborted and its URL kept in `blocked`. An offline file (a snapshot) must reach for nothing."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.blocked: list[str] = []

    def __call__(self, route: Any) -> None:
        if route.request.url == self.url:
            route.continue_()
        else:
            self.blocked.append(route.request.url)
            route.abort()


@contextmanager
def app_page(name: str, viewport: Mapping[str, int]) -> Iterator[tuple[Server, Any]]:
    """The app on the CPU with its default model, and one Chromium page of `viewport` size: what the page
    benchmarks measure in. The server's log goes to the temp dir as headscope-bench-<name>.log."""
    import tempfile

    from playwright.sync_api import sync_playwright

    log = Path(tempfile.gettempdir()) / f"headscope-bench-{name}.log"
    env = {"HEADSCOPE_DEVICE": "cpu", "HEADSCOPE_LOG_LEVEL": "warning"}
    with serve(env, log=log) as server, sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        try:
            yield server, browser.new_page(viewport=dict(viewport))
        finally:
            browser.close()
