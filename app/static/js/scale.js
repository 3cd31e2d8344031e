// Colour scales of the detail heatmap: what the colours stand for. Only the colour (Plotly's z) changes;
// the hover always reads the true weight. 0–1 is the default because it is the one scale on which two
// heads, two inputs or two models compare; the others let a washed-out long input show its pattern.
// Pure (no DOM), so Node's test runner imports it as the page does (tests/js/scale.test.mjs).

// Weights below this are drawn as this on the log scale: 8-bit values resolve 1/255 ≈ 0.004 and float32
// attention on long inputs rarely matters below 1e-4, so four decades cover what a person can read.
export const LOG_FLOOR = 1e-4;
const LOG_MIN = Math.log10(LOG_FLOOR); // -4

/** The offered scales, in menu order: URL value -> {label (the menu), title (the colour bar)}. */
export const SCALES = Object.freeze({
  unit: Object.freeze({ label: "0–1 (comparable)", title: "" }),
  head: Object.freeze({ label: "head maximum", title: "colour: 0 to the head's max" }),
  row: Object.freeze({ label: "per row", title: "colour: each row ÷ its own max" }),
  log: Object.freeze({ label: `log (floor ${LOG_FLOOR})`, title: `colour: log₁₀, floor ${LOG_FLOOR}` }),
});

export const DEFAULT_SCALE = "unit";

/** A scale's name from a URL or a menu: one of SCALES, else the default. */
export function parseScale(value) {
  return typeof value === "string" && Object.hasOwn(SCALES, value) ? value : DEFAULT_SCALE;
}

/** Largest finite value of `values` (NaN, a hidden or missing cell, is skipped); 0 when there is none. */
export function headMax(values) {
  let max = 0;
  for (const v of values) if (v > max) max = v; // NaN > max is false
  return max;
}

/** Largest finite value of each of the n rows of `values` (n*cols row-major); 0 for a row with none. */
export function rowMax(values, n, cols = n) {
  const out = new Float64Array(n);
  for (let i = 0; i < n; i++) {
    let max = 0;
    const o = i * cols;
    for (let j = 0; j < cols; j++) if (values[o + j] > max) max = values[o + j];
    out[i] = max;
  }
  return out;
}

/** log10 of each weight, weights under LOG_FLOOR (zero included) drawn at the floor; NaN stays NaN. */
export function logScaled(values) {
  const out = new Float64Array(values.length);
  for (let k = 0; k < values.length; k++) {
    const v = values[k];
    out[k] = Number.isNaN(v) ? Number.NaN : Math.log10(Math.max(v, LOG_FLOOR));
  }
  return out;
}

/** Each row divided by its own max (a row of zeros stays zeros); NaN stays NaN. */
export function rowScaled(values, n, cols = n) {
  const maxima = rowMax(values, n, cols);
  const out = new Float64Array(n * cols);
  for (let i = 0; i < n; i++) {
    const o = i * cols;
    const m = maxima[i];
    for (let j = 0; j < cols; j++) out[o + j] = m > 0 ? values[o + j] / m : values[o + j];
  }
  return out;
}

const fmt = (v) => String(Number(v.toPrecision(3))); // 0.41234 -> "0.412", 1 -> "1"

/**
 * The colours of `values` (n*cols row-major, cols = n unless rectangular; NaN = gap) on scale `name`:
 * {z, zmin, zmax, title, transformed, tickvals?, ticktext?}. `z` is `values` itself when the colour bar can read true weights (0–1, head
 * maximum: only zmax moves), else a new Float64Array and `transformed` is true, so the hover must read
 * `values`. `title` is "" for the default, else the colour bar's line saying which scale is on.
 */
export function scaleValues(values, n, name = DEFAULT_SCALE, cols = n) {
  const scale = parseScale(name);
  if (scale === "head") {
    const max = headMax(values);
    // All zero (or nothing left): 0–1, so the figure reads as the blank it is.
    const zmax = max > 0 ? max : 1;
    return { z: values, zmin: 0, zmax, title: `colour: 0 to the head's max ${fmt(zmax)}`, transformed: false };
  }
  if (scale === "row") {
    return { z: rowScaled(values, n, cols), zmin: 0, zmax: 1, title: SCALES.row.title, transformed: true };
  }
  if (scale === "log") {
    // Ticks at each decade, labelled with the weights themselves (the floor as "≤").
    const tickvals = [];
    for (let d = LOG_MIN; d <= 0; d++) tickvals.push(d);
    const ticktext = tickvals.map((d) => (d === LOG_MIN ? `≤${LOG_FLOOR}` : String(Number(`1e${d}`))));
    const title = SCALES.log.title;
    return { z: logScaled(values), zmin: LOG_MIN, zmax: 0, title, transformed: true, tickvals, ticktext };
  }
  return { z: values, zmin: 0, zmax: 1, title: "", transformed: false };
}
