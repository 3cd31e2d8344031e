"""app.snapshot.figure: one head of a result as a plotly Figure, drawn as the page's head detail draws it.

The figure's data is checked against the result itself (z is the head, exactly), against the page's own
modules run in Node (the colour scale of colors.js), and against the page's spelling of tokens, ticks and
hover; tests/browser/test_figure.py draws it offline in Chromium and checks it against heatmap-figure.js.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from app.package_data import STATIC, package_dir
from app.snapshot import figure
from mha import AttentionModel, AttentionResult, Seq2SeqResult, analysis, load_pretrained

TEXT, PAIR = "The cat sat on the mat.", "It was tired."
NODE = shutil.which("node")


@pytest.fixture(scope="module")
def pair(minilm: AttentionModel) -> AttentionResult:
    return minilm.attend(TEXT, text_pair=PAIR, norms=True)


@pytest.fixture(scope="module")
def llama(tiny_checkpoints: dict[str, Path]) -> AttentionModel:
    """A tiny causal Llama: byte-level BPE, 4 query heads over 2 KV heads."""
    return load_pretrained(str(tiny_checkpoints["llama"]), device="cpu")


@pytest.fixture(scope="module")
def written(llama: AttentionModel) -> AttentionResult:
    return llama.attend(TEXT, max_new_tokens=3)


@pytest.fixture(scope="module")
def translated(seq2seq_checkpoints: dict[str, Path]) -> Seq2SeqResult:
    t5 = load_pretrained(str(seq2seq_checkpoints["t5"]), device="cpu")
    result = t5.attend("The house is wonderful.", target="Das Haus ist wunderbar.", norms=True)
    assert isinstance(result, Seq2SeqResult)
    return result


def heatmap(fig: Any) -> Any:
    (trace,) = [trace for trace in fig.data if trace.type == "heatmap"]
    return trace


def escaped(text: str) -> str:
    """A token as Plotly text: entities, never markup (heatmap-ticks.js plotlyText)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def hover(trace: Any, i: int, j: int) -> str:
    """Cell (i, j)'s hover as Plotly fills the template (d3's .3f is Python's: both round the exact value)."""
    assert trace.hovertemplate == "%{customdata}: %{z:.3f}<extra></extra>"
    return f"{trace.customdata[i][j]}: {trace.z[i][j]:.3f}"


def test_z_is_the_head_exactly_with_the_pages_tokens_hover_and_boundary(
    minilm: AttentionModel, pair: AttentionResult
) -> None:
    fig = figure(pair, 2, 7, model=minilm)
    trace = heatmap(fig)
    assert [list(row) for row in trace.z] == pair.attentions[2, 7].tolist()  # float32 -> float: exact
    n = pair.n
    # Numeric axes, every token a tick of its own: the two "the" stay two cells, labelled alike.
    assert list(fig.layout.yaxis.tickvals) == list(range(n)) == list(fig.layout.xaxis.tickvals)
    assert list(fig.layout.yaxis.ticktext) == pair.tokens == list(fig.layout.xaxis.ticktext)
    assert pair.tokens[1] == pair.tokens[5] == "the"
    assert hover(trace, 1, 2) == f"the → cat: {pair.attentions[2, 7, 1, 2].item():.3f}"
    assert [(s.name, s.x0) for s in fig.layout.shapes if s.name == "segment-boundary-x"] == [
        ("segment-boundary-x", pair.segments.index(1) - 0.5)
    ]
    assert fig.layout.title.text == "all-MiniLM-L6-v2 · layer 2, head 7"
    assert (fig.layout.yaxis.title.text, fig.layout.xaxis.title.text) == (
        "query (attending)",
        "key (attended to)",
    )
    assert fig.layout.yaxis.range == (n - 0.5, -0.5)  # query 0 at the top, as on the page
    assert len(fig.data) == 1  # an encoder: no mask
    assert figure(pair, 2, 7, name="mine").layout.title.text == "mine · layer 2, head 7"


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_the_colour_scale_is_colors_js_as_the_page_runs_it(written: AttentionResult) -> None:
    colors = (package_dir(STATIC) / "js" / "colors.js").as_uri()
    script = (
        f"import {{ COLORSCALE, MASK_BG_CSS, MASK_FG_CSS }} from {json.dumps(colors)};\n"
        "console.log(JSON.stringify({ COLORSCALE, MASK_BG_CSS, MASK_FG_CSS }));\n"
    )
    assert NODE is not None
    run = subprocess.run(
        [NODE, "--input-type=module", "-e", script], capture_output=True, text=True, check=True
    )
    page = json.loads(run.stdout)
    fig = figure(written, 0, 1)
    assert [list(stop) for stop in heatmap(fig).colorscale] == page["COLORSCALE"]
    (mask,) = [trace for trace in fig.data if trace.name == "masked"]
    assert (mask.fillcolor, mask.fillpattern.bgcolor, mask.fillpattern.fgcolor) == (
        page["MASK_BG_CSS"],
        page["MASK_BG_CSS"],
        page["MASK_FG_CSS"],
    )


