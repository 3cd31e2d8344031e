// The head detail's figure as data: buildFigure turns a head's values and tokens into Plotly's traces and
// layout; heatmap.js draws it and handles zoom and clicks. Query tokens on y (top to bottom), key tokens on
// x. Axes are numeric with tickvals/ticktext so two identical tokens stay separate cells; the hover reads
// the token text from customdata.
//
// Speed: Plotly's cost here is its axis labels (each is measured in the DOM, and automargin redraws the
// figure until the margins settle), not the n*n cells, which it paints as one pixelated image. So labels
// are capped per axis, the margins are computed here from the measured label widths, and automargin
// stays off. Zooming in brings the labels of the visible range back.
//
// Size: up to ALL_LABELS_N tokens every token is labelled (the label font shrinks to the cell, down to
// MIN_FONT_PX, and the figure grows past the panel when even that does not fit); above it the figure fits
// the panel, labels thin evenly and zooming brings them back. On a narrow screen the figure always fits the
// panel, its colour bar lies under the plot and Plotly's mode bar is hidden (it would cover the title).
//
// The only DOM it touches is an offscreen canvas that measures label widths.

import { COLORSCALE, MASK_BG_CSS, MASK_FG_CSS } from "./colors.js";
import { displayToken } from "./decoder.js";
import { scaleValues } from "./scale.js";
import { parseWeighting, valueName } from "./weighting.js";
import { ALL_LABELS_N, LABEL_PX, MAX_FONT_PX, plotlyText, shorten, thinTicks, tickFont } from "./heatmap-ticks.js";

const MIN_PLOT_PX = 360;
const MIN_FIT_PX = 160; // a figure fitted to a narrow panel never gets smaller than this
export const NARROW_PX = 480; // panels narrower than this (phones) get the narrow layout
const MAX_FIT_PX = 640; // the largest plot fitted to a panel (only labels for 33..64 tokens need more)
const MAX_CELL_PX = 32;
const FONT_FAMILY = '"Open Sans", verdana, arial, sans-serif'; // Plotly's default
const TITLE_PX = 34; // figure title band
const AXIS_TITLE_PX = 26; // axis title plus its gap
const COLORBAR_PX = 110;
const TITLE_LINE_PX = 18; // one more line of the colour bar's title (12 px text and its leading)
const COLORBAR_UNDER_PX = 64; // a horizontal colour bar under the plot: gap, bar, ticks and title
const WRITTEN_CSS = "#e8710a"; // the tokens a model wrote: divider and bands beside the axes
const RENORMALISED = "renormalised without the first token";
const SIZE = "‖α f‖"; // a norm-weighted cell's own size: share × its row's total

/**
 * Side of the square plot area in px. It fits `roomPx` (at most MAX_FIT_PX and MAX_CELL_PX a cell; at least
 * `minPx` where the room allows). Up to ALL_LABELS_N tokens it grows, past the room if need be, until every
 * token's label fits (LABEL_PX a cell), unless `fitOnly` (a phone: the figure stays within the screen).
 */
export function plotSize(n, roomPx = MAX_FIT_PX, minPx = MIN_PLOT_PX, fitOnly = false) {
  const floor = Math.min(minPx, Math.max(roomPx, MIN_FIT_PX));
  const fit = Math.max(Math.min(MAX_FIT_PX, roomPx, n * MAX_CELL_PX), floor);
  return !fitOnly && n <= ALL_LABELS_N ? Math.max(fit, n * LABEL_PX) : fit;
}

let measureContext = null;
/** Widest label in px at `fontSize`, measured on a canvas (no layout, unlike Plotly's own DOM pass). */
function widestLabel(texts, fontSize) {
  measureContext ??= document.createElement("canvas").getContext("2d");
  measureContext.font = `${fontSize}px ${FONT_FAMILY}`;
  let widest = 0;
  for (const t of texts) widest = Math.max(widest, measureContext.measureText(t).width);
  return Math.ceil(widest);
}

