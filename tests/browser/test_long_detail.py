"""The long-input detail (app/static/js/long-detail.js) driven standalone on the real app page: a tiny Llama
that takes 8,192 tokens traces a ~3,100-token text through /api/trace, then LongDetail shows one head pooled
to at most 512 x 512 cells, zooms down to exact cells whose hover reads /api/trace/row's value, drops an
answer that is no longer the latest, resets on a double click and pools by mean on request."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import mha
from tests.browser.conftest import VIEWPORT, PageSession, cell_js, zoom_js
from tests.tolerances import ROUND6, regemm_weight, rounded_row_sum

pytestmark = pytest.mark.browser

TEXT = " ".join(f"Sentence {i} says the cat sat on the mat." for i in range(160))  # ~3,100 tokens
LAYER, HEAD = 1, 2
MAX_CELLS = 512

SETUP_JS = """async ([text, model, layer, head]) => {
  const response = await fetch('/api/trace', {
    method: 'POST', headers: {'Content-Type': 'application/json'}, body: JSON.stringify({text, model}),
  });
  const events = (await response.text()).trim().split('\\n').map((line) => JSON.parse(line));
  const trace = events[events.length - 1];
  if (trace.event !== 'done') throw new Error(JSON.stringify(trace));
  const box = document.createElement('div');
  box.id = 'long-box';
  box.style.width = '900px';
  const gd = document.createElement('div');
  gd.id = 'long-zoom';
  const readout = document.createElement('p');
  readout.id = 'long-readout';
  readout.setAttribute('aria-live', 'polite');
  box.append(gd, readout);
  document.body.prepend(box);
  const { LongDetail } = await import('/static/js/long-detail.js');
  window.longDetail = new LongDetail(gd, { readout });
  window.longQuery = { text, pair: '', model, chat: false };
  window.longTrace = trace;
  const drawn = await window.longDetail.show({ query: window.longQuery, trace, layer, head });
  return { drawn, n: trace.n, tokens: trace.tokens };
}"""

FIGURE_JS = """() => {
  const gd = document.querySelector('#long-zoom');
  const t = gd.data[0];
  const axis = (a) => ({
    title: a.title.text, range: a.range, tickvals: a.tickvals ?? null, ticktext: a.ticktext ?? null,
  });
  return {
    rows: t.z.length, cols: t.z[0].length, x: t.x, y: t.y, hovertemplate: t.hovertemplate,
    xaxis: axis(gd.layout.xaxis), yaxis: axis(gd.layout.yaxis), exact: gd.dataset.exact,
    badge: document.querySelector('.long-detail-badge').textContent,
    readout: document.querySelector('#long-readout').textContent,
  };
}"""

ZOOM_JS = zoom_js("#long-zoom")

SHOWS_JS = "(cols) => document.querySelector('#long-zoom').dataset.cols === cols"

CELL_JS = cell_js("#long-zoom")

# What the page shows for tokens: the axis label (display token, shortened, escaped) and the hover's words.
LABELS_JS = """async ([indices, i, j]) => {
  const { displayToken } = await import('/static/js/decoder.js');
  const { plotlyText, shorten } = await import('/static/js/heatmap.js');
  const shown = (k) => displayToken(window.longTrace.tokens[k], window.longTrace.byte_level);
  return {
    ticks: indices.map((k) => plotlyText(shorten(shown(k)))),
    hover: `query '${shown(i)}' (${i}) → key '${shown(j)}' (${j})`,
  };
}"""

# Every window fetch is logged; the first answer is held back 1.5 s and then handed over even though its
# fetch was aborted (as an answer already on its way would be): only the seq check can keep it off the plot.
HOLD_JS = """() => {
  const log = { asked: [], aborted: [], drawn: [], loads: [] };
  window.windowLog = log;
  const original = window.fetch;
  let held = 0;
  window.fetch = async (url, options) => {
    if (!String(url).includes('/api/trace/window')) return original(url, options);
    const cols = JSON.parse(options.body).cols;
    log.asked.push(cols);
    options.signal?.addEventListener('abort', () => log.aborted.push(cols));
    const response = await original(url, { ...options, signal: undefined });
    if (held++ === 0) await new Promise((resolve) => setTimeout(resolve, 1500));
    return response;
  };
  const react = window.Plotly.react;
  window.Plotly.react = (gd, data, ...rest) => {
    log.drawn.push([data[0].x[0], data[0].x[data[0].x.length - 1]]);
    return react(gd, data, ...rest);
  };
  const detail = window.longDetail;
  const load = detail.load.bind(detail);
  detail.load = (...span) => {
    const done = load(...span);
    log.loads.push(done);
    return done;
  };
  return true;
}"""


@pytest.fixture
def shown(browser: Any, server: str, long_model: str) -> Iterator[tuple[PageSession, dict[str, Any]]]:
    """The app's page with a LongDetail showing head (LAYER, HEAD) of TEXT's trace on the session server's
    long Llama; the window requests' bodies are kept in page.windows. The page must stay on our server and
    raise no script errors."""
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.set_default_timeout(60_000)  # the trace's forward on a busy shared machine
    tracked = PageSession(page, server)
    windows: list[dict[str, Any]] = []

    def asked(request: Any) -> None:
        if request.url.endswith("/api/trace/window"):
            windows.append(json.loads(request.post_data))

    page.on("request", asked)
    tracked.windows = windows  # type: ignore[attr-defined]
    tracked.open()
    setup = page.evaluate(SETUP_JS, [TEXT, long_model, LAYER, HEAD])
    assert setup["drawn"] is True
    yield tracked, setup
    context.close()
    assert all(url.startswith(server + "/") for url in tracked.requests), tracked.requests
    assert tracked.errors == [], f"uncaught page errors: {tracked.errors}"


def post(base: str, path: str, payload: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        f"{base}{path}", json.dumps(payload).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310 (loopback)
        return json.load(response)


Shown = tuple[PageSession, dict[str, Any]]


def test_the_first_view_is_the_whole_head_pooled_to_the_plot(shown: Shown, artifacts: Path) -> None:
    session, setup = shown
    n = setup["n"]
    assert n > 3000
    # The plot is 634 px in its 900 px box, so the window is asked for at the 512-cell cap, whole.
    assert session.windows[0]["rows"] is None and session.windows[0]["cols"] is None  # type: ignore[attr-defined]
    assert session.windows[0]["max_cells"] == MAX_CELLS  # type: ignore[attr-defined]
    figure = session.page.evaluate(FIGURE_JS)
    assert figure["rows"] == figure["cols"] == MAX_CELLS
    # Edges in token coordinates: the axes run over [0, n) whatever the pooling. The server's blocks are
    # floor(c·n/512) .. floor((c+1)·n/512) - 1: drawn evenly, each edge within a token of its own, and the
    # hover names their true tokens.
    true = [c * n // MAX_CELLS for c in range(MAX_CELLS + 1)]
    assert len(figure["x"]) == len(figure["y"]) == MAX_CELLS + 1
    assert (figure["x"][0], figure["x"][-1], figure["y"][0], figure["y"][-1]) == (0, n, 0, n)
    assert all(t <= x < t + 1 for t, x in zip(true, figure["x"], strict=True))
    r, c = 300, 100  # a block of keys wholly before its queries: not masked
    hover = f"queries {true[r]:,}–{true[r + 1] - 1:,} → keys {true[c]:,}–{true[c + 1] - 1:,}"
    text = "([r, c]) => document.querySelector('#long-zoom').data[0].text[r][c]"
    assert session.page.evaluate(text, [r, c]) == hover
    assert figure["xaxis"]["range"] == [0, n] and figure["yaxis"]["range"] == [n, 0]  # queries run down
    factor = -(-n // MAX_CELLS)  # the largest of 512 blocks whose sizes differ by at most one
    last = f"{n - 1:,}"
    assert figure["xaxis"]["title"] == f"Key tokens 0–{last}, pooled ×{factor} (max)"
    assert figure["yaxis"]["title"] == f"Query tokens 0–{last}, pooled ×{factor} (max)"
    assert figure["badge"] == f"pooled ×{factor} × {factor} (max)" and figure["exact"] == "false"
    # The head is named as the normal page names it: 4 query heads over 2 KV heads, 2 a group.
    assert figure["readout"] == (
        f"L{LAYER} H{HEAD} · kv {HEAD // 2}: queries 0–{last}, keys 0–{last}; 512 × 512 cells, "
        f"pooled ×{factor} × {factor} (max)."
    )
    assert ": max %{z:.4f}" in figure["hovertemplate"]
    session.page.locator("#long-box").screenshot(path=artifacts / "long-detail-pooled.png")

    # The pooling switch asks again for the same view, pooled by mean.
    session.page.select_option(".long-detail-reduce select", "mean")
    session.page.wait_for_function("() => document.querySelector('#long-zoom').dataset.reduce === 'mean'")
    figure = session.page.evaluate(FIGURE_JS)
    assert figure["badge"] == f"pooled ×{factor} × {factor} (mean)"
    assert figure["xaxis"]["title"].endswith("(mean)") and ": mean %{z:.4f}" in figure["hovertemplate"]
    assert session.windows[-1]["reduce"] == "mean"  # type: ignore[attr-defined]


def test_a_zoom_fetches_exact_cells_whose_hover_is_the_row(
    shown: Shown, long_model: str, long_llama_dir: Path, artifacts: Path
) -> None:
    session, setup = shown
    page = session.page
    n = setup["n"]
    # Query i's exact weights from the trace's row; the view is queries 1,000-1,149 and the 120 keys around
    # i's heaviest one, so the hover is read on a weight worth reading, not a zero compared with a zero.
    i = 1100
    head = {"text": TEXT, "model": long_model, "layer": LAYER, "head": HEAD}
    row = post(session.base, "/api/trace/row", {**head, "q": i})
    assert row["n"] == n
    j = max(range(i + 1), key=lambda key: row["values"][key])
    assert row["values"][j] > 0.01
    k0 = min(max(j - 60, 0), n - 120)
    cols, rows = [k0, k0 + 120], [1000, 1150]
    page.evaluate(ZOOM_JS, [cols, rows[::-1]])
    page.wait_for_function(SHOWS_JS, arg=f"{k0},{k0 + 120}")
    asked = session.windows[-1]  # type: ignore[attr-defined]
    assert (asked["rows"], asked["cols"], asked["max_cells"]) == (rows, cols, MAX_CELLS)
    figure = page.evaluate(FIGURE_JS)
    assert figure["exact"] == "true" and (figure["rows"], figure["cols"]) == (150, 120)
    assert figure["x"] == list(range(k0, k0 + 121)) and figure["y"] == list(range(1000, 1151))
    assert figure["xaxis"]["range"] == cols and figure["yaxis"]["range"] == [1150, 1000]  # the zoom kept
    assert figure["xaxis"]["title"] == f"Key tokens {k0:,}–{k0 + 119:,}"
    assert figure["yaxis"]["title"] == "Query tokens 1,000–1,149"
    assert figure["badge"] == "exact: 1 cell = 1 token"
    assert figure["readout"].endswith("150 × 120 cells, exact: 1 cell = 1 token.")
    # Tick labels are the tokens at their cells' centres.
    ticks = [v - 0.5 for v in figure["xaxis"]["tickvals"]]
    assert ticks and all(k0 <= t < k0 + 120 and t == int(t) for t in ticks)
    labels = page.evaluate(LABELS_JS, [[int(t) for t in ticks], i, j])
    assert figure["xaxis"]["ticktext"] == labels["ticks"]

    # The hover over cell (i, j) reads the exact weight in the normal detail's words.
    page.mouse.move(*page.evaluate(CELL_JS, [i, j]))
    hover = page.locator("#long-zoom .hoverlayer .hovertext")
    hover.wait_for()
    words, value = re.fullmatch(r"(.*): (\d\.\d{6})", hover.text_content() or "").groups()  # type: ignore[union-attr]
    assert words == labels["hover"]
    page.locator("#long-box").screenshot(path=artifacts / "long-detail-exact.png")
    # The window's block of rows and the row compute query i's scores in different GEMM shapes: a score is a
    # D-term dot product, reordered it moves by up to D·u·|s|max (Higham's gamma_D), the weight exp(s - lse)
    # by its weight (<= 1) times that, plus one rounding of exp each; each side rounds to 6 decimals.
    model = mha.load_pretrained(long_llama_dir, device="cpu")
    trace = model.trace(TEXT)
    kept = trace.layers[LAYER]
    q = kept.q[HEAD].double().norm(dim=-1).max().item()
    k = kept.k[HEAD // (kept.q.shape[0] // kept.k.shape[0])].double().norm(dim=-1).max().item()
    bound = regemm_weight(kept.q.shape[-1], trace.scale * q * k) + 2 * ROUND6
    assert abs(float(value) - row["values"][j]) <= bound
    # The whole row of the figure: the row's weights up to the diagonal, gaps (masked) after it.
    drawn = page.evaluate("(r) => document.querySelector('#long-zoom').data[0].z[r]", i - 1000)
    for c, v in enumerate(drawn):
        key = k0 + c
        assert v is None if key > i else abs(v - row["values"][key]) <= bound, (key, v)
    assert abs(sum(row["values"]) - 1) <= rounded_row_sum(n)  # a whole softmax row

    # Another head of the same input keeps the zoom: its window of the same tokens is fetched.
    other = "async () => longDetail.show({query: longQuery, trace: longTrace, layer: 0, head: 3})"
    assert page.evaluate(other) is True
    asked = session.windows[-1]  # type: ignore[attr-defined]
    assert (asked["layer"], asked["head"], asked["rows"], asked["cols"]) == (0, 3, rows, cols)
    figure = page.evaluate(FIGURE_JS)
    assert figure["xaxis"]["range"] == cols and figure["exact"] == "true"
    assert figure["readout"].startswith("L0 H3 · kv 1: queries 1,000–1,149")

    # A double click goes back to the whole head, fetched again.
    page.mouse.dblclick(*page.evaluate(CELL_JS, [i, j]))
    page.wait_for_function(SHOWS_JS, arg=f"0,{n}")
    figure = page.evaluate(FIGURE_JS)
    assert figure["xaxis"]["range"] == [0, n] and figure["exact"] == "false"


def test_only_the_last_of_two_zooms_draws(shown: Shown) -> None:
    session, _ = shown
    page = session.page
    page.evaluate(HOLD_JS)
    page.evaluate(ZOOM_JS, [[200, 400], [400, 200]])
    page.wait_for_function("() => window.windowLog.asked.length === 1")  # the first fetch is under way
    page.evaluate(ZOOM_JS, [[2000, 2100], [2100, 2000]])
    page.wait_for_function(SHOWS_JS, arg="2000,2100")
    loads = page.evaluate("async () => Promise.all(window.windowLog.loads)")
    log = page.evaluate("() => ({...window.windowLog, loads: null})")
    assert loads == [False, True]  # the held answer came after the second was asked for: not drawn
    assert log["asked"] == [[200, 400], [2000, 2100]] and log["aborted"] == [[200, 400]]
    assert log["drawn"] == [[2000, 2100]]
    assert page.evaluate(FIGURE_JS)["exact"] == "true"


def test_a_failed_window_says_why(shown: Shown) -> None:
    session, _ = shown
    drawn = session.page.evaluate(
        "async () => window.longDetail.show({query: longQuery, trace: longTrace, layer: 0, head: 99})"
    )
    assert drawn is False
    readout = session.page.text_content("#long-readout") or ""
    assert readout.startswith("The window could not be loaded: ") and "99" in readout
    assert "99" in (session.page.text_content(".long-detail-badge") or "")
    # The other head's figure is gone: nothing on screen can be read as head 99's.
    assert session.page.evaluate("() => document.querySelector('#long-zoom').data === undefined")


# The next window fetch waits at a gate the test opens (window.openGate()); its answer is then handed over
# even if the fetch was aborted meanwhile, as an answer already on its way would be.
GATE_JS = """() => {
  const original = window.fetch;
  let gate;
  window.gated = new Promise((resolve) => (gate = resolve));
  window.openGate = () => gate();
  window.asked = 0;
  window.fetch = async (url, options) => {
    if (!String(url).includes('/api/trace/window')) return original(url, options);
    if (window.asked++ > 0) return original(url, options);
    const response = await original(url, { ...options, signal: undefined });
    await window.gated;
    return response;
  };
}"""


def test_a_zoom_made_while_a_head_loads_is_kept(shown: Shown) -> None:
    session, setup = shown
    page = session.page
    n = setup["n"]
    page.evaluate("() => window.longDetail.reset()")
    page.wait_for_function(SHOWS_JS, arg=f"0,{n}")
    page.evaluate(GATE_JS)
    show = "longDetail.show({query: longQuery, trace: longTrace, layer: 0, head: 2})"
    page.evaluate(f"() => {{ window.headShown = {show}; }}")  # head 2, whole: its answer waits at the gate
    page.wait_for_function("() => window.asked === 1")
    # A person zooms before the head arrives; the whole head's answer lands inside the zoom's settling time.
    page.evaluate(ZOOM_JS, [[300, 400], [400, 300]])
    page.evaluate("() => window.openGate()")
    assert page.evaluate("async () => window.headShown") is False  # it never drew over the zoom
    page.wait_for_function(SHOWS_JS, arg="300,400")
    figure = page.evaluate(FIGURE_JS)
    assert figure["xaxis"]["range"] == [300, 400] and figure["exact"] == "true"
    assert figure["readout"].startswith("L0 H2")
