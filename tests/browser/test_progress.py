"""A slow answer's progress on the page (app/static/js/work-progress.js, POST /api/attention/progress): a slow
load shows its bar, a slow forward its layers and a Cancel that stops the server's work (by keyboard, on a
phone's width), a slow "Find heads" probe its Cancel too, and a fast answer shows nothing.

The server runs in this process (uvicorn on a thread), so the tests slow the tiny models down where they
run: every layer sleeps SLOW["seconds"] (Block.forward), and the tiny Llama's load waits, mid-way through
its weights, until the test lets it go on. No big file is read.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from app.main import create_app
from app.settings import Settings
from benchmarks.launch import free_port, healthy
from mha.core.layers import Block
from mha.loading import checkpoint
from tests.browser.conftest import SERVER_START_S, PageSession
from tests.browser.test_page import post

pytestmark = pytest.mark.browser

SLOW_LOAD = "slow-load"  # the tiny Llama, its load held until released
SLOW_LONG = "slow-load-long"  # the same, loaded by a long text's token count first
CANCELLED = "loaded-then-cancelled"  # the same, first loaded by a run that is cancelled in its forward
ELSEWHERE = "loaded-elsewhere"  # the same, first loaded by a request from outside the page
LONG_TEXT = "The cat sat on the mat. " * 30  # 720 bytes: past the 512 the page takes without counting
LAYERS = 6  # the embedded MiniLM's
HELD = 4  # the layer (0-based) a slow forward waits at until the test has cancelled it
SLOW = {"seconds": 0.0}  # each layer's sleep in the server's forwards
WAIT_MS = 60_000  # a bound on a wait that must end (a busy 2-core machine), never a speed goal
# The bar's element as the page's `hidden` attribute leaves it, watched from before the run on.
WATCH_BAR_JS = """() => {
  const bar = document.querySelector('#trace-progress');
  window.barShown = false;
  new MutationObserver(() => { if (!bar.hidden) window.barShown = true; }).observe(bar, { attributes: true });
}"""


class Server:
    """The app under uvicorn on a thread of this process: `base`, the `service`, and what its forwards did."""

    def __init__(self, app: Any, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.service = app.state.service
        self.layers_run = 0  # Block.forward calls, all forwards together
        self.hold_at: int | None = None  # the layer (counted as layers_run) that waits for `go`
        self.go = threading.Event()
        self.ended = threading.Event()  # a forward ended (set by the service's progress bookkeeping)
        self.release_load = threading.Event()


@pytest.fixture(scope="module")
def slow_server(tiny_checkpoints: dict[str, Path]) -> Iterator[Server]:
    tiny = tiny_checkpoints["llama"]
    settings = Settings(
        device="cpu",
        threads=1,
        log_level="warning",
        models={SLOW_LOAD: tiny, SLOW_LONG: tiny, CANCELLED: tiny, ELSEWHERE: tiny},
        allowed_hosts=["127.0.0.1"],
        bundled_llm=False,
        discover=False,
    )
    app = create_app(settings)
    port = free_port()
    running = Server(app, port)
    with pytest.MonkeyPatch.context() as patch:
        forward, load_weights = Block.forward, checkpoint.load_weights

        def slow_forward(self: Block, *args: Any, **kwargs: Any) -> Any:
            running.layers_run += 1
            time.sleep(SLOW["seconds"])
            if running.layers_run == running.hold_at:
                assert running.go.wait(WAIT_MS / 1000)
            return forward(self, *args, **kwargs)

        def held(files: list[Path]) -> Any:
            if files[0].is_relative_to(tiny):
                assert running.release_load.wait(WAIT_MS / 1000)
            return load_weights(files)

        patch.setattr(Block, "forward", slow_forward)
        patch.setattr(checkpoint, "load_weights", held)
        ended = running.service.watch.forward_ended

        def forward_ended(keys: Any) -> None:
            ended(keys)
            running.ended.set()

        patch.setattr(running.service.watch, "forward_ended", forward_ended)
        uvicorn_server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        thread = threading.Thread(target=uvicorn_server.run, daemon=True)
        thread.start()
        try:
            deadline = time.monotonic() + SERVER_START_S
            while not healthy(running.base):
                assert time.monotonic() < deadline and thread.is_alive(), "the server never became healthy"
                time.sleep(0.2)
            yield running
        finally:
            running.release_load.set()
            running.go.set()
            uvicorn_server.should_exit = True
            thread.join(30)


def page_of(browser: Any, server: Server, **context: Any) -> Iterator[PageSession]:
    browser_context = browser.new_context(**context)
    page = browser_context.new_page()
    page.set_default_timeout(WAIT_MS)
    tracked = PageSession(page, server.base)
    tracked.open()
    page.evaluate(WATCH_BAR_JS)
    yield tracked
    browser_context.close()
    assert tracked.errors == [], f"uncaught page errors: {tracked.errors}"
    assert all(url.startswith(server.base + "/") for url in tracked.requests), tracked.requests


@pytest.fixture
def desktop(browser: Any, slow_server: Server) -> Iterator[PageSession]:
    yield from page_of(browser, slow_server, viewport={"width": 1440, "height": 900})


@pytest.fixture
def phone(browser: Any, slow_server: Server) -> Iterator[PageSession]:
    phone = {"viewport": {"width": 390, "height": 844}, "device_scale_factor": 3, "is_mobile": True}
    yield from page_of(browser, slow_server, **phone, has_touch=True)


def start_run(session: PageSession, text: str, model: str | None = None) -> None:
    """Fill the form and press Run, without waiting for the answer."""
    page = session.page
    page.fill("#text", text)
    if model is not None:
        page.select_option("#model", model)
    page.evaluate("document.body.dataset.state = 'idle'")
    page.click("#run")


def progress_asked(session: PageSession) -> int:
    return sum("/api/attention/progress" in url for url in session.requests)


def test_a_fast_answer_shows_no_progress(desktop: PageSession) -> None:
    SLOW["seconds"] = 0.0
    desktop.run("A quick sentence answers at once.")
    assert progress_asked(desktop) == 0  # no watch even started
    assert desktop.page.evaluate("window.barShown") is False
    assert desktop.page.locator("#trace-progress").is_hidden()


def test_a_slow_forward_shows_its_layers_and_cancel_by_keyboard_stops_it(
    phone: PageSession, slow_server: Server
) -> None:
    page, server = phone.page, slow_server
    # Each layer 0.5 s, and the 5th (index 4) held until the test lets it go: past the 2 s after which the
    # layers show, whatever the machine's load.
    SLOW["seconds"] = 0.5
    server.ended.clear()
    server.go.clear()
    before = server.layers_run
    server.hold_at = before + HELD + 1
    try:
        start_run(phone, "A slow forward, watched layer by layer, then cancelled.")
        # The bar follows the layers: the held one is the latest told.
        page.wait_for_function(
            f"() => document.querySelector('#trace-label').textContent === 'Layer {HELD + 1} of {LAYERS}'"
        )
        assert page.locator("#trace-bar").get_attribute("aria-valuemax") == str(LAYERS)
        assert page.locator("#trace-bar").get_attribute("aria-valuenow") == str(HELD)
        # Cancel fits the phone's width and is reached by keyboard: the next tab stop after Run.
        box = page.locator("#trace-cancel").bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390
        page.focus("#run")
        page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.id") == "trace-cancel"
        page.keyboard.press("Enter")
        page.wait_for_function("() => document.querySelector('#status').textContent === 'Cancelled'")
        assert page.evaluate("document.body.dataset.state") == "idle"
        assert page.locator("#trace-progress").is_hidden() and page.locator("#error").is_hidden()
        assert page.locator("#run").is_enabled()
        # The server's forward stops before its next layer: the held one ends, and none after it starts.
        server.go.set()
        assert server.ended.wait(WAIT_MS / 1000)
        assert server.layers_run - before == HELD + 1 < LAYERS
    finally:
        SLOW["seconds"] = 0.0
        server.hold_at = None
        server.go.set()
    # The page is usable again: the next run answers.
    phone.run("The page answers again after a cancel.")
    assert phone.page.locator("#grid .thumb").count() > 0


@pytest.mark.parametrize(("model", "text"), [(SLOW_LOAD, "The cat sat."), (SLOW_LONG, LONG_TEXT)])
def test_a_slow_load_shows_its_bar_until_the_model_is_ready(
    desktop: PageSession, slow_server: Server, model: str, text: str
) -> None:
    SLOW["seconds"] = 0.0
    page, server = desktop.page, slow_server
    server.release_load.clear()
    start_run(desktop, text, model=model)
    page.wait_for_function(
        f"() => document.querySelector('#trace-label').textContent.startsWith('Loading {model}')"
    )
    assert page.locator("#trace-progress").is_visible()
    # A share once the load has measured one ("Loading NAME: 42 %"), else an indeterminate bar
    # ("Loading NAME…")
    label = page.locator("#trace-label").text_content() or ""
    measured = page.locator("#trace-bar").get_attribute("aria-valuenow")
    assert (measured is not None and label.endswith(" %")) or (measured is None and label.endswith("…"))
    server.release_load.set()
    desktop.wait_ready()
    assert page.locator("#trace-progress").is_hidden()
    assert re.search(r"\d+ layers", page.locator("#status").text_content() or "")
    # The long text's load was waited for by its token count (no forward yet), the short one's by its answer.
    counted = any("/api/trace/tokens" in url for url in desktop.requests)
    assert counted == (model == SLOW_LONG)


def option_text(page: Any, model: str) -> str:
    return page.locator(f'#model option[value="{model}"]').text_content() or ""


def wait_for_size(page: Any, model: str) -> None:
    """Until `model`'s menu entry says its size ("… — 2 layers × 4 heads …")."""
    page.wait_for_function(
        "(name) => [...document.querySelectorAll('#model option')]"
        ".find((o) => o.value === name).textContent.includes('layers ×')",
        arg=model,
    )


