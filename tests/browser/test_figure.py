"""app.snapshot.figure in Chromium: `fig.write_html(include_plotlyjs=True)` opens from disk with no other
request, draws, and its hover reads as the page's; and the figure's data is what the page's own
heatmap-figure.js builds for the same head (its modules imported from app/static, served by a route, not a
server): hover templates and texts, cells, colour scale, ticks, axis titles, marks.

No server: the models are loaded by mha in this process (the session's MiniLM, the tiny Llama and T5).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.package_data import STATIC, package_dir
from app.snapshot import figure
from mha import AttentionModel, AttentionResult, Seq2SeqResult, analysis, load_pretrained

pytestmark = pytest.mark.browser

ORIGIN = "http://figure.test"  # answered by a route from app/static: never a network request
TEXT, PAIR = "The cat sat on the mat.", "It was tired."

BLANK = "<!doctype html><meta charset=utf-8><title>figure</title>"  # the page the modules are imported into
GRAPH_JS = "document.querySelector('.plotly-graph-div')"
CELL_JS = f"""([i, j]) => {{
  const gd = {GRAPH_JS};
  const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
  const box = gd.getBoundingClientRect();
  return [box.left + xa._offset + xa.l2p(j), box.top + ya._offset + ya.l2p(i)];
}}"""
# The page's buildFigure on a spec, and what of its figure a Python figure must equal
PAGE_FIGURE_JS = """async (spec) => {
  const { buildFigure } = await import('/static/js/heatmap-figure.js');
  const { data, layout } = buildFigure(spec);
  const heat = data[data.length - 1];
  const mask = data.length > 1 ? data[0] : null;
  const axis = (a) => ({ tickvals: a.tickvals, ticktext: a.ticktext, title: a.title.text, range: a.range });
  return {
    hovertemplate: heat.hovertemplate, hover: heat.text ?? heat.customdata, z: heat.z,
    colorscale: heat.colorscale, zmin: heat.zmin, zmax: heat.zmax, bar: heat.colorbar.title.text,
    x: axis(layout.xaxis), y: axis(layout.yaxis),
    mask: mask && { x: mask.x, y: mask.y, fillpattern: mask.fillpattern, fillcolor: mask.fillcolor },
    lines: layout.shapes.filter((s) => s.type === 'line').map((s) => [s.name, s.x0, s.x1, s.y0, s.y1]),
  };
}"""


@pytest.fixture(scope="module")
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    tab = context.new_page()
    yield tab
    context.close()


@pytest.fixture(scope="module")
def llama(tiny_checkpoints: dict[str, Path]) -> AttentionModel:
    return load_pretrained(str(tiny_checkpoints["llama"]), device="cpu")


@pytest.fixture(scope="module")
def translated(seq2seq_checkpoints: dict[str, Path]) -> Seq2SeqResult:
    t5 = load_pretrained(str(seq2seq_checkpoints["t5"]), device="cpu")
    result = t5.attend("The house is wonderful.", target="Das Haus ist wunderbar.")
    assert isinstance(result, Seq2SeqResult)
    return result


def _open_offline(page: Any, path: Path) -> list[str]:
    """Open `path` from disk, every other request refused; the requests made, the file's own first."""
    requests: list[str] = []

    def record(request: Any) -> None:
        requests.append(request.url)

    page.on("request", record)
    page.route(
        "**/*", lambda route: route.continue_() if route.request.url == path.as_uri() else route.abort()
    )
    try:
        page.goto(path.as_uri())
        page.wait_for_function(f"{GRAPH_JS}?._fullLayout && {GRAPH_JS}.querySelector('.hm, image')")
    finally:
        page.unroute("**/*")
        page.remove_listener("request", record)
    return requests


def _hover_text(page: Any, i: int, j: int) -> str | None:
    x, y = page.evaluate(CELL_JS, [i, j])
    page.mouse.move(x, y)
    label = page.locator(".hoverlayer .hovertext")
    try:
        label.first.wait_for(state="attached", timeout=2000)
    except Exception:  # noqa: BLE001 (Playwright's timeout: no label, as over a masked gap)
        return None
    return label.first.text_content()


def test_write_html_opens_offline_and_hovers_as_the_page(
    page: Any, minilm: AttentionModel, llama: AttentionModel, tmp_path: Path
) -> None:
    pair = minilm.attend(TEXT, text_pair=PAIR)
    path = tmp_path / "pair.html"
    figure(pair, 2, 7, model=minilm).write_html(path, include_plotlyjs=True)
    assert _open_offline(page, path) == [path.as_uri()]
    value = pair.attentions[2, 7, 1, 2].item()
    assert _hover_text(page, 1, 2) == f"the → cat: {value:.3f}"
    # A causal head: the masked cell (0, last) is a gap with no hover; a visible one reads its value.
    written = llama.attend(TEXT, max_new_tokens=3)
    path = tmp_path / "causal.html"
    figure(written, 1, 3, model=llama).write_html(path, include_plotlyjs=True)
    assert _open_offline(page, path) == [path.as_uri()]
    assert _hover_text(page, 0, written.n - 1) is None
    tokens = [t.replace("Ġ", "␣") for t in written.tokens]
    assert (
        _hover_text(page, 3, 2) == f"{tokens[3]} → {tokens[2]}: {written.attentions[1, 3, 3, 2].item():.3f}"
    )


