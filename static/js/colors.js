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