def test_a_causal_continuation_masks_the_future_and_marks_what_it_wrote(
    llama: AttentionModel, written: AttentionResult
) -> None:
    fig = figure(written, 1, 3, model=llama)
    trace = heatmap(fig)
    values = written.attentions[1, 3].tolist()
    assert [list(row) for row in trace.z] == [
        [v if j <= i else None for j, v in enumerate(row)] for i, row in enumerate(values)
    ]
    assert trace.hoverongaps is False
    (mask,) = [t for t in fig.data if t.name == "masked"]
    assert fig.data.index(mask) < fig.data.index(trace)  # the hatch lies under the gaps
    # Byte-level marks as visible signs; the written tokens marked ✎ (decoder.js displayToken, markWritten)
    prompt = written.prompt_n
    spelled = [
        t.replace("Ġ", "␣").replace("Ċ", "↵").replace("ĉ", "⇥").replace("▁", "␣") for t in written.tokens
    ]
    expected = [escaped(f"✎ {t}" if i >= prompt else t) for i, t in enumerate(spelled)]
    assert list(fig.layout.yaxis.ticktext) == expected and "␣cat" in expected
    assert {s.name: s.x0 for s in fig.layout.shapes if s.name == "written-x"} == {"written-x": prompt - 0.5}
    assert fig.layout.title.text == f"{llama.info.name} · L1 H3 · kv 1"  # heads 2, 3 share KV head 1
    # Without the model: causal and byte-level read off the result; the same cells and labels.
    bare = figure(written, 1, 3)
    assert heatmap(bare).z == trace.z and bare.layout.yaxis.ticktext == fig.layout.yaxis.ticktext
    assert bare.layout.title.text == "layer 1, head 3"


def test_an_encoder_decoders_three_kinds(translated: Seq2SeqResult) -> None:
    cross = figure(translated, 2, 1)  # cross-attention, the page's default
    trace = heatmap(cross)
    assert [list(row) for row in trace.z] == translated.cross_attentions[2, 1].tolist()
    assert (len(trace.z), len(trace.z[0])) == (translated.m, translated.n)
    assert cross.layout.title.text == "Cross-attention, layer 2, head 1"
    assert (cross.layout.yaxis.title.text, cross.layout.xaxis.title.text) == (
        "target token (query)",
        "source token (key)",
    )
    query, key = (escaped(t.replace("▁", "␣")) for t in (translated.target_tokens[1], translated.tokens[2]))
    value = translated.cross_attentions[2, 1, 1, 2].item()
    assert hover(trace, 1, 2) == f"query '{query}' (1) → key '{key}' (2): {value:.3f}"
    assert len(cross.data) == 1 and not cross.layout.shapes  # no mask, no boundary, no written marks
    decoder = figure(translated, 0, 2, kind="decoder")
    assert [t.name for t in decoder.data] == ["masked", "attention"]
    assert list(decoder.layout.xaxis.ticktext) == [
        escaped(t.replace("▁", "␣")) for t in translated.target_tokens
    ]
    assert heatmap(decoder).z[1][0] == translated.decoder_attentions[0, 2, 1, 0].item()
    encoder = figure(translated, 1, 0, kind="encoder")
    assert [list(row) for row in heatmap(encoder).z] == translated.encoder_attentions[1, 0].tolist()
    assert encoder.layout.yaxis.title.text == "source token (query)"