def _serve_static(route: Any) -> None:
    path = route.request.url[len(ORIGIN) :].split("?", 1)[0]
    if path == "/":
        route.fulfill(
            body="<!doctype html><meta charset=utf-8><title>figure</title>", content_type="text/html"
        )
        return
    file = package_dir(STATIC) / path.removeprefix("/static/")
    if not path.startswith("/static/js/") or not file.is_file():
        route.fulfill(status=404)
        return
    route.fulfill(body=file.read_bytes(), content_type="text/javascript")


def _page_spec(
    result: AttentionResult,
    layer: int,
    head: int,
    *,
    kind: str | None,
    model: AttentionModel | None,
    norm: bool,
) -> dict[str, Any]:
    """What detail.js figureSpec hands buildFigure for this head's exact values (and, by norm, the shares
    and each cell's size, as the exact head's row_norms give them: share × its row's total)."""
    if isinstance(result, Seq2SeqResult) and kind == "cross":
        values, tokens, keys = result.cross_attentions, result.target_tokens, result.tokens
    elif isinstance(result, Seq2SeqResult) and kind == "decoder":
        values, tokens, keys = result.decoder_attentions, result.target_tokens, None
    else:
        values, tokens, keys = result.attentions, result.tokens, None
    written = 0 if kind else result.generated
    sizes = None
    if norm:
        assert result.norms is not None
        maps = analysis.weight_norm_map(values, result.norms)
        values, _ = analysis.row_shares(maps)
        sizes = maps[layer, head].flatten().tolist()
    names = {
        "cross": ("target token (query)", "source token (key)"),
        "decoder": ("target token (query)", "target token (key)"),
    }
    return {
        "tokens": [f"✎ {t}" if i >= len(tokens) - written else t for i, t in enumerate(tokens)],
        **({"keyTokens": keys} if keys is not None else {}),
        **({"axisNames": dict(zip(("query", "key"), names[kind], strict=True))} if kind else {}),
        "values": values[layer, head].flatten().tolist(),
        "causal": kind == "decoder" or (kind is None and model is not None and model.info.causal),
        "boundary": -1 if kind else (result.segments.index(1) if 1 in result.segments else -1),
        "title": "t",
        "exact": True,
        "written": written,
        "byteLevel": model is not None and model.info.byte_level,
        **({"weighting": "norm", "sizes": sizes} if norm else {}),
    }


@pytest.mark.parametrize("case", ["pair", "norm", "continuation", "cross", "decoder"])
def test_the_figure_is_what_the_pages_heatmap_figure_builds(
    page: Any,
    case: str,
    minilm: AttentionModel,
    llama: AttentionModel,
    translated: Seq2SeqResult,
) -> None:
    if case in ("pair", "norm"):
        result, model, kind = minilm.attend(TEXT, text_pair=PAIR, norms=True), minilm, None
    elif case == "continuation":
        result, model, kind = llama.attend(TEXT, max_new_tokens=3), llama, None
    else:
        result, model, kind = translated, None, case
    norm = case == "norm"
    spec = _page_spec(result, 1, 2, kind=kind, model=model, norm=norm)
    page.route(f"{ORIGIN}/**", _serve_static)
    try:
        page.goto(f"{ORIGIN}/")
        built = page.evaluate(PAGE_FIGURE_JS, spec)
    finally:
        page.unroute(f"{ORIGIN}/**")
    fig = figure(result, 1, 2, kind=kind, model=model, weighting="norm" if norm else None)
    heat = fig.data[-1]
    assert heat.hovertemplate == built["hovertemplate"]
    assert [list(row) for row in (heat.text if norm else heat.customdata)] == built["hover"]
    assert [list(row) for row in heat.z] == built["z"]
    assert [list(stop) for stop in heat.colorscale] == built["colorscale"]
    assert (heat.zmin, heat.zmax, heat.colorbar.title.text) == (built["zmin"], built["zmax"], built["bar"])
    for ours, theirs in ((fig.layout.xaxis, built["x"]), (fig.layout.yaxis, built["y"])):
        assert list(ours.tickvals) == theirs["tickvals"] and list(ours.ticktext) == theirs["ticktext"]
        assert (ours.title.text, list(ours.range)) == (theirs["title"], theirs["range"])
    lines = [[s.name, s.x0, s.x1, s.y0, s.y1] for s in fig.layout.shapes if s.type == "line"]
    assert lines == built["lines"]
    if built["mask"] is None:
        assert len(fig.data) == 1
    else:
        mask = fig.data[0]
        assert (list(mask.x), list(mask.y), mask.fillcolor) == (
            built["mask"]["x"],
            built["mask"]["y"],
            built["mask"]["fillcolor"],
        )
        assert json.loads(mask.fillpattern.to_json()) == built["mask"]["fillpattern"]
