"""Snapshot files (app/snapshot/) in Chromium, with no server: each opened from disk (file://) with every
request but the file's own blocked and recorded, and inside a sandboxed srcdoc iframe as a notebook
embeds one. One browser context for the module; the files are built once from the session's MiniLM and a
tiny T5."""

from __future__ import annotations

import html
import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import mha
from app.snapshot import build, save_html
from benchmarks.launch import OnlyFile
from tests.browser.conftest import CELL_CENTER_JS, VIEWPORT
from tests.seq2seq_checkpoints import build_seq2seq_checkpoint

LONG_TEXT = " ".join(
    ["The quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat."] * 12
)
# The page tests' payload (tests/browser/test_page.py), and two that would set a flag if they ever ran.
PAYLOAD = (
    '<img src=x onerror=alert(1)> <b>bold</b> <img src=y onerror="window.owned=1">'
    "<script>window.owned=2</script>"
)


class Opened:
    """A snapshot page, the requests it tried (all blocked but the file) and its script errors."""

    def __init__(self, page: Any, url: str) -> None:
        self.page, self.url = page, url
        only = OnlyFile(url)
        self.requests = only.blocked
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        page.route("**/*", only)
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        page.on(
            "console", lambda message: self.errors.append(message.text) if message.type == "error" else None
        )
        page.on("dialog", lambda dialog: (self.dialogs.append(dialog.message), dialog.dismiss()))

    def clean(self) -> None:
        """Nothing but the file loaded, and nothing went wrong."""
        assert self.requests == [] and self.errors == [] and self.dialogs == []


def wait_ready(frame: Any) -> None:
    frame.wait_for_function("() => ['ready', 'error'].includes(document.body?.dataset.state)")
    assert frame.evaluate("document.body.dataset.state") == "ready", frame.locator("#error").text_content()


@pytest.fixture(scope="module")
def t5(tmp_path_factory: pytest.TempPathFactory) -> mha.AttentionModel:
    folder = build_seq2seq_checkpoint("t5", tmp_path_factory.mktemp("t5"))
    return mha.load_pretrained(str(folder), device="cpu")


