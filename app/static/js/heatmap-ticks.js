// Axis labels of the heatmaps (heatmap.js, long-figure.js): how tokens are written as Plotly labels, how many
// fit, at what font. Pure (no DOM), so tests/js/ imports it as the page does.

export const MIN_FONT_PX = 9; // the smallest label font that still reads
export const MAX_FONT_PX = 12;
export const LABEL_PX = MIN_FONT_PX + 1; // minimum spacing between two axis labels: the font and 1 px of air
export const ALL_LABELS_N = 64; // up to this many tokens every one is labelled
const MAX_LABELS = ALL_LABELS_N; // per axis and view: more costs Plotly seconds and reads no better
const MAX_LABEL_CHARS = 18; // longer tokens are cut on the axes (the hover keeps them whole)

/** Plotly parses a small HTML subset in labels; entities make every token literal text. */
export function plotlyText(s) {
  return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

/** A token cut to MAX_LABEL_CHARS for an axis label (the hover keeps it whole). */
export function shorten(token) {
  return token.length > MAX_LABEL_CHARS ? `${token.slice(0, MAX_LABEL_CHARS - 1)}…` : token;
}

/** Label font for ticks `spacingPx` apart: as large as fits, MIN_FONT_PX to MAX_FONT_PX. */
export function tickFont(spacingPx) {
  return Math.max(MIN_FONT_PX, Math.min(MAX_FONT_PX, Math.floor(spacingPx) - 1));
}

/** Tick positions in [lo, hi]: labels of `cellPx`-wide cells must not overlap, at most MAX_LABELS. */
export function thinTicks(lo, hi, cellPx) {
  const span = Math.max(hi - lo + 1, 1);
  const step = Math.max(1, Math.ceil(LABEL_PX / Math.max(cellPx, 1e-6)), Math.ceil(span / MAX_LABELS));
  const first = Math.ceil(Math.max(lo, 0) / step) * step;
  const ticks = [];
  for (let i = first; i <= hi; i += step) ticks.push(i);
  return ticks;
}
