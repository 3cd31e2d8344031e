"""The head detail's figure as plotly data, as app/static/js/heatmap-figure.js builds it for the page (its
names kept here): a HeadSpec (a head's values, its tokens as the page spells them, its marks) becomes the
hatch under a causal mask, one heatmap trace on numeric axes with the tokens as tick text (two identical
tokens stay two cells) and the layout. The colours are read from app/static/js/colors.js itself, so the page
and a figure have one colour scale. figure.py picks the head of a result; this module only draws it.

The sizes in px follow heatmap-figure.js's plotSize for a panel of MAX_FIT_PX; the label margins are
estimated from the labels' lengths (the page measures them on a canvas).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from app.snapshot.looks import PageColors, page_colors

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = ["HeadSpec", "build_figure", "plotly_text", "shorten", "thin_ticks"]

# heatmap-ticks.js: every token labelled up to ALL_LABELS_N, ticks LABEL_PX apart at least, tokens cut to
# MAX_LABEL_CHARS on the axes (the hover keeps them whole), label fonts MIN_FONT_PX to MAX_FONT_PX.
ALL_LABELS_N, LABEL_PX, MAX_LABEL_CHARS, MIN_FONT_PX, MAX_FONT_PX = 64, 10, 18, 9, 12
# heatmap-figure.js: the plot's size (square cells) and the bands around it
MIN_PLOT_PX, MAX_FIT_PX, MAX_CELL_PX = 360, 640, 32
TITLE_PX, AXIS_TITLE_PX, COLORBAR_PX = 34, 26, 110
CHAR_PX = 7  # a 12 px label's mean character width, for the label margins
WRITTEN_CSS, BOUNDARY_CSS, FRAME_CSS = (
    "#e8710a",
    "#d62728",
    "#c0c6d2",
)  # the written tokens, a pair, the frame
SIZE = "‖α f‖"  # a norm-weighted cell's own size: share × its row's total


@dataclass(frozen=True)
class HeadSpec:
    """The head to draw: its values [rows, cols] (weights, or norm shares), the sizes under norm, its
    tokens as the page spells them, and the marks."""

    values: torch.Tensor
    sizes: torch.Tensor | None
    queries: list[str]
    keys: list[str]
    rect: bool
    causal: bool
    boundary: int  # first token of the pair's text; -1 for none
    written: int  # the last tokens of a continuation (none for an encoder-decoder: its target is its own)


def plotly_text(text: str) -> str:
    """heatmap-ticks.js plotlyText: Plotly reads a small HTML subset in labels; entities keep tokens text."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def shorten(token: str) -> str:
    return f"{token[: MAX_LABEL_CHARS - 1]}…" if len(token) > MAX_LABEL_CHARS else token


def thin_ticks(count: int, cell_px: float) -> list[int]:
    """heatmap-ticks.js thinTicks over a whole axis: labels LABEL_PX apart at least, at most ALL_LABELS_N."""
    step = max(1, math.ceil(LABEL_PX / max(cell_px, 1e-6)), math.ceil(max(count, 1) / ALL_LABELS_N))
    return list(range(0, count, step))


def plot_px(side: int) -> int:
    """heatmap-figure.js plotSize in a panel of MAX_FIT_PX: every label legible up to ALL_LABELS_N tokens."""
    fit = max(min(MAX_FIT_PX, side * MAX_CELL_PX), MIN_PLOT_PX)
    return max(fit, side * LABEL_PX) if side <= ALL_LABELS_N else fit


def _cells(chosen: HeadSpec, labels: list[str], key_labels: list[str]) -> dict[str, Any]:
    """The heatmap's z (None where masked: a gap over the hatch), the hover's text and its template."""
    rows, cols = chosen.values.shape
    values = chosen.values.tolist()
    z = [[None if chosen.causal and j > i else values[i][j] for j in range(cols)] for i in range(rows)]
    if chosen.rect:
        where = [
            [f"query '{labels[i]}' ({i}) → key '{key_labels[j]}' ({j})" for j in range(cols)]
            for i in range(rows)
        ]
    else:
        where = [[f"{labels[i]} → {key_labels[j]}" for j in range(cols)] for i in range(rows)]
    if chosen.sizes is None:
        return {"z": z, "customdata": where, "hovertemplate": "%{customdata}: %{z:.3f}<extra></extra>"}
    sizes = chosen.sizes.tolist()
    pairs = [[[values[i][j], sizes[i][j]] for j in range(cols)] for i in range(rows)]
    template = f"%{{text}}: share %{{customdata[0]:.3f}} · {SIZE} %{{customdata[1]:.3g}}<extra></extra>"
    return {"z": z, "text": where, "customdata": pairs, "hovertemplate": template}


