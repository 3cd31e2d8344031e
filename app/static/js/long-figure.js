// The long-input detail's figure: one window of a trace (POST /api/trace/window) as a Plotly heatmap in
// TOKEN coordinates. x and y are the blocks' edges (cells + 1 of them; drawnEdges), so the axes run over
// [0, n) tokens whatever the pooling, cell i of an exact axis spans [i, i + 1), and a zoom's range is a
// token range.
// Pure (no DOM), so Node's test runner imports it as the page does (tests/js/long-figure.test.mjs).

import { COLORSCALE, MASK_BG_CSS } from "./colors.js";
import { displayToken } from "./decoder.js";
import { plotlyText, shorten, thinTicks, tickFont } from "./heatmap.js";

export const MAX_CELLS = 512; // cells per side the detail ever holds: ~512 x 512 values, whatever n
const LABELS_PX = 130; // room for the longest shortened token label at 12 px, and its tick
const AXIS_TITLE_PX = 26;
const TITLE_PX = 34;
const COLORBAR_PX = 110;
const MAX_FONT_PX = 12;
const EXACT = "exact: 1 cell = 1 token";
export const MARGIN = Object.freeze({
  l: LABELS_PX + AXIS_TITLE_PX,
  r: COLORBAR_PX,
  t: TITLE_PX + LABELS_PX + AXIS_TITLE_PX,
  b: 16,
});

const count = new Intl.NumberFormat("en-US"); // 1,024 whatever the browser's locale: the tests read it

/** Tokens lo..hi-1 in words: "1,024–2,047", or "7" for one token. */
export function tokenSpan(lo, hi) {
  return hi - lo <= 1 ? count.format(lo) : `${count.format(lo)}–${count.format(hi - 1)}`;
}

/** True when every block of `edges` is one token (the axis shows the weights themselves). */
export function isExact(edges) {
  return edges.length - 1 === edges[edges.length - 1] - edges[0];
}

/** The integer token span [lo, hi) that covers a visible axis range (either order), clamped to [0, n). */
export function visibleSpan(range, n) {
  const lo = Math.min(Math.max(Math.floor(Math.min(...range)), 0), n - 1);
  const hi = Math.min(Math.max(Math.ceil(Math.max(...range)), lo + 1), n);
  return [lo, hi];
}

/**
 * The edges an axis is drawn with: `edges` themselves when its blocks are all one size, else evenly spaced,
 * lo + c·span/cells. The server's blocks differ by one token (their edges are those floored), so each drawn
 * boundary lies less than one token after its true one while the hover names the true tokens; Plotly paints
 * uneven bricks one rectangle at a time, about 7x slower at 512 x 512 (~650 against ~90 ms in Chromium),
 * and every pan redraws.
 */
export function drawnEdges(edges) {
  const cells = edges.length - 1;
  const [lo, span] = [edges[0], edges[cells] - edges[0]];
  return span % cells === 0 ? edges : Array.from({ length: cells + 1 }, (_, c) => lo + (c * span) / cells);
}

/** "Key tokens 1,024–2,047, pooled ×8 (max)"; one token a cell: "Key tokens 1,024–1,100". */
export function axisTitle(name, edges, factor, reduce) {
  const span = `${name} tokens ${tokenSpan(edges[0], edges[edges.length - 1])}`;
  return isExact(edges) ? span : `${span}, pooled ×${factor} (${reduce})`;
}

/** The badge beside the plot: "pooled ×8 × 8 (max)" (query rows × key columns) or the exact legend. */
export function badgeText(win) {
  return win.exact ? EXACT : `pooled ×${win.factor[0]} × ${win.factor[1]} (${win.reduce})`;
}

/** What the live region says after a draw: the head, the tokens on each axis and how they are shown. */
export function describeWindow(win, where) {
  const rows = tokenSpan(win.row_edges[0], win.row_edges[win.row_edges.length - 1]);
  const cols = tokenSpan(win.col_edges[0], win.col_edges[win.col_edges.length - 1]);
  const cells = `${win.values.length} × ${win.values[0]?.length ?? 0} cells`;
  return `${where}: queries ${rows}, keys ${cols}; ${cells}, ${badgeText(win)}.`;
}

/**
 * Hover words for each block of one axis: "query 'cat' (2)" for a one-token block (the normal detail's
 * words), "queries 1,024–1,031" for a pooled one. `tokens` are display tokens.
 */
export function blockLabels(edges, tokens, one, many) {
  const labels = new Array(edges.length - 1);
  for (let b = 0; b < labels.length; b++) {
    const [lo, hi] = [edges[b], edges[b + 1]];
    labels[b] = hi - lo === 1 ? `${one} '${plotlyText(tokens[lo])}' (${lo})` : `${many} ${tokenSpan(lo, hi)}`;
  }
  return labels;
}