/** Staircase polygon around the cells j > i (the causal mask), in data coordinates. */
function maskPolygon(n) {
  // Along the top and right edges, then down the staircase back to the start.
  const x = [0.5, n - 0.5, n - 0.5];
  const y = [-0.5, -0.5, n - 1.5];
  for (let i = n - 2; i >= 0; i--) {
    x.push(i + 0.5, i + 0.5);
    y.push(i + 0.5, i - 0.5);
  }
  return { x, y };
}

/**
 * Shapes that mark the last `written` tokens (those a model wrote itself): a divider before them on both
 * axes and a band beside each axis (below the plot for keys, right of it for queries), out of the cells.
 */
function writtenShapes(n, written, size) {
  if (!(written > 0) || written > n) return [];
  const at = n - written - 0.5;
  const line = { color: WRITTEN_CSS, width: 1.5 };
  const band = { type: "rect", fillcolor: WRITTEN_CSS, opacity: 0.55, line: { width: 0 } };
  const px = (p) => p / size; // pixels as a fraction of the plot (paper units)
  return [
    { type: "line", name: "written-x", xref: "x", yref: "paper", x0: at, x1: at, y0: 0, y1: 1, line },
    { type: "line", name: "written-y", xref: "paper", yref: "y", x0: 0, x1: 1, y0: at, y1: at, line },
    { ...band, name: "written-band-x", xref: "x", yref: "paper", x0: at, x1: n - 0.5, y0: -px(11), y1: -px(4) },
    { ...band, name: "written-band-y", xref: "paper", yref: "y", x0: 1 + px(2), x1: 1 + px(8), y0: at, y1: n - 0.5 },
  ];
}

/**
 * The tokens of both axes as the page spells them, and their labels as Plotly text. Cross-attention's keys
 * are another sentence (`keyTokens`, across: `rect`); else queries and keys are one.
 */
function axisTokens(spec) {
  const tokens = spec.tokens.map((token) => displayToken(token, spec.byteLevel)); // axes, hover, image exports
  const rect = Array.isArray(spec.keyTokens);
  const keyTokens = rect ? spec.keyTokens.map((token) => displayToken(token, spec.byteLevel)) : tokens;
  const labels = tokens.map(plotlyText);
  const keyLabels = rect ? keyTokens.map(plotlyText) : labels;
  return { tokens, keyTokens, rect, labels, keyLabels, n: tokens.length, cols: keyTokens.length };
}

/**
 * The heatmap's cells: z (the painted colours; null where masked or missing, drawn as a gap), each cell's
 * hover text, and the weights the hover reads when z is not one (a transformed scale, norm sizes).
 */
function heatmapCells(values, painted, { n, cols, rect, labels, keyLabels, causal, sizes }) {
  const z = new Array(n);
  const customdata = new Array(n);
  // A transformed z is a colour, not a weight: then the hover reads the weights from here, as numbers that
  // Plotly formats as it formats z (a formatted string a cell costs more to build), and the labels from text.
  // Norm sizes ride along the same way: each cell's [share, size].
  const weights = painted.transformed || sizes ? new Array(n) : null;
  // Two sentences: the hover names each side's token and position, as the cell cursor reads it.
  const where = rect
    ? (i, j) => `query '${labels[i]}' (${i}) → key '${keyLabels[j]}' (${j})`
    : (i, j) => `${labels[i]} → ${labels[j]}`;
  for (let i = 0; i < n; i++) {
    const row = new Array(cols);
    const cd = new Array(cols);
    const o = i * cols;
    if (sizes) weights[i] = Array.from({ length: cols }, (_, j) => [values[o + j], sizes[o + j]]);
    else if (weights) weights[i] = Array.from({ length: cols }, (_, j) => values[o + j]);
    for (let j = 0; j < cols; j++) {
      const v = values[o + j];
      row[j] = (causal && j > i) || Number.isNaN(v) ? null : painted.z[o + j];
      cd[j] = where(i, j);
    }
    z[i] = row;
    customdata[i] = cd;
  }
  return { z, customdata, weights };
}

