// Which map every view shows: the attention weights α_ij, or weight × value norm (Kobayashi et al. 2020):
// each head's α_ij ‖f_h(x_j)‖ with f_h(x_j) key j's value through the head's slice of the output projection,
// divided by its row's total, so that rows sum to 1 and every view reads the shares as it reads weights.
// The service does the work (`"weighting": "norm"`, docs/http-api.md "Insight routes"); this module names what
// is shown and gives a cell its size (share × its row's total, the exact head's `row_norms`).
// Pure (no DOM), so Node's test runner imports it as the page does (tests/js/weighting.test.mjs).

// label: the switch's; value: what one cell is (the token lines' notes and readouts).
export const WEIGHTINGS = Object.freeze({
  weight: Object.freeze({ label: "Weights", value: "weight" }),
  norm: Object.freeze({ label: "Weight × value norm", value: "share" }),
});

export const DEFAULT_WEIGHTING = "weight";

/** A weighting's name from a URL or a control: one of WEIGHTINGS, else the default (weights). */
export function parseWeighting(value) {
  return typeof value === "string" && Object.hasOwn(WEIGHTINGS, value) ? value : DEFAULT_WEIGHTING;
}

/** The weighting an answer holds: its header says "norm"; absent, the weights (every answer before it). */
export function weightingOf(attention) {
  return parseWeighting(attention?.header?.weighting);
}

/**
 * What a colour bar calls the values: "attention" or "weight × norm (share)", with the transport's bits when
 * they are not the exact float32s ("attention (8-bit)", "weight × norm (share, 8-bit)").
 */
export function valueName(weighting, { exact = true, bits = 8 } = {}) {
  if (parseWeighting(weighting) === "norm") return `weight × norm (share${exact ? "" : `, ${bits}-bit`})`;
  return exact ? "attention" : `attention (${bits}-bit)`;
}

/**
 * What a sink head looks like under each weighting, as the statistics glossary says it (mha.analysis.stats'
 * docstring, "Which map"; its MiniLM figures are tests/mha/test_norms.py's): busy by weight, quiet by norm.
 */
export const SINK_BY_WEIGHTING = Object.freeze({
  weight:
    "By weight, a sink head looks busy: most of its attention sits on [CLS], [SEP] or the first token (BOS), " +
    "so its attention to special tokens or to the first token is high and it is labelled special-sink or " +
    "first-token-sink. The weights say where it looks, not what it moves.",
  norm:
    "By weight × value norm the same head is quiet: those tokens' values are small, so it moves little from " +
    "them; its shares on the special and first tokens drop and its label follows what it does move. On " +
    "MiniLM, L2 H7 puts 0.91 of its weight on [CLS] and [SEP] in “The cat sat on the mat because it was " +
    "tired.”, but 0.19 of its norm.",
});

/** The glossary's line on which map the statistics read now. */
export function readsLine(weighting) {
  return parseWeighting(weighting) === "norm"
    ? "The statistics above read weight × value norm shares (each row's α·‖f(x)‖ over its total)."
    : "The statistics above read the attention weights; the Weight × value norm switch reads what each head moves.";
}

/** What a note says of norm shares, once: where the idea comes from and how to read a share. */
export const NORM_NOTE =
  "Weight × value norm: each cell is its row's share of α·‖f(x)‖, what the head moves rather than where " +
  "it looks (Kobayashi et al. 2020).";

/**
 * The size ‖α_ij f_h(x_j)‖ of each of rows*cols cells: its share times its row's total (`rowNorms`, the
 * exact head's header). NaN stays NaN (a masked or hidden cell); null when there are no totals to use.
 */
export function cellSizes(shares, rowNorms, rows, cols = rows) {
  if (!Array.isArray(rowNorms) || rowNorms.length !== rows || shares.length !== rows * cols) return null;
  const out = new Float64Array(rows * cols);
  for (let i = 0; i < rows; i++) {
    const total = rowNorms[i];
    for (let j = 0; j < cols; j++) out[i * cols + j] = shares[i * cols + j] * total;
  }
  return out;
}