def _mask_trace(n: int, colors: PageColors) -> dict[str, Any]:
    """The hatched staircase around the cells j > i (heatmap-figure.js maskPolygon), under the gaps."""
    x, y = [0.5, n - 0.5, n - 0.5], [-0.5, -0.5, n - 1.5]
    for i in range(n - 2, -1, -1):
        x += [i + 0.5, i + 0.5]
        y += [i + 0.5, i - 0.5]
    pattern = {
        "shape": "/",
        "fgcolor": colors.mask_fg,
        "bgcolor": colors.mask_bg,
        "size": 8,
        "solidity": 0.25,
    }
    return {
        "type": "scatter",
        "name": "masked",
        "x": x,
        "y": y,
        "mode": "lines",
        "fill": "toself",
        "fillcolor": colors.mask_bg,
        "fillpattern": pattern,
        "line": {"width": 0},
        "hoverinfo": "skip",
        "showlegend": False,
    }


def _cross(name: str, at: float, line: dict[str, Any]) -> list[dict[str, Any]]:
    """A line across the plot at key `at` and one at query `at` (`name`-x, `name`-y)."""
    return [
        {
            "type": "line",
            "name": f"{name}-x",
            "xref": "x",
            "yref": "paper",
            "x0": at,
            "x1": at,
            "y0": 0,
            "y1": 1,
            "line": line,
        },
        {
            "type": "line",
            "name": f"{name}-y",
            "xref": "paper",
            "yref": "y",
            "x0": 0,
            "x1": 1,
            "y0": at,
            "y1": at,
            "line": line,
        },
    ]


def _shapes(chosen: HeadSpec, size_px: float) -> list[dict[str, Any]]:
    """A pair's segment boundary and a continuation's written tokens (heatmap-figure.js figureShapes)."""
    n, shapes = len(chosen.queries), []
    if not chosen.rect and 0 < chosen.boundary < n:
        line, at = {"color": BOUNDARY_CSS, "width": 2, "dash": "dot"}, chosen.boundary - 0.5
        shapes += _cross("segment-boundary", at, line)
    if not chosen.rect and 0 < chosen.written <= n:
        at, line = n - chosen.written - 0.5, {"color": WRITTEN_CSS, "width": 1.5}
        band = {"type": "rect", "fillcolor": WRITTEN_CSS, "opacity": 0.55, "line": {"width": 0}}
        px = 1 / size_px  # one pixel in paper units
        shapes += _cross("written", at, line)
        shapes += [
            {
                **band,
                "name": "written-band-x",
                "xref": "x",
                "yref": "paper",
                "x0": at,
                "x1": n - 0.5,
                "y0": -11 * px,
                "y1": -4 * px,
            },
            {
                **band,
                "name": "written-band-y",
                "xref": "paper",
                "yref": "y",
                "x0": 1 + 2 * px,
                "x1": 1 + 8 * px,
                "y0": at,
                "y1": n - 0.5,
            },
        ]
    return shapes


def _heatmap_trace(spec: HeadSpec, geometry: _Geometry, *, norm: bool) -> dict[str, Any]:
    """The attention trace: the cells, the page's colour scale on 0-1, the hover and the colour bar."""
    bar_title = "weight × norm (share)" if norm else "attention"  # weighting.js valueName, exact values
    return {
        "type": "heatmap",
        "name": "attention",
        **_cells(spec, [plotly_text(t) for t in spec.queries], [plotly_text(t) for t in spec.keys]),
        "x0": 0,
        "dx": 1,
        "y0": 0,
        "dy": 1,
        "zmin": 0,
        "zmax": 1,
        "colorscale": [list(stop) for stop in page_colors().colorscale],
        "hoverongaps": False,
        "xgap": 0,
        "ygap": 0,
        "colorbar": {
            "title": {"text": bar_title, "side": "right"},
            "thickness": 14,
            "len": min(1, 420 / geometry.plot_h),
            "y": 1,
            "yanchor": "top",
        },
    }