def test_a_model_loaded_by_a_cancelled_run_says_its_size(desktop: PageSession, slow_server: Server) -> None:
    """The run's answer is what tells the menu a model's size; a cancelled run has none, so the page asks
    the model list, and the entry no longer says "loads on first use"."""
    page, server = desktop.page, slow_server
    server.release_load.set()
    SLOW["seconds"] = 0.5
    server.ended.clear()
    server.go.clear()
    server.hold_at = server.layers_run + 1  # its first layer waits: past the 2 s after which Cancel shows
    try:
        assert "loads on first use" in option_text(page, CANCELLED)
        start_run(desktop, "Loaded, then cancelled in its first layer.", model=CANCELLED)
        page.click("#trace-cancel")
        page.wait_for_function("() => document.querySelector('#status').textContent === 'Cancelled'")
        wait_for_size(page, CANCELLED)
    finally:
        SLOW["seconds"] = 0.0
        server.hold_at = None
        server.go.set()
    assert server.ended.wait(WAIT_MS / 1000)
    assert "loads on first use" not in option_text(page, CANCELLED)


def test_a_model_loaded_elsewhere_says_its_size_when_the_menu_is_reached(
    desktop: PageSession, slow_server: Server
) -> None:
    """Another tab (or a script) loads a model: the menu learns its size when it gets the focus."""
    page = desktop.page
    slow_server.release_load.set()
    assert "loads on first use" in option_text(page, ELSEWHERE)
    post(desktop.base, "/api/attention", {"text": "Loaded from outside the page.", "model": ELSEWHERE})
    page.focus("#model")
    wait_for_size(page, ELSEWHERE)


