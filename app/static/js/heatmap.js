// Head detail: one head (or an aggregate) drawn as a Plotly heatmap in an element. heatmap-figure.js
// builds the figure (traces, layout, hover); here it is drawn, redrawn through Plotly.react keeping a
// person's zoom, its axis labels thinned to the zoomed range, and a click on a row's cell or label heard.

import { displayToken } from "./decoder.js";
import { buildFigure, NARROW_PX } from "./heatmap-figure.js";
import { ALL_LABELS_N, MAX_FONT_PX, plotlyText, shorten, thinTicks, tickFont } from "./heatmap-ticks.js";
import { plotlyReady } from "./plotly-ready.js";

export { ALL_LABELS_N, plotlyText, shorten, thinTicks, tickFont }; // their old home: callers import them here

// What a drawn figure needs to thin its ticks on zoom: gd -> {tokens, keyTokens, px, thinning}. A WeakMap, not
// properties on the element: it goes when the element goes, and Plotly's own fields stay its own.
const figures = new WeakMap();

/** Draw or redraw the figure in `gd`; resolves when Plotly has drawn it. */
export async function renderHeatmap(gd, spec) {
  // The scrolling panel's width is the room the figure may take before it scrolls.
  const widthPx = gd.parentElement?.clientWidth || 900;
  const { data, layout, keyTokens, plotW, plotH } = buildFigure({ ...spec, widthPx });
  const narrow = widthPx < NARROW_PX;
  // Keep a person's zoom when only the head changes (same tokens), so heads compare region by region.
  const known = figures.get(gd);
  const sameShape = known?.tokens.length === spec.tokens.length && (known?.keyTokens?.length ?? -1) === (keyTokens?.length ?? -1);
  if (spec.keepZoom && gd.layout && sameShape) {
    layout.xaxis.range = [...gd.layout.xaxis.range];
    layout.yaxis.range = [...gd.layout.yaxis.range];
  }
  const config = {
    displaylogo: false,
    showSendToCloud: false, // plotly.js 4's "Share chart..." uploads the figure to Plotly Cloud: never ours
    // Plotly's "Double-click to zoom back out" tip pops up over the page's top right (the tabs and
    // export buttons); the caption under the title says it instead.
    showTips: false,
    displayModeBar: narrow ? false : "hover", // on a phone it covers the title; the page has its own exports
    responsive: false,
    scrollZoom: false,
    modeBarButtonsToRemove: ["select2d", "lasso2d", "autoScale2d"],
    toImageButtonOptions: { filename: spec.filename ?? "headscope-head" },
  };
  // A snapshot runs plotly.js once its grid is painted (plotly-ready.js); the served page has it already.
  const Plotly = window.Plotly ?? (await plotlyReady());
  await Plotly.react(gd, data, layout, config);
  gd.dataset.n = String(spec.tokens.length);
  gd.dataset.exact = spec.exact ? "true" : "false";
  const shown = spec.tokens.map((token) => displayToken(token, spec.byteLevel));
  const axes = { tokens: shown, keyTokens, px: { xaxis: plotW, yaxis: plotH } };
  await bindTickThinning(gd, axes, spec.onRow, layout.xaxis.tickfont.size);
  return gd;
}

// When a person zooms, more labels fit: ticks follow the visible range. Also run after each redraw,
// because Plotly.react keeps a zoom (same uirevision) but would take the full view's ticks.
function updateTicks(gd) {
  const { tokens, keyTokens, px, fontPx } = figures.get(gd);
  const update = {};
  for (const name of ["xaxis", "yaxis"]) {
    const labels = name === "xaxis" && keyTokens ? keyTokens : tokens;
    const [a, b] = gd.layout[name].range;
    const lo = Math.max(0, Math.ceil(Math.min(a, b)));
    const hi = Math.min(labels.length - 1, Math.floor(Math.max(a, b)));
    const cellPx = px[name] / Math.max(Math.abs(b - a), 1);
    const ticks = thinTicks(lo, hi, cellPx);
    update[`${name}.tickvals`] = ticks;
    update[`${name}.ticktext`] = ticks.map((i) => plotlyText(shorten(labels[i])));
    // No larger than the first draw's font, which the margins were measured for.
    const spacing = (ticks.length > 1 ? ticks[1] - ticks[0] : 1) * cellPx;
    update[`${name}.tickfont.size`] = Math.min(fontPx, tickFont(spacing));
  }
  const same =
    JSON.stringify(update["xaxis.tickvals"]) === JSON.stringify(gd.layout.xaxis.tickvals) &&
    JSON.stringify(update["yaxis.tickvals"]) === JSON.stringify(gd.layout.yaxis.tickvals) &&
    update["xaxis.tickfont.size"] === gd.layout.xaxis.tickfont?.size &&
    update["yaxis.tickfont.size"] === gd.layout.yaxis.tickfont?.size;
  return same ? Promise.resolve(gd) : window.Plotly.relayout(gd, update);
}

const labelClicks = new WeakSet(); // figures whose DOM click listener is bound

// A click on a cell, or on a query token's label, calls the figure's onRow(query index) when it has one.
function bindRowClicks(gd) {
  gd.on("plotly_click", (event) => {
    const point = event?.points?.find((p) => p.data.type === "heatmap");
    if (point) figures.get(gd)?.onRow?.(Math.round(point.y));
  });
  if (labelClicks.has(gd)) return; // a DOM listener outlives Plotly.purge, unlike gd.on's
  labelClicks.add(gd);
  // The query labels lie partly under Plotly's axis drag strip, which takes the clicks: any click left of
  // the plot area, within its height, is a click on the label of the row at that height.
  gd.addEventListener("click", (event) => {
    const ya = gd._fullLayout?.yaxis;
    const xa = gd._fullLayout?.xaxis;
    if (!ya || !xa) return;
    const box = gd.getBoundingClientRect();
    const x = event.clientX - box.left;
    const y = event.clientY - box.top - ya._offset;
    if (x >= xa._offset || y < 0 || y > ya._length) return;
    const row = Math.round(ya.p2l(y));
    const n = figures.get(gd)?.tokens.length ?? 0;
    if (row >= 0 && row < n) figures.get(gd)?.onRow?.(row);
  });
}

// `axes`: {tokens (the queries'), keyTokens (the keys' when another sentence, else null), px: {xaxis, yaxis}}.
function bindTickThinning(gd, axes, onRow = null, fontPx = MAX_FONT_PX) {
  const known = figures.get(gd);
  figures.set(gd, { ...axes, onRow, fontPx, thinning: true });
  if (!known?.thinning) {
    bindRowClicks(gd);
    gd.on("plotly_relayout", (event) => {
      const keys = Object.keys(event ?? {});
      if (keys.some((k) => k.startsWith("xaxis.range") || k.startsWith("yaxis.range") || k.endsWith("autorange"))) {
        updateTicks(gd);
      }
    });
  }
  return updateTicks(gd);
}

/** Remove a figure and its listeners, so the element can take a fresh one (another run, other tokens). */
export function clearHeatmap(gd) {
  if (gd.data) window.Plotly.purge(gd);
  figures.delete(gd); // purge dropped the relayout listener; the next draw binds it again
  gd.replaceChildren();
}

/** Download the current figure as PNG or SVG at its drawn size. */
export async function exportImage(gd, format, filename) {
  const Plotly = window.Plotly ?? (await plotlyReady());
  return Plotly.downloadImage(gd, {
    format,
    filename,
    width: gd.layout.width,
    height: gd.layout.height,
    scale: format === "png" ? 2 : 1,
  });
}
