// One colour scale for every view: the Plotly colorscale of the detail heatmap and the 256-entry LUT
// the canvas thumbnails use are built from the same stops, so a thumbnail and its detail agree.
// Stops are denser near 0 because most attention weights are small; the colour bar shows the mapping.

export const STOPS = Object.freeze([
  [0.0, "#ffffff"],
  [0.05, "#deebf7"],
  [0.15, "#9ecae1"],
  [0.35, "#4292c6"],
  [0.65, "#08519c"],
  [1.0, "#081d58"],
]);

/** Plotly colorscale form: [[stop, "rgb(...)"], ...]. */
export const COLORSCALE = STOPS.map(([t, hex]) => [t, hex]);

// Masked (causal upper triangle): grey hatch, never a colour of the scale.
export const MASK_BG = [236, 236, 236];
export const MASK_FG = [190, 190, 190];
export const MASK_BG_CSS = "#ececec";
export const MASK_FG_CSS = "#bebebe";

function hexToRgb(hex) {
  const v = Number.parseInt(hex.slice(1), 16);
  return [(v >> 16) & 255, (v >> 8) & 255, v & 255];
}

/** LUT[4*k .. 4*k+3] = RGBA for value k/255 (values above 1 clamp to the last entry). */
export const LUT = (() => {
  const lut = new Uint8ClampedArray(256 * 4);
  const stops = STOPS.map(([t, hex]) => [t, hexToRgb(hex)]);
  for (let k = 0; k < 256; k++) {
    const t = k / 255;
    let s = 1;
    while (s < stops.length - 1 && stops[s][0] < t) s++;
    const [t0, c0] = stops[s - 1];
    const [t1, c1] = stops[s];
    const f = t1 > t0 ? (t - t0) / (t1 - t0) : 0;
    for (let c = 0; c < 3; c++) lut[4 * k + c] = Math.round(c0[c] + f * (c1[c] - c0[c]));
    lut[4 * k + 3] = 255;
  }
  return lut;
})();

// Thumbnail frames coloured by a head statistic: a sequential scale distinct from the attention blues
// (viridis stops), so a frame never reads as an attention value.
export const STAT_STOPS = Object.freeze([
  [0.0, "#440154"],
  [0.25, "#3b528b"],
  [0.5, "#21918c"],
  [0.75, "#5ec962"],
  [1.0, "#fde725"],
]);

/** CSS colour for t in [0, 1] on STAT_STOPS (clamped). */
export function statColor(t) {
  const x = Math.min(1, Math.max(0, Number.isFinite(t) ? t : 0));
  let s = 1;
  while (s < STAT_STOPS.length - 1 && STAT_STOPS[s][0] < x) s++;
  const [t0, h0] = STAT_STOPS[s - 1];
  const [t1, h1] = STAT_STOPS[s];
  const f = t1 > t0 ? (x - t0) / (t1 - t0) : 0;
  const c0 = hexToRgb(h0);
  const c1 = hexToRgb(h1);
  const rgb = c0.map((c, i) => Math.round(c + f * (c1[i] - c)));
  return `rgb(${rgb.join(", ")})`;
}

/** CSS linear-gradient of STAT_STOPS, for the legend. */
export const STAT_GRADIENT = `linear-gradient(to right, ${STAT_STOPS.map(([t, hex]) => `${hex} ${t * 100}%`).join(", ")})`;

// A - B: red where A attends more, blue where B does, white at 0 (Plotly centres it with zmid: 0).
export const DIVERGING = Object.freeze([
  [0.0, "#2166ac"],
  [0.25, "#92c5de"],
  [0.5, "#f7f7f7"],
  [0.75, "#f4a582"],
  [1.0, "#b2182b"],
]);
