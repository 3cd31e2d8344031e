"""Browser fixtures: the real app under uvicorn (a subprocess on a free port) and Debian's Chromium.

The app serves the embedded default model plus a tiny random GPT-2 checkpoint ("tiny-gpt2") so the causal
rendering can be checked. Everything is local: the page must never reach past the app's base URL.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path(os.environ.get("HEADSCOPE_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
TINY_GPT2 = "tiny-gpt2"
SERVER_START_S = 180  # loading the default model on a busy shared machine can take a while


def build_tiny_gpt2(directory: Path) -> Path:
    """A 2-layer, 4-head random GPT-2 with a byte-level BPE trained in milliseconds, saved offline."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2Config, GPT2Model, GPT2TokenizerFast

    corpus = [
        "The cat sat on the mat because it was tired.",
        "A dog ran in the park and the cat watched it.",
        "Attention heads look at tokens; some look back at the start.",
    ] * 20
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus, vocab_size=400, min_frequency=1, special_tokens=["<|endoftext|>"])
    tokenizer = GPT2TokenizerFast(
        tokenizer_object=bpe._tokenizer,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    tokenizer.save_pretrained(directory)
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=128, n_embd=32, n_layer=2, n_head=4)
    GPT2Model(config).save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_gpt2_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Prefer the shared checkpoints of tests/conftest.py when that fixture exists.
    try:
        checkpoints: dict[str, Path] = request.getfixturevalue("tiny_checkpoints")
        return Path(checkpoints["gpt2"])
    except pytest.FixtureLookupError:
        return build_tiny_gpt2(tmp_path_factory.mktemp("tiny-gpt2"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 (local test server)
        return json.load(response)


@pytest.fixture(scope="session")
def server(tiny_gpt2_dir: Path) -> Iterator[str]:
    port = _free_port()
    env = {
        **os.environ,
        "HEADSCOPE_MODELS": json.dumps({TINY_GPT2: str(tiny_gpt2_dir)}),
        "HEADSCOPE_DEVICE": "cpu",
        "HEADSCOPE_THREADS": "1",
        "HEADSCOPE_LOG_LEVEL": "warning",
    }
    command = [sys.executable, "-m", "uvicorn", "app.main:app", "--host", "127.0.0.1", "--port", str(port)]
    log = ARTIFACTS / "browser-server.log"
    ARTIFACTS.mkdir(exist_ok=True)
    with log.open("wb") as sink:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + SERVER_START_S
        try:
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"uvicorn exited with {process.returncode}; see {log}")
                try:
                    if _get_json(f"{base}/api/health").get("status") == "ok":
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"server not healthy after {SERVER_START_S} s; see {log}")
                time.sleep(0.3)
            yield base
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


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
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (make chromium installs Debian's)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield instance
        instance.close()


class PageSession:
    """A page plus what it did: every request URL, dialogs that fired, uncaught script errors."""

    def __init__(self, page: Any, base: str) -> None:
        self.page = page
        self.base = base
        self.requests: list[str] = []
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        page.on("request", lambda request: self.requests.append(request.url))
        page.on("dialog", self._dialog)
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        # A CSP violation is only reported on the console; the page must not cause any.
        page.on("console", self._console)

    def _console(self, message: Any) -> None:
        if message.type == "error" and "Content Security Policy" in message.text:
            self.errors.append(message.text)

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def open(self, query: str = "") -> Any:
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


@pytest.fixture
def session(browser: Any, server: str) -> Iterator[PageSession]:
    context = browser.new_context(viewport={"width": 1500, "height": 1000}, accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(30_000)
    tracked = PageSession(page, server)
    yield tracked
    context.close()
    # Every test also proves the page stayed on our server and ran without script errors.
    # blob: URLs of the app's own origin are in-memory downloads made by the page, not network requests.
    local = (server + "/", f"blob:{server}/")
    outside = [url for url in tracked.requests if not url.startswith(local)]
    assert outside == [], f"requests left the server: {outside}"
    assert tracked.errors == [], f"uncaught page errors: {tracked.errors}"