def probe_flights(server: Server) -> int:
    return len(server.service.answers.flights)


def wait_until(done: Any, what: str) -> None:
    """Poll `done()` until it holds; a bound that must end on a busy machine, never a speed goal."""
    deadline = time.monotonic() + WAIT_MS / 1000
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_slow_probe_offers_cancel_which_stops_the_servers_probe(
    desktop: PageSession, slow_server: Server
) -> None:
    """ "Find heads" (panel-run.js): a probe still running after 2 s shows its Cancel, reached by keyboard;
    Cancel says so, the panel goes back to idle, the server stops the probe before its next layer (a later
    identical probe runs afresh, not from the cancelled one), and the panel probes again."""
    page, server = desktop.page, slow_server
    server.release_load.set()
    SLOW["seconds"] = 0.0
    start_run(desktop, "The probe of a slow model.", model=SLOW_LOAD)
    desktop.wait_ready()
    server.go.clear()
    before = server.layers_run
    server.hold_at = before + 1  # the probe's forward waits in its first layer: past the 2 s of the offer
    try:
        page.click("#probe-run")
        page.wait_for_selector("#probe-cancel:not([hidden])")
        assert page.locator("#probe-progress").is_visible()
        page.focus("#probe-sequences")  # the next tab stop: Find heads is disabled while the probe runs
        page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.id") == "probe-cancel"
        page.keyboard.press("Enter")
        page.wait_for_function("() => document.querySelector('#probe-message').textContent === 'Cancelled.'")
        assert page.locator("#probe-panel").get_attribute("data-state") == "idle"
        assert page.locator("#probe-cancel").is_hidden() and page.locator("#probe-progress").is_hidden()
        assert page.locator("#probe-run").is_enabled()
        wait_until(lambda: probe_flights(server) == 0, "the server never saw the probe's client leave")
    finally:
        server.hold_at = None
        server.go.set()
    # Probed again from the page: it runs afresh on the same worker, after the cancelled one has stopped, so
    # the layers run are the cancelled one's held layer and a whole probe's (another seed's, from the API).
    page.click("#probe-run")
    page.wait_for_function("() => document.querySelector('#probe-panel').dataset.state === 'ready'")
    assert page.locator("#probe-cancel").is_hidden()
    ran = server.layers_run - before
    whole = server.layers_run
    request = urllib.request.Request(
        f"{desktop.base}/api/probe",
        data=json.dumps({"model": SLOW_LOAD, "seed": 1}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=WAIT_MS / 1000) as response:  # noqa: S310 (local server)
        assert json.loads(response.read().decode().splitlines()[-1])["event"] == "done"
    assert ran == 1 + (server.layers_run - whole)
