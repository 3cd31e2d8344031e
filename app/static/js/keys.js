// Keyboard maps of the page's composite widgets (WAI-ARIA APG grid and tabs patterns): which cell or tab a
// key leads to. Pure, so Node's test runner imports it as the page does (tests/js/keys.test.mjs).

import { AGGREGATES } from "./aggregates.js";
import { moveSelection } from "./state.js";

/**
 * The head grid's selection after `key` (with Ctrl held: `ctrl`), or null for a key the grid leaves alone.
 * Arrows step (state.js moveSelection); Home/End: the row's first head / last column (the aggregates come
 * last, as drawn); Ctrl+Home/End: the first / last cell of the grid; PageUp/PageDown: the first / last layer.
 */
export function gridKey({ layer, head }, key, ctrl, { layers, heads }) {
  const columns = [...Array(heads).keys(), ...Object.keys(AGGREGATES)];
  const last = columns[columns.length - 1];
  if (key === "Home") return ctrl ? { layer: 0, head: 0 } : { layer, head: 0 };
  if (key === "End") return ctrl ? { layer: layers - 1, head: last } : { layer, head: last };
  if (key === "PageUp") return { layer: 0, head };
  if (key === "PageDown") return { layer: layers - 1, head };
  return ctrl ? null : moveSelection({ layer, head }, key, { layers, heads });
}

/**
 * The heatmap cell cursor (query row i, key column j of an n x cols figure; cols = n when square) after
 * `key`, or null for another key. Arrows step and stop at the edges; Home/End: the row's first / last key;
 * Ctrl+Home/End: the first / last cell; PageUp/PageDown: the first / last query of the column.
 */
export function cellKey({ i, j }, key, ctrl, n, cols = n) {
  const clamp = (v, count) => Math.min(Math.max(v, 0), count - 1);
  const moves = {
    ArrowUp: [i - 1, j],
    ArrowDown: [i + 1, j],
    ArrowLeft: [i, j - 1],
    ArrowRight: [i, j + 1],
    Home: ctrl ? [0, 0] : [i, 0],
    End: ctrl ? [n - 1, cols - 1] : [i, cols - 1],
    PageUp: [0, j],
    PageDown: [n - 1, j],
  };
  if (!Object.hasOwn(moves, key) || n < 1 || cols < 1) return null;
  const [a, b] = moves[key];
  return { i: clamp(a, n), j: clamp(b, cols) };
}

/** The tab index after `key` among `count` tabs (Left/Right wrap round, Home/End), or null for another key. */
export function tabKey(index, key, count) {
  if (key === "ArrowLeft") return (index - 1 + count) % count;
  if (key === "ArrowRight") return (index + 1) % count;
  if (key === "Home") return 0;
  if (key === "End") return count - 1;
  return null;
}

/**
 * What the cell cursor announces, the hover's words spelled out: "query 'cat' (3) → key 'the' (1): 0.730".
 * `tokens` are display tokens (decoder.js displayToken), the queries'; `keyTokens` the keys' where they are
 * another sentence (cross-attention); `value` is the drawn value (null: not drawn). A causal model's cells
 * above the diagonal are masked; the hidden first key column (renormalised) is hidden. Weight × value norm
 * (`norm`) reads "share 0.412", and with the cell's `size` (share × its row's total) "· ‖α f‖ 1.37".
 */
export function cellText(cell) {
  const { tokens, keyTokens = tokens, i, j, value, causal = false, renormalised = false, norm = false, size = null } = cell;
  const where = `query '${tokens[i]}' (${i}) → key '${keyTokens[j]}' (${j})`;
  if (causal && j > i) return `${where}: masked (a causal model cannot look ahead)`;
  if (renormalised && j === 0) return `${where}: hidden (first token set aside, rows renormalised)`;
  if (value === null || value === undefined || Number.isNaN(value)) return `${where}: no value`;
  const sized = norm && Number.isFinite(size) ? ` · ‖α f‖ ${size.toPrecision(3)}` : "";
  const shown = `${norm ? "share " : ""}${value.toFixed(3)}${sized}`;
  return `${where}: ${shown}${renormalised ? " (renormalised without the first token)" : ""}`;
}
