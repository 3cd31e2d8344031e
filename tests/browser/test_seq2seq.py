"""The page for encoder-decoder models, in headless Chromium against the real app (fixtures in conftest.py).

A tiny random T5 ("t5-tiny": 2 encoder layers, 3 decoder layers, 4 heads) is served beside the encoders and
decoders. Every expected number comes from mha itself, run here on the same checkpoint.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlparse

import pytest

from tests.tolerances import FORWARD

pytestmark = pytest.mark.browser

SOURCE = "The house is wonderful."
TARGET = "Das Haus ist wunderbar."
# The hover shows a weight to 3 decimals (half a unit of the last place: 5e-4) of the server's float32
# forward, which sums in its own order (one thread, its own batch shape) against ours: FORWARD more.
HOVER = 5e-4 + FORWARD

FIGURE_JS = """() => {
  const gd = document.querySelector('#head-detail');
  const [heatmap] = gd.data.filter((t) => t.type === 'heatmap');
  const {xaxis, yaxis} = gd.layout;
  const titles = {xtitle: xaxis.title.text, ytitle: yaxis.title.text};
  // Tick labels are Plotly text, entities for < > &: the DOM's text of each reads as the page shows it.
  const text = (html) => new DOMParser().parseFromString(html, 'text/html').documentElement.textContent;
  return {z: heatmap.z, x: xaxis.ticktext.map(text), y: yaxis.ticktext.map(text), ...titles};
}"""


def spelled(tokens: list[str]) -> list[str]:
    """Tokens as the page writes them: SentencePiece's word mark as a visible space (decoder.js)."""
    return [token.replace("▁", "␣") for token in tokens]


@pytest.fixture(scope="module")
def reference(tiny_t5_dir: Path) -> Any:
    """mha's own answer for SOURCE forced through TARGET, on the checkpoint the server serves."""
    import mha

    return mha.load_pretrained(tiny_t5_dir, device="cpu").attend(SOURCE, target=TARGET)


def run(session: Any) -> None:
    """Run the form as it stands and wait for the drawing."""
    session.page.evaluate("document.body.dataset.state = 'idle'")
    session.page.click("#run")
    session.wait_ready()


def choose_kind(session: Any, kind: str) -> None:
    """Click the kind switch's `kind` radio and wait for the grid and the detail to follow."""
    page = session.page
    page.evaluate("document.body.dataset.state = 'idle'")
    page.check(f"#kind-switch input[value={kind}]")
    session.wait_ready()


def test_typed_source_and_target_cross_attention_hover_reads_mha(
    session: Any, seq2seq_model: str, reference: Any, artifacts: Path
) -> None:
    page = session.open()
    page.select_option("#model", seq2seq_model)
    page.fill("#text", SOURCE)
    if page.locator("#target-field").is_hidden():
        # A model not loaded yet has no known architecture: one run (the model writes the target) teaches it.
        run(session)
    assert page.locator("#target-field").is_visible()
    assert page.locator("#words").is_disabled()  # its answers are token-level: the API refuses words
    page.fill("#target", TARGET)
    run(session)
    assert parse_qs(urlparse(page.url).query)["target"] == [TARGET]
    assert "wrote" not in page.locator("#status").text_content()  # forced: the model wrote nothing
    assert page.locator("#kind-switch").is_visible()

    # Away to the encoder and back to cross-attention, by the switch.
    choose_kind(session, "encoder")
    assert parse_qs(urlparse(page.url).query)["kind"] == ["encoder"]
    choose_kind(session, "cross")
    layer, head = 2, 1  # the decoder's last layer: it has 3, the encoder 2
    # The marker goes first, so the head drawn before cannot pass for this one.
    page.evaluate("document.querySelector('#head-detail').dataset.exact = 'pending'")
    page.locator(f'#grid .thumb[data-layer="{layer}"][data-head="{head}"]').click()
    page.wait_for_selector("#head-detail[data-exact=true]")
    title = page.locator("#detail-title").text_content() or ""
    assert f"Cross-attention, layer {layer}, head {head}" in title

    figure = page.evaluate(FIGURE_JS)
    cross = reference.cross_attentions[layer, head]  # [m, n]: target rows, source columns
    m, n = cross.shape
    assert (m, n) == (len(reference.target_tokens), len(reference.tokens)) and m != n
    assert figure["y"] == spelled(reference.target_tokens)
    assert figure["x"] == spelled(reference.tokens)
    assert (figure["ytitle"], figure["xtitle"]) == ("target token (query)", "source token (key)")
    worst = max(abs(figure["z"][i][j] - float(cross[i, j])) for i in range(m) for j in range(n))
    assert worst <= FORWARD, f"exact cross-attention differs from mha by {worst}"

    # The hover on the sharpest alignment: the target row whose largest weight is the largest, at that key.
    i = int(cross.max(dim=1).values.argmax())
    j = int(cross[i].argmax())
    text = session.hover_text(i, j)
    query, key = spelled(reference.target_tokens)[i], spelled(reference.tokens)[j]
    where = rf"query '{re.escape(query)}' \({i}\) → key '{re.escape(key)}' \({j}\)"
    match = re.fullmatch(where + r": ([0-9.]+)", text)
    assert match, text
    assert abs(float(match.group(1)) - float(cross[i, j])) <= HOVER
    page.screenshot(path=artifacts / "seq2seq-cross.png", full_page=True)