/**
 * Where everything goes: the plot's size in px (`size` the square's side, or a rectangle's longer side), its
 * cells, the ticks shown on each axis, their font and the widths of the label margins.
 */
function figureGeometry({ tokens, keyTokens, rect, n, cols }, { widthPx, minPx, barTitle }) {
  // Each line of the colour bar's title past the first (renormalised, a colour scale) takes its own band.
  const colorbarPx = COLORBAR_PX + (barTitle.split("<br>").length - 1) * TITLE_LINE_PX;
  // The widest of all labels bounds the margin, so the plot can be sized to the room left beside it.
  const narrow = widthPx < NARROW_PX;
  const rightPx = narrow ? 2 : colorbarPx; // narrow: the colour bar lies under the plot
  const roomPx = widthPx - (widestLabel(tokens.map(shorten), MAX_FONT_PX) + 10 + AXIS_TITLE_PX + rightPx);
  // The longer side gets the square's size; a rectangle keeps square cells (`size` is then its longer side).
  const side = Math.max(n, cols);
  const size = plotSize(side, roomPx, minPx, narrow);
  const cellPx = size / Math.max(side, 1);
  const plotW = rect ? cols * cellPx : size;
  const plotH = rect ? n * cellPx : size;
  const ticks = thinTicks(0, n - 1, cellPx);
  const keyTicks = rect ? thinTicks(0, cols - 1, cellPx) : ticks;
  const spacing = (t) => (t.length > 1 ? t[1] - t[0] : 1) * cellPx;
  const fontSize = tickFont(Math.min(spacing(ticks), spacing(keyTicks)));
  // Every label, not only those shown: zooming in shows others, and the margin must hold them too.
  const labelPx = widestLabel(tokens.map(shorten), fontSize) + 10; // + tick mark and its gap
  const keyLabelPx = rect ? widestLabel(keyTokens.map(shorten), fontSize) + 10 : labelPx;
  return { narrow, rightPx, size, plotW, plotH, ticks, keyTicks, fontSize, labelPx, keyLabelPx };
}

/** The hover: a cell's tokens and its value ("share" for norm weighting, with ‖α f‖ where sizes came). */
function hoverTemplate({ weights, sizes, norm, signed, renormalised }) {
  const share = norm ? "share " : ""; // weight × value norm: the value is a row's share, not a weight
  let hoverValue = weights ? `%{text}: ${share}%{customdata:.3f}` : `%{customdata}: ${share}%{z:${signed ? "+" : ""}.3f}`;
  if (sizes) hoverValue = `%{text}: ${share}%{customdata[0]:.3f} · ${SIZE} %{customdata[1]:.3g}`;
  return `${hoverValue}${renormalised ? ` (${RENORMALISED})` : ""}<extra></extra>`;
}

/** The hatched staircase over the causal mask, drawn under the heatmap's gaps. */
function maskTrace(n) {
  const poly = maskPolygon(n);
  return {
    type: "scatter",
    name: "masked",
    x: poly.x,
    y: poly.y,
    mode: "lines",
    fill: "toself",
    fillcolor: MASK_BG_CSS,
    fillpattern: { shape: "/", fgcolor: MASK_FG_CSS, bgcolor: MASK_BG_CSS, size: 8, solidity: 0.25 },
    line: { width: 0 },
    hoverinfo: "skip",
    showlegend: false,
  };
}