def test_weight_by_value_norm_shows_shares_and_sizes(
    minilm: AttentionModel, pair: AttentionResult, translated: Seq2SeqResult
) -> None:
    fig = figure(pair, 2, 7, weighting="norm", model=minilm)
    trace = heatmap(fig)
    assert pair.norms is not None
    maps = analysis.weight_norm_map(pair.attentions, pair.norms)
    shares, _ = analysis.row_shares(maps)
    assert [list(row) for row in trace.z] == shares[2, 7].tolist()
    assert (
        trace.hovertemplate
        == "%{text}: share %{customdata[0]:.3f} · ‖α f‖ %{customdata[1]:.3g}<extra></extra>"
    )
    assert trace.text[1][2] == "the → cat"
    assert list(trace.customdata[1][2]) == [shares[2, 7, 1, 2].item(), maps[2, 7, 1, 2].item()]
    assert fig.data[0].colorbar.title.text == "weight × norm (share)"
    assert fig.layout.title.text.endswith("layer 2, head 7 · weight × norm")
    cross = heatmap(figure(translated, 0, 0, weighting="norm"))
    assert translated.cross_norms is not None
    cross_shares, _ = analysis.row_shares(
        analysis.weight_norm_map(translated.cross_attentions, translated.cross_norms)
    )
    assert [list(row) for row in cross.z] == cross_shares[0, 0].tolist()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ({"layer": 6, "head": 0}, "layer 6 is out of range: this result has layers 0..5"),
        ({"layer": 0, "head": 12}, "head 12 is out of range: this result has heads 0..11"),
        ({"layer": -1, "head": 0}, "layer -1 is out of range: this result has layers 0..5"),
        ({"layer": "2", "head": 0}, "layer must be an int, got '2': this result has layers 0..5"),
        ({"layer": 0, "head": 0, "kind": "cross"}, "kind 'cross' is for an encoder-decoder's result"),
        ({"layer": 0, "head": 0, "weighting": "value"}, "weighting 'value' is not one of weight, norm"),
    ],
)
def test_bad_selections_say_what_is_valid(pair: AttentionResult, call: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        figure(pair, call.pop("layer"), call.pop("head"), **call)


def test_bad_kinds_and_missing_norms_say_what_to_do(
    translated: Seq2SeqResult, written: AttentionResult
) -> None:
    with pytest.raises(
        ValueError, match="kind 'self' is not one of an encoder-decoder's: encoder, decoder, cross"
    ):
        figure(translated, 0, 0, kind="self")
    with pytest.raises(
        ValueError, match=r"layer 3 is out of range: this result's decoder attention has layers 0..2"
    ):
        figure(translated, 3, 0, kind="decoder")
    with pytest.raises(
        ValueError, match=r"weighting 'norm' needs the value norms: attend the text with norms=True"
    ):
        figure(written, 0, 0, weighting="norm")


def test_labels_are_text_and_long_inputs_thin_their_ticks(minilm: AttentionModel) -> None:
    payload = '<img src=x onerror="window.pwned=1">&amp;'
    result = minilm.attend(" ".join([payload] + ["word"] * 90))
    fig = figure(result, 0, 0, model=minilm)
    labels = [*fig.layout.yaxis.ticktext, *heatmap(fig).customdata[1]]
    assert not [label for label in labels if "<" in label], "a token reached Plotly as markup"
    assert any("&lt;" in label for label in heatmap(fig).customdata[1])  # escaped, as plotlyText does
    ticks = list(fig.layout.yaxis.tickvals)
    # Past 64 tokens the labels thin evenly to at most 64 (heatmap-ticks.js thinTicks), from token 0.
    step = ticks[1] - ticks[0]
    assert result.n > 64 and len(ticks) <= 64 and ticks == list(range(0, result.n, step))
    escaped = [
        result.tokens[i].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") for i in ticks
    ]
    assert list(fig.layout.yaxis.ticktext) == escaped


def test_write_html_is_one_offline_file(pair: AttentionResult, tmp_path: Path) -> None:
    path = tmp_path / "head.html"
    figure(pair, 0, 0).write_html(path, include_plotlyjs=True)
    html = path.read_text("utf-8")
    assert "Plotly" in html and '"type":"heatmap"' in html.replace(" ", "")
    assert "<script src=" not in html.replace("'", '"')  # plotly.js inline, nothing loaded from elsewhere
