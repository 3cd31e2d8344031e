// Head detail: one head (or an aggregate) as a Plotly heatmap. Query tokens on y (top to bottom), key
// tokens on x. Axes are numeric with tickvals/ticktext so two identical tokens stay separate cells;
// the hover reads the token text from customdata. Redraws go through Plotly.react.

import { COLORSCALE, MASK_BG_CSS, MASK_FG_CSS } from "./colors.js";

const LABEL_PX = 13; // minimum spacing between two axis labels
const MIN_PLOT_PX = 360;
const MAX_FIT_PX = 640; // up to this size the figure fits; beyond it the panel scrolls
const MIN_CELL_PX = 4;
const MAX_CELL_PX = 32;

/** Plotly parses a small HTML subset in labels; entities make every token literal text. */
export function plotlyText(s) {
  return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

/** Side of the square plot area in px: fits up to MAX_FIT_PX, then grows (and scrolls) with n. */
export function plotSize(n) {
  const fit = Math.min(MAX_FIT_PX, Math.max(MIN_PLOT_PX, n * MAX_CELL_PX));
  return Math.max(fit, n * MIN_CELL_PX);
}

/** Tick positions in [lo, hi] spaced so labels of `cellPx`-wide cells do not overlap. */
export function thinTicks(lo, hi, cellPx) {
  const step = Math.max(1, Math.ceil(LABEL_PX / Math.max(cellPx, 1e-6)));
  const first = Math.ceil(Math.max(lo, 0) / step) * step;
  const ticks = [];
  for (let i = first; i <= hi; i += step) ticks.push(i);
  return ticks;
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
 * Build the figure. `values` is n*n row-major (Float32Array or number[]) or an array of n rows.
 * Returns {data, layout}.
 */
export function buildFigure({ tokens, values, causal, boundary, title, exact }) {
  const n = tokens.length;
  const at = Array.isArray(values) && Array.isArray(values[0]) ? (i, j) => values[i][j] : (i, j) => values[i * n + j];
  const labels = tokens.map(plotlyText);
  const z = new Array(n);
  const customdata = new Array(n);
  for (let i = 0; i < n; i++) {
    const row = new Array(n);
    const cd = new Array(n);
    const q = labels[i];
    for (let j = 0; j < n; j++) {
      row[j] = causal && j > i ? null : at(i, j);
      cd[j] = `${q} → ${labels[j]}`;
    }
    z[i] = row;
    customdata[i] = cd;
  }
  const size = plotSize(n);
  const cellPx = size / Math.max(n, 1);
  const ticks = thinTicks(0, n - 1, cellPx);
  const ticktext = ticks.map((i) => labels[i]);
  const fontSize = cellPx >= 14 ? 12 : cellPx >= 8 ? 10 : 9;

  const data = [];
  if (causal && n > 1) {
    const poly = maskPolygon(n);
    data.push({
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
    });
  }
  data.push({
    type: "heatmap",
    name: "attention",
    z,
    x0: 0,
    dx: 1,
    y0: 0,
    dy: 1,
    zmin: 0,
    zmax: 1,
    colorscale: COLORSCALE,
    customdata,
    hovertemplate: "%{customdata}: %{z:.3f}<extra></extra>",
    hoverongaps: false,
    xgap: 0,
    ygap: 0,
    colorbar: {
      title: { text: exact ? "attention" : "attention (8-bit)", side: "right" },
      thickness: 14,
      len: Math.min(1, 420 / size),
      y: 1,
      yanchor: "top",
    },
  });

  const shapes = [];
  if (boundary > 0 && boundary < n) {
    const line = { color: "#d62728", width: 2, dash: "dot" };
    shapes.push(
      { type: "line", name: "segment-boundary-x", xref: "x", yref: "paper", x0: boundary - 0.5, x1: boundary - 0.5, y0: 0, y1: 1, line },
      { type: "line", name: "segment-boundary-y", xref: "paper", yref: "y", y0: boundary - 0.5, y1: boundary - 0.5, x0: 0, x1: 1, line },
    );
  }

  const axis = {
    tickmode: "array",
    tickvals: ticks,
    ticktext,
    tickfont: { size: fontSize },
    showgrid: false,
    zeroline: false,
    automargin: true,
    fixedrange: false,
  };
  const layout = {
    // Pinned to the top of the figure so the key-axis labels (also on top) never run into it.
    title: { text: plotlyText(title), x: 0.01, xanchor: "left", y: 0.995, yanchor: "top", yref: "container", font: { size: 14 } },
    width: size + 220,
    height: size + 180,
    margin: { l: 40, r: 20, t: 40, b: 30 },
    xaxis: { ...axis, title: { text: "key (attended to)" }, side: "top", tickangle: -60, range: [-0.5, n - 0.5] },
    yaxis: {
      ...axis,
      title: { text: "query (attending)" },
      range: [n - 0.5, -0.5],
      scaleanchor: "x",
      constrain: "domain",
    },
    shapes,
    plot_bgcolor: "#ffffff",
    paper_bgcolor: "#ffffff",
    dragmode: "zoom",
    hovermode: "closest",
    uirevision: `${n}`,
  };
  return { data, layout, labels, size };
}

/** Draw or redraw the figure in `gd`; resolves when Plotly has drawn it. */
export async function renderHeatmap(gd, spec) {
  const { data, layout, labels, size } = buildFigure(spec);
  const config = {
    displaylogo: false,
    responsive: false,
    scrollZoom: false,
    modeBarButtonsToRemove: ["select2d", "lasso2d"],
    toImageButtonOptions: { filename: spec.filename ?? "headscope-head" },
  };
  await window.Plotly.react(gd, data, layout, config);
  gd.dataset.n = String(labels.length);
  gd.dataset.exact = spec.exact ? "true" : "false";
  bindTickThinning(gd, labels, size);
  return gd;
}

// When a person zooms, more labels fit: recompute the ticks for the visible range.
function bindTickThinning(gd, labels, size) {
  gd._headscopeLabels = labels;
  gd._headscopeSize = size;
  if (gd._headscopeThinning) return;
  gd._headscopeThinning = true;
  gd.on("plotly_relayout", (event) => {
    if (!event || (!("xaxis.range[0]" in event) && !("xaxis.autorange" in event) && !("yaxis.range[0]" in event))) return;
    const labels = gd._headscopeLabels;
    const update = {};
    for (const name of ["xaxis", "yaxis"]) {
      const [a, b] = gd.layout[name].range;
      const lo = Math.max(0, Math.ceil(Math.min(a, b)));
      const hi = Math.min(labels.length - 1, Math.floor(Math.max(a, b)));
      const cellPx = gd._headscopeSize / Math.max(Math.abs(b - a), 1);
      const ticks = thinTicks(lo, hi, cellPx);
      update[`${name}.tickvals`] = ticks;
      update[`${name}.ticktext`] = ticks.map((i) => labels[i]);
    }
    const same = JSON.stringify(update["xaxis.tickvals"]) === JSON.stringify(gd.layout.xaxis.tickvals);
    if (!same) window.Plotly.relayout(gd, update);
  });
}

/** Download the current figure as PNG or SVG at its drawn size. */
export function exportImage(gd, format, filename) {
  return window.Plotly.downloadImage(gd, {
    format,
    filename,
    width: gd.layout.width,
    height: gd.layout.height,
    scale: format === "png" ? 2 : 1,
  });
}