/** The colour bar: right of the plot, or under it on a narrow panel. */
function colorbar(painted, barTitle, { narrow, plotH }) {
  return {
    ...(painted.tickvals ? { tickvals: painted.tickvals, ticktext: painted.ticktext } : {}),
    ...(narrow
      ? {
          title: { text: barTitle, side: "bottom" },
          orientation: "h",
          thickness: 10,
          len: 1,
          x: 0,
          xanchor: "left",
          y: -12 / plotH, // paper units: 12 px under the plot
          yanchor: "top",
        }
      : { title: { text: barTitle, side: "right" }, thickness: 14, len: Math.min(1, 420 / plotH), y: 1, yanchor: "top" }),
  };
}

/** The attention trace: the cells, their colour range and scale, the hover and the colour bar. */
function heatmapTrace({ z, customdata, weights }, painted, { scale, hovertemplate, barTitle, geometry }) {
  return {
    type: "heatmap",
    name: "attention",
    z,
    x0: 0,
    dx: 1,
    y0: 0,
    dy: 1,
    zmin: scale?.zmin ?? painted.zmin,
    zmax: scale?.zmax ?? painted.zmax,
    colorscale: scale?.colorscale ?? COLORSCALE,
    ...(weights ? { text: customdata, customdata: weights } : { customdata }),
    hovertemplate,
    hoverongaps: false,
    xgap: 0,
    ygap: 0,
    colorbar: colorbar(painted, barTitle, geometry),
  };
}

/** The marks over the cells: a pair's segment boundary, the hidden first key, the tokens a model wrote. */
function figureShapes({ rect, n, boundary, renormalised, written, size }) {
  const shapes = [];
  if (!rect && boundary > 0 && boundary < n) {
    const line = { color: "#d62728", width: 2, dash: "dot" };
    const at = boundary - 0.5;
    shapes.push(
      { type: "line", name: "segment-boundary-x", xref: "x", yref: "paper", x0: at, x1: at, y0: 0, y1: 1, line },
      { type: "line", name: "segment-boundary-y", xref: "paper", yref: "y", x0: 0, x1: 1, y0: at, y1: at, line },
    );
  }
  if (renormalised && n > 0) {
    // The hidden key column reads as set aside (grey), not as zero attention (white).
    const hidden = { color: MASK_FG_CSS, width: 1 };
    shapes.push({ type: "rect", name: "first-token-hidden", layer: "below", xref: "x", yref: "paper", x0: -0.5, x1: 0.5, y0: 0, y1: 1, fillcolor: MASK_BG_CSS, line: hidden });
  }
  if (!rect) shapes.push(...writtenShapes(n, written, size));
  return shapes;
}

/** The layout: title, size and margins, both axes with the ticks shown, the shapes. */
function figureLayout(axes, geometry, { title, axisNames, barTitle, shapes }) {
  const { tokens, keyTokens, rect, n, cols } = axes;
  const { narrow, rightPx, plotW, plotH, ticks, keyTicks, fontSize, labelPx, keyLabelPx } = geometry;
  const shown = ticks.map((i) => shorten(tokens[i]));
  const keyShown = keyTicks.map((j) => shorten(keyTokens[j]));
  const axis = {
    tickmode: "array",
    tickfont: { size: fontSize },
    ticks: "outside",
    ticklen: 4,
    showgrid: false,
    zeroline: false,
    automargin: false,
    showline: true,
    linecolor: "#c0c6d2",
    mirror: true,
  };
  // Narrow: each line of the colour bar's title past the first takes 14 px more under it.
  const under = narrow ? COLORBAR_UNDER_PX + (barTitle.split("<br>").length - 1) * 14 : 0;
  const margin = { l: labelPx + AXIS_TITLE_PX, r: rightPx, t: TITLE_PX + keyLabelPx + AXIS_TITLE_PX, b: 16 + under };
  const names = axisNames ?? { query: "query (attending)", key: "key (attended to)" };
  return {
    title: { text: plotlyText(title), x: 0.01, xanchor: "left", y: 1, yanchor: "top", yref: "container", pad: { t: 10 }, font: { size: 14 } },
    width: margin.l + plotW + margin.r,
    height: margin.t + plotH + margin.b,
    margin,
    xaxis: {
      ...axis,
      tickvals: keyTicks,
      ticktext: keyShown.map(plotlyText),
      title: { text: names.key, standoff: 6 },
      side: "top",
      tickangle: -90,
      range: [-0.5, cols - 0.5],
    },
    yaxis: {
      ...axis,
      tickvals: ticks,
      ticktext: shown.map(plotlyText),
      title: { text: names.query, standoff: 6 },
      range: [n - 0.5, -0.5],
    },
    shapes,
    plot_bgcolor: "#ffffff",
    paper_bgcolor: "#ffffff",
    dragmode: "zoom",
    hovermode: "closest",
    uirevision: rect ? `${n}x${cols}` : `${n}`,
  };
}