@pytest.fixture(scope="module")
def files(
    minilm: mha.AttentionModel, t5: mha.AttentionModel, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("snapshots")
    long = minilm.attend(LONG_TEXT, max_tokens=128, hidden_state=False)
    xss = minilm.attend(PAYLOAD, text_pair=PAYLOAD, hidden_state=False)
    seq2seq = t5.attend("The house is wonderful.", target="Das Haus ist wunderbar.", hidden_state=False)
    return {
        "minilm": save_html(long, folder / "minilm.html", model=minilm),
        "xss": save_html(xss, folder / "xss.html", model=minilm),
        "t5": save_html(seq2seq, folder / "t5.html", model=t5),
        # Its size limit below the 8-bit grid of 128 tokens: pooled, and said so.
        "pooled": save_html(
            long, folder / "pooled.html", model=minilm, max_bytes=build(long).asset_bytes + 60_000
        ),
    }


@pytest.fixture(scope="module")
def context(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport=VIEWPORT, accept_downloads=True)
    yield context
    context.close()


@pytest.fixture
def opened(context: Any) -> Iterator[Any]:
    """open(path) -> Opened, its run drawn ("ready"); every page opened is closed after the test."""
    pages: list[Opened] = []

    def open_file(path: Path) -> Opened:
        page = context.new_page()
        page.set_default_timeout(30_000)
        one = Opened(page, path.as_uri())
        pages.append(one)
        page.goto(one.url)
        wait_ready(page)
        return one

    yield open_file
    for one in pages:
        one.page.close()


def hover(page: Any, i: int, j: int) -> str:
    page.mouse.move(0, 0)
    page.locator("#head-detail").scroll_into_view_if_needed()
    page.mouse.move(*page.evaluate(CELL_CENTER_JS, [i, j]))
    label = page.locator("#head-detail .hoverlayer .hovertext")
    label.wait_for()
    return str(label.text_content())


def test_every_head_is_drawn_offline_and_the_detail_reads_its_values(opened, files, minilm) -> None:
    one = opened(files["minilm"])
    page = one.page
    assert page.locator("#grid .thumb[data-drawn=true]").count() == 6 * (12 + 1)
    assert page.locator("#snapshot-banner").is_visible() and page.locator("#run").is_hidden()
    assert page.locator("#examples-title").is_hidden()  # the examples run the model: their label goes too
    assert page.locator("#probe-panel").is_hidden()  # "Find heads" runs the model on its own input
    assert page.locator("#text").input_value() == LONG_TEXT  # the run's text, read-only
    assert page.locator("#text").evaluate("t => t.readOnly") and page.locator("#model").is_disabled()
    weights = minilm.attend(LONG_TEXT, max_tokens=128, hidden_state=False).attentions
    # The hover rounds to 3 decimals: within 5e-4 of the value it draws. A head the file carries exactly
    # draws the model's weight.
    page.click('#grid .thumb[data-layer="0"][data-head="1"]')
    page.wait_for_function("() => document.querySelector('#detail-caption').textContent.startsWith('Exact')")
    assert page.locator("#detail-title").text_content() == "Head detail: layer 0, head 1"
    read = re.search(r"(-?\d\.\d+)$", hover(page, 3, 2).strip())
    assert read and float(read.group(1)) == pytest.approx(float(weights[0, 1, 3, 2]), abs=5e-4)
    # One it does not: its 8-bit values, said so, within their bound (1/510) of the weight.
    page.click('#grid .thumb[data-layer="5"][data-head="11"]')
    page.wait_for_function(
        "() => document.querySelector('#detail-caption').textContent.includes('this snapshot')"
    )
    assert (
        page.locator("#detail-caption")
        .text_content()
        .startswith("8-bit values (within ±0.0020): this snapshot")
    )
    read = re.search(r"(-?\d\.\d+)$", hover(page, 3, 2).strip())
    assert read and float(read.group(1)) == pytest.approx(float(weights[5, 11, 3, 2]), abs=1 / 510 + 5e-4)
    # The page's keys: from the grid, down a layer.
    page.locator("#grid .thumb.selected").focus()
    page.keyboard.press("ArrowUp")
    page.wait_for_function(
        "() => document.querySelector('#detail-title').textContent.endsWith('layer 4, head 11')"
    )
    assert page.locator("#grid .thumb.selected").evaluate("t => [t.dataset.layer, t.dataset.head]") == [
        "4",
        "11",
    ]
    page.wait_for_function("() => document.body.dataset.insight === 'ready'")
    assert page.locator("#stats-table tbody tr").count() == 72
    one.clean()


def test_no_visible_button_is_dead(opened, files) -> None:
    """Every button a person can see and press works from the file alone: none says an error. Of the
    grid's 78 thumbnails (one handler) one head and one layer mean are pressed."""
    one = opened(files["minilm"])
    page = one.page
    page.wait_for_function("() => document.body.dataset.insight === 'ready'")
    page.locator("#rollout-panel").scroll_into_view_if_needed()
    page.wait_for_function(
        "() => ['ready', 'error'].includes(document.querySelector('#rollout').dataset.state)"
    )
    assert page.locator("#rollout").get_attribute("data-state") == "ready"
    with page.expect_download() as download:  # before Token lines turns it off: it exports the heatmap
        page.click("#export-png")
    assert download.value.suggested_filename.endswith(".png")
    # Number the buttons once (a click may add or remove some; those are pressed if still there).
    count = page.evaluate(
        """() => {
          const kept = (b) => !b.classList.contains('thumb') || b.matches(
            '[data-layer="2"][data-head="3"], [data-layer="4"][data-head="mean"]');
          const buttons = [...document.querySelectorAll('button')].filter(kept);
          buttons.forEach((b, i) => (b.dataset.press = String(i)));
          return buttons.length;
        }"""
    )
    pressed = []
    for i in range(count):
        button = page.locator(f'[data-press="{i}"]')
        if not (button.count() and button.is_visible() and button.is_enabled()):
            continue
        pressed.append(button.get_attribute("aria-label") or (button.text_content() or "").strip())
        button.click()
        wait_ready(page)
    assert {"SVG", "Heatmap", "Token lines", "Zoom in", "layer 4, mean of all heads"} <= set(pressed)
    assert page.locator("#error").is_hidden() and page.locator("#insight-status").text_content() == ""
    one.clean()


def test_tokens_stay_text(opened, files) -> None:
    one = opened(files["xss"])
    page = one.page
    assert (
        page.locator("#text").input_value() == PAYLOAD and page.locator("#text-pair").input_value() == PAYLOAD
    )
    assert page.evaluate("window.owned") is None
    assert page.locator("#head-detail img, #grid img, #head-detail b").count() == 0
    one.clean()


def test_a_pooled_file_says_so(opened, files) -> None:
    one = opened(files["pooled"])
    page = one.page
    blocks = re.search(r"pooled to (\d+) × \1 blocks", page.locator("#status").text_content())
    assert blocks and page.locator("#grid .thumb[data-drawn=true]").count() == 6 * 13
    assert page.locator("#status").text_content().startswith("128 tokens, pooled to")
    assert f"Every head is pooled to {blocks.group(1)}" in page.locator("#snapshot-banner").text_content()
    page.wait_for_function("() => document.querySelector('#detail-caption').textContent.includes('pooled')")
    one.clean()


def test_an_encoder_decoder_shows_its_three_kinds(opened, files) -> None:
    one = opened(files["t5"])
    page = one.page
    assert page.locator("#detail-title").text_content().startswith("Head detail: Cross-attention")
    for kind, title in (("encoder", "Encoder self-attention"), ("decoder", "Decoder self-attention")):
        page.check(f'#kind-switch input[value="{kind}"]')
        page.wait_for_function(
            f"() => document.querySelector('#detail-title').textContent.includes({title!r})"
        )
        wait_ready(page)
        page.wait_for_function("() => document.body.dataset.insight === 'ready'")
    one.clean()


def srcdoc_frame(page):
    """The #view iframe's Frame: the element's own frame object, which stays the same while its first
    about:blank document gives way to the srcdoc one (a page.frames scan right after goto could still miss
    it on a loaded machine); wait_ready then waits inside it."""
    handle = page.wait_for_selector("#view", state="attached")
    frame = handle.content_frame()
    assert frame is not None
    return frame


@pytest.fixture
def embedded(context: Any, tmp_path: Path) -> Iterator[Any]:
    """embed(path, sandbox=..., above="") -> (Opened, the iframe's Frame), its run drawn: the file inside a
    host page's srcdoc iframe #view of that sandbox, as a notebook embeds it, below the host's `above`
    markup; every page opened is closed after the test."""
    pages: list[Any] = []

    def embed(path: Path, *, sandbox: str, above: str = "") -> tuple[Opened, Any]:
        document = html.escape(path.read_text(encoding="utf-8"), quote=True)
        host = tmp_path / f"host-{len(pages)}.html"
        host.write_text(
            f'<!doctype html><title>host</title>{above}<iframe id="view" sandbox="{sandbox}" '
            f'style="width: 1400px; height: 900px" srcdoc="{document}"></iframe>',
            encoding="utf-8",
        )
        page = context.new_page()
        pages.append(page)
        one = Opened(page, host.as_uri())
        page.goto(one.url)
        inner = srcdoc_frame(page)
        wait_ready(inner)
        return one, inner

    yield embed
    for page in pages:
        page.close()


def test_it_works_inside_a_sandboxed_srcdoc_iframe(embedded, files) -> None:
    """As a notebook embeds it: an opaque origin, no storage, no history to write."""
    one, inner = embedded(files["minilm"], sandbox="allow-scripts allow-downloads")
    frame = one.page.frame_locator("#view")
    assert frame.locator("#grid .thumb[data-drawn=true]").count() == 6 * 13
    frame.locator('#grid .thumb[data-layer="1"][data-head="0"]').click()
    inner.wait_for_function(
        "() => document.querySelector('#detail-title').textContent.endsWith('layer 1, head 0')"
    )
    inner.wait_for_function("() => document.body.dataset.insight === 'ready'")
    one.clean()


def test_save_as_html_downloads_this_run_opening_on_its_head(session, opened, tmp_path: Path) -> None:
    """The served page's "Save as HTML", reached by the keyboard: the button says it builds meanwhile, and
    the file it downloads opens from disk, every request blocked, on the head that was selected."""
    page = session.open()
    session.run("The cat sat on the mat because it was tired.")
    page.click('#grid .thumb[data-layer="3"][data-head="7"]')
    page.wait_for_function(
        "() => document.querySelector('#detail-title').textContent.endsWith('layer 3, head 7')"
    )
    # Whether the button was marked busy while the server built the file (a class of change, not a time).
    page.evaluate(
        """() => {
          const button = document.querySelector('#export-html');
          window.busy = [];
          new MutationObserver(() => window.busy.push(button.getAttribute('aria-busy') === 'true' &&
            button.getAttribute('aria-disabled') === 'true' && button.textContent === 'Saving…'))
            .observe(button, { attributes: true, childList: true });
        }"""
    )
    page.focus("#export-json-head")
    page.keyboard.press("Tab")  # the next control after the JSON exports
    assert page.evaluate("document.activeElement.id") == "export-html"
    with page.expect_download() as info:
        page.keyboard.press("Enter")
    name = info.value.suggested_filename
    assert re.fullmatch(r"headscope-all-MiniLM-L6-v2-[0-9a-f]{8}\.html", name), name
    page.wait_for_function("() => document.querySelector('#export-html').getAttribute('aria-busy') === null")
    assert (
        True in page.evaluate("window.busy") and page.locator("#export-html").text_content() == "Save as HTML"
    )
    assert page.locator("#error").is_hidden()
    path = tmp_path / name
    info.value.save_as(path)
    one = opened(path)
    saved = one.page
    assert saved.locator("#grid .thumb[data-drawn=true]").count() == 6 * (12 + 1)
    assert saved.locator("#detail-title").text_content() == "Head detail: layer 3, head 7"
    assert saved.locator("#grid .thumb.selected").evaluate("t => [t.dataset.layer, t.dataset.head]") == [
        "3",
        "7",
    ]
    # It carries the selected head's exact values: the detail's caption says so once they are read.
    saved.wait_for_function("() => document.querySelector('#detail-caption').textContent.startsWith('Exact')")
    assert saved.locator("#export-html").is_hidden()  # the file cannot make another: it has no model
    one.clean()


# Records, from the document's start, whether Plotly existed when the grid's mark was set, and any script the
# file's policy refused.
WATCH_JS = """
window.seen = { plotlyAtGrid: null, violations: [] };
document.addEventListener('securitypolicyviolation', (e) => window.seen.violations.push(e.violatedDirective));
const mark = performance.mark.bind(performance);
performance.mark = (name, ...rest) => {
  if (name === 'headscope-grid') window.seen.plotlyAtGrid = typeof window.Plotly;
  return mark(name, ...rest);
};
"""


def test_plotly_runs_after_the_grid_is_drawn_within_the_policy(context, files) -> None:
    """plotly.js is carried as text and run by the page once the grid is painted (plotly-ready.js), as an
    inline script the file's Content-Security-Policy allows by its hash (refused, no detail would draw)."""
    page = context.new_page()
    page.add_init_script(WATCH_JS)
    one = Opened(page, files["minilm"].as_uri())
    try:
        page.goto(one.url)
        wait_ready(page)
        seen = page.evaluate("window.seen")
        assert seen == {"plotlyAtGrid": "undefined", "violations": []}
        assert page.evaluate("typeof window.Plotly.react") == "function"
        assert page.locator("#plotly-source").count() == 0  # its text now lives in the script it became
        assert page.locator("#head-detail .hoverlayer").count() == 1  # the detail is Plotly's figure
        one.clean()
    finally:
        page.close()


def test_it_completes_in_a_frame_that_never_paints(embedded, files) -> None:
    """A notebook output scrolled far away: Chromium runs no animation frame in an off-screen cross-origin
    frame (none in a second, tried), so plotly.js runs on plotly-ready.js's fallback timer, and the view
    still completes."""
    one, inner = embedded(
        files["minilm"], sandbox="allow-scripts", above='<div style="height: 20000px"></div>'
    )
    assert inner.evaluate("typeof window.Plotly") == "object"
    one.clean()


def test_a_snapshot_of_the_probes_input_opens_on_it(session, opened, tmp_path: Path) -> None:
    """POST /api/snapshot of the head probe's first sequence: the file opens on that input (input=probe in
    its carried state, its requests answered from the carried data), says so, and offers no way back to a
    text it does not carry."""
    body = {"probe": {"seed": 0, "length": 50}, "layer": 3, "head": 7}
    request = urllib.request.Request(
        f"{session.base}/api/snapshot",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    path = tmp_path / "probe.html"
    with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310 (the test's own server)
        path.write_bytes(response.read())
    one = opened(path)
    page = one.page
    assert page.locator("#grid .thumb[data-drawn=true]").count() == 6 * (12 + 1)
    assert page.locator("#detail-title").text_content() == "Head detail: layer 3, head 7"
    assert page.evaluate("document.querySelector('#head-detail').data[0].z.length") == 2 * 50 + 1
    notice = page.locator("#probe-input")
    assert notice.is_visible() and "seed 0" in (notice.text_content() or "")
    assert page.locator("#probe-input-back").is_hidden()
    assert page.locator("#error").is_hidden()
    one.clean()