/** One axis: token labels at the cell centres where exact (thinned to fit), else Plotly's own numbers. */
function axisLayout(edges, range, tokens, cellPxPerToken) {
  if (!isExact(edges)) return { tickmode: "auto", tickformat: ",d", nticks: 8, tickfont: { size: MAX_FONT_PX } };
  const [lo, hi] = visibleSpan(range, tokens.length);
  const ticks = thinTicks(lo, hi - 1, cellPxPerToken);
  const fontPx = Math.min(MAX_FONT_PX, tickFont((ticks.length > 1 ? ticks[1] - ticks[0] : 1) * cellPxPerToken));
  return {
    tickmode: "array",
    tickvals: ticks.map((i) => i + 0.5),
    ticktext: ticks.map((i) => plotlyText(shorten(tokens[i]))),
    tickfont: { size: fontPx },
  };
}

/**
 * The figure of window `win` (TraceWindowResponse): {data, layout}. `tokens` and `byteLevel` are the
 * trace's; `size` the square plot's side in px; `range` the view to keep ({x: [a, b], y: [a, b]} in
 * tokens), null for the whole head. A causal model's blocks wholly above the diagonal (every key after
 * every query) are gaps over a grey background, as the masked cells of the normal detail.
 */
export function buildLongFigure(win, { tokens: raw, byteLevel, causal, size, title, range = null }) {
  const tokens = raw.map((token) => displayToken(token, byteLevel));
  const n = tokens.length;
  const { row_edges: rowEdges, col_edges: colEdges, values } = win;
  const rowLabels = blockLabels(rowEdges, tokens, "query", "queries");
  const colLabels = blockLabels(colEdges, tokens, "key", "keys");
  const z = new Array(values.length);
  const text = new Array(values.length);
  for (let r = 0; r < values.length; r++) {
    const lastQuery = rowEdges[r + 1] - 1;
    const row = values[r];
    const zr = new Array(row.length);
    const tr = new Array(row.length);
    for (let c = 0; c < row.length; c++) {
      const masked = causal && colEdges[c] > lastQuery;
      zr[c] = masked ? null : row[c];
      tr[c] = masked ? "" : `${rowLabels[r]} → ${colLabels[c]}`;
    }
    z[r] = zr;
    text[r] = tr;
  }
  const view = range ?? { x: [0, n], y: [n, 0] };
  const pxPerToken = (r) => size / Math.max(Math.abs(r[1] - r[0]), 1e-9);
  const value = win.exact ? "%{z:.6f}" : `${win.reduce} %{z:.4f}`;
  const data = [
    {
      type: "heatmap",
      name: "attention",
      x: drawnEdges(colEdges),
      y: drawnEdges(rowEdges),
      z,
      text,
      zmin: 0,
      zmax: 1,
      colorscale: COLORSCALE,
      hovertemplate: `%{text}: ${value}<extra></extra>`,
      hoverongaps: false,
      colorbar: {
        title: { text: win.exact ? "attention" : `attention<br>(${win.reduce} of each cell)`, side: "right" },
        thickness: 14,
        len: Math.min(1, 420 / size),
        y: 1,
        yanchor: "top",
      },
    },
  ];
  const axis = { showgrid: false, zeroline: false, automargin: false, showline: true, linecolor: "#c0c6d2", mirror: true, ticks: "outside", ticklen: 4 };
  const factor = win.factor;
  const layout = {
    title: { text: plotlyText(title), x: 0.01, xanchor: "left", y: 1, yanchor: "top", yref: "container", pad: { t: 10 }, font: { size: 14 } },
    width: MARGIN.l + size + MARGIN.r,
    height: MARGIN.t + size + MARGIN.b,
    margin: { ...MARGIN },
    xaxis: {
      ...axis,
      ...axisLayout(colEdges, view.x, tokens, pxPerToken(view.x)),
      title: { text: axisTitle("Key", colEdges, factor[1], win.reduce), standoff: 6 },
      side: "top",
      tickangle: -90,
      range: [...view.x],
      autorange: false,
    },
    yaxis: {
      ...axis,
      ...axisLayout(rowEdges, view.y, tokens, pxPerToken(view.y)),
      title: { text: axisTitle("Query", rowEdges, factor[0], win.reduce), standoff: 6 },
      range: [...view.y],
      autorange: false,
    },
    plot_bgcolor: causal ? MASK_BG_CSS : "#ffffff",
    paper_bgcolor: "#ffffff",
    dragmode: "zoom",
    hovermode: "closest",
    uirevision: `${n}`,
  };
  return { data, layout };
}