/**
 * Build the figure. `values` is n*n row-major (a Float32Array of a decoded head, or api.js's flatRows of
 * a JSON answer); NaN is a missing value, drawn as a gap. With `keyTokens` (cross-attention: the keys are
 * another sentence) it is n*cols, queries down and keys across, in square cells; `axisNames` {query, key}
 * titles the axes. `written` marks the last tokens as the model's
 * own; `renormalised` says the values are decoder.js withoutFirstToken's (key 0 hidden, rows renormalised).
 * `scale` overrides the attention colour scale for other matrices (rollout, flow, A - B):
 * {colorscale, zmin, zmax, title, signed} (a diverging scale gets zmin = -zmax, so 0 is its centre).
 * `colorScale` names a scale.js scale (default 0–1): it changes the colours and the colour bar, never the
 * hover, which reads the true value.
 * `weighting` "norm" (weighting.js): the values are weight × value norm shares; the colour bar and the hover
 * say "share", and `sizes` (n*cols, weighting.js cellSizes; the exact head's) adds each cell's ‖α f‖.
 * `minPx` lets side-by-side figures be smaller.
 * Returns {data, layout, labels, size, keyTokens (null when square), plotW, plotH}.
 */
export function buildFigure(spec) {
  const { values, causal, boundary, title, exact, widthPx = 900, scale, minPx, bits = 8 } = spec;
  const { written = 0, renormalised = false, colorScale } = spec;
  const norm = parseWeighting(spec.weighting) === "norm";
  const sizes = norm ? (spec.sizes ?? null) : null;
  const axes = axisTokens(spec);
  const { n, cols, rect } = axes;
  const painted = scaleValues(values, n, colorScale, cols);
  const cells = heatmapCells(values, painted, { ...axes, causal, sizes });
  const barTitle = withScale(scale?.title ?? colorbarTitle(exact, renormalised, bits, norm), painted.title);
  const geometry = figureGeometry(axes, { widthPx, minPx, barTitle });
  const hovertemplate = hoverTemplate({ weights: cells.weights, sizes, norm, signed: scale?.signed, renormalised });
  const data = causal && n > 1 ? [maskTrace(n)] : [];
  data.push(heatmapTrace(cells, painted, { scale, hovertemplate, barTitle, geometry }));
  const shapes = figureShapes({ rect, n, boundary, renormalised, written, size: geometry.size });
  const layout = figureLayout(axes, geometry, { title, axisNames: spec.axisNames, barTitle, shapes });
  const { size, plotW, plotH } = geometry;
  return { data, layout, labels: axes.labels, size, keyTokens: rect ? axes.keyTokens : null, plotW, plotH };
}

/** The colour bar's title with a line saying which colour scale is on (none for the default 0–1). */
function withScale(title, scaleTitle) {
  return scaleTitle ? `${title}<br>${plotlyText(scaleTitle)}` : title;
}

function colorbarTitle(exact, renormalised, bits, norm = false) {
  const base = valueName(norm ? "norm" : "weight", { exact, bits });
  return renormalised ? `${base}<br>${RENORMALISED}` : base;
}