@dataclass(frozen=True)
class _Geometry:
    """Where everything goes (heatmap-figure.js figureGeometry): the square's side in px, the plot's sides
    (square cells), the ticks shown on each axis, their font, the label margins."""

    size: float
    plot_w: float
    plot_h: float
    ticks: list[int]
    key_ticks: list[int]
    font: int
    label_px: int
    key_label_px: int

    @classmethod
    def of(cls, spec: HeadSpec) -> _Geometry:
        rows, cols = spec.values.shape
        side = max(rows, cols)
        size = plot_px(side)
        cell_px = size / max(side, 1)
        ticks, key_ticks = thin_ticks(rows, cell_px), thin_ticks(cols, cell_px)
        spacing = min(t[1] - t[0] if len(t) > 1 else 1 for t in (ticks, key_ticks)) * cell_px
        widest = [
            CHAR_PX * max((len(shorten(t)) for t in tokens), default=1) + 10
            for tokens in (spec.queries, spec.keys)
        ]
        return cls(
            size=size,
            plot_w=cols * cell_px,
            plot_h=rows * cell_px,
            ticks=ticks,
            key_ticks=key_ticks,
            font=max(MIN_FONT_PX, min(MAX_FONT_PX, math.floor(spacing) - 1)),
            label_px=widest[0],
            key_label_px=widest[1],
        )


def _layout(
    spec: HeadSpec, geometry: _Geometry, *, title: str, axis_names: tuple[str, str]
) -> dict[str, Any]:
    """Title, size and margins, both axes with the ticks shown, the marks (heatmap-figure.js figureLayout)."""
    rows, cols = spec.values.shape
    margin = {
        "l": geometry.label_px + AXIS_TITLE_PX,
        "r": COLORBAR_PX,
        "t": TITLE_PX + geometry.key_label_px + AXIS_TITLE_PX,
        "b": 16,
    }
    axis = {
        "tickmode": "array",
        "tickfont": {"size": geometry.font},
        "ticks": "outside",
        "ticklen": 4,
        "showgrid": False,
        "zeroline": False,
        "automargin": False,
        "showline": True,
        "linecolor": FRAME_CSS,
        "mirror": True,
    }
    return {
        "title": {
            "text": plotly_text(title),
            "x": 0.01,
            "xanchor": "left",
            "y": 1,
            "yanchor": "top",
            "yref": "container",
            "pad": {"t": 10},
            "font": {"size": 14},
        },
        "width": margin["l"] + geometry.plot_w + margin["r"],
        "height": margin["t"] + geometry.plot_h + margin["b"],
        "margin": margin,
        "xaxis": {
            **axis,
            "tickvals": geometry.key_ticks,
            "ticktext": [plotly_text(shorten(spec.keys[j])) for j in geometry.key_ticks],
            "title": {"text": axis_names[1], "standoff": 6},
            "side": "top",
            "tickangle": -90,
            "range": [-0.5, cols - 0.5],
        },
        "yaxis": {
            **axis,
            "tickvals": geometry.ticks,
            "ticktext": [plotly_text(shorten(spec.queries[i])) for i in geometry.ticks],
            "title": {"text": axis_names[0], "standoff": 6},
            "range": [rows - 0.5, -0.5],
        },
        "shapes": _shapes(spec, geometry.size),
        "plot_bgcolor": "#ffffff",
        "paper_bgcolor": "#ffffff",
        "dragmode": "zoom",
        "hovermode": "closest",
    }


def build_figure(spec: HeadSpec, *, title: str, axis_names: tuple[str, str], norm: bool) -> go.Figure:
    """The figure of `spec`: the hatch under a causal mask, the heatmap, the layout."""
    import plotly.graph_objects as go  # here, not at import: app.snapshot's other users never need it

    geometry = _Geometry.of(spec)
    rows = spec.values.shape[0]
    data = [_mask_trace(rows, page_colors())] if spec.causal and rows > 1 else []
    data.append(_heatmap_trace(spec, geometry, norm=norm))
    return go.Figure(data=data, layout=_layout(spec, geometry, title=title, axis_names=axis_names))