def test_blank_target_the_model_writes_it(session: Any, seq2seq_model: str, tiny_t5_dir: Path) -> None:
    import mha

    page = session.open(f"?text={quote(SOURCE)}&model={seq2seq_model}&kind=decoder")
    session.wait_ready()
    status = page.locator("#status").text_content() or ""
    wrote = re.search(r"the model wrote (\d+) tokens?", status)
    assert wrote, status
    # Greedy, as mha writes it: the decoder's rows are the start token and what the model wrote.
    written = mha.load_pretrained(tiny_t5_dir, device="cpu").attend(SOURCE, target=None, max_new_tokens=20)
    assert isinstance(written, mha.Seq2SeqResult)
    assert int(wrote.group(1)) == written.generated
    figure = page.evaluate(FIGURE_JS)
    assert figure["y"] == figure["x"] == spelled(written.target_tokens)
    assert "target" not in parse_qs(urlparse(page.url).query)  # nothing typed: a reload writes it again
    assert page.locator("#kind-switch input[value=decoder]").is_checked()
    assert "Decoder self-attention" in (page.locator("#detail-title").text_content() or "")


def test_kind_in_the_link_and_views_that_follow_it(session: Any, seq2seq_model: str, reference: Any) -> None:
    link = f"?text={quote(SOURCE)}&target={quote(TARGET)}&model={seq2seq_model}&kind=encoder&layer=1&head=3"
    page = session.open(link)
    session.wait_ready()
    assert page.locator("#kind-switch input[value=encoder]").is_checked()
    figure = page.evaluate(FIGURE_JS)
    assert figure["y"] == figure["x"] == spelled(reference.tokens)
    # The rollout chains the encoder: drawn for it, and for cross-attention the panel says why not.
    page.locator("#rollout").scroll_into_view_if_needed()
    page.wait_for_selector("#rollout[data-state=ready]")
    choose_kind(session, "cross")
    assert "kind" not in parse_qs(urlparse(page.url).query)  # cross is the default
    page.locator("#rollout-panel").scroll_into_view_if_needed()
    assert page.locator("#rollout").get_attribute("data-state") == "off"
    assert "encoder only" in (page.locator("#rollout-caption").text_content() or "")
    # Statistics of the cross heads: one row a decoder head (3 layers × 4 heads).
    page.wait_for_function("() => document.body.dataset.insight === 'ready'")
    assert page.locator("#stats-table tbody tr").count() == 3 * 4

    # Token lines: an alignment, target tokens on the left, source tokens on the right.
    page.click("#tab-tokens")
    page.wait_for_selector("#token-lines svg")
    titles = page.locator("#token-lines .side-title").all_text_contents()
    assert titles == ["Target (queries)", "Source (keys)"]
    left = page.locator("#token-lines text.left").all_text_contents()
    right = page.locator("#token-lines text.right").all_text_contents()
    assert (left, right) == (spelled(reference.target_tokens), spelled(reference.tokens))
    assert int(page.locator("#token-view").get_attribute("data-lines") or 0) > 0

    # The switch is one tab stop whose arrow keys choose, as radios do.
    page.evaluate("document.body.dataset.state = 'idle'")
    page.focus("#kind-switch input[value=cross]")
    page.keyboard.press("ArrowUp")
    session.wait_ready()
    assert parse_qs(urlparse(page.url).query)["kind"] == ["decoder"]
    assert "Decoder self-attention" in (page.locator("#detail-title").text_content() or "")


def test_target_box_and_kind_switch_hidden_for_an_encoder(session: Any) -> None:
    page = session.open("?text=" + quote(SOURCE))
    session.wait_ready()
    assert page.locator("#target-field").is_hidden()
    assert page.locator("#kind-switch").is_hidden()
    assert page.locator("#words").is_enabled()
    assert "kind=" not in page.url and "target=" not in page.url


def test_choosing_an_encoder_decoder_offers_the_target_box_before_any_run(
    session: Any, seq2seq_model: str
) -> None:
    # /api/models names the architecture from the checkpoint's config, loaded or not (test_seq2seq_api).
    page = session.open()
    assert page.locator("#target-field").is_hidden()
    page.select_option("#model", seq2seq_model)
    page.wait_for_selector("#target-field", state="visible")
    assert page.locator("#words").is_disabled()
