// Token lines of many heads at once (bertviz's head view): a colour per head, which lines a pair filter and
// the head toggles keep, the line budget, and the text a line reads as. Pure (no DOM), so tests/js/ imports
// it as the page does; tokens.js draws what it returns.

import { kvGroups } from "./decoder.js";

// 16 categorical colours for heads on a white page: Okabe-Ito's (no yellow, too pale for thin lines) then
// Paul Tol's muted and bright sets, ordered so the first heads get the colours furthest apart. Colour is
// never the only cue: swatches are labelled and a line's text names its head.
export const PALETTE = Object.freeze([
  "#0072b2",
  "#e69f00",
  "#009e73",
  "#d55e00",
  "#cc79a7",
  "#56b4e9",
  "#332288",
  "#999933",
  "#882255",
  "#44aa99",
  "#aa4499",
  "#117733",
  "#ee6677",
  "#997700",
  "#777777",
  "#000000",
]);

// Past 16 heads the colours come round again with a dash pattern, so (colour, dash) stays unique to 64.
const DASHES = Object.freeze(["", "6 3", "2 2", "8 3 2 3"]);

/** {color, dash} of head `h`: dash "" is a solid line. Heads past 64 repeat a style (the legend says so). */
export function headStyle(h) {
  const k = Math.floor(h / PALETTE.length) % DASHES.length;
  return { color: PALETTE[h % PALETTE.length], dash: DASHES[k] };
}

/** Heads that still have a style of their own. */
export const DISTINCT_STYLES = PALETTE.length * DASHES.length;

// Sentence pairs: which (query, key) segments a line may join; A is segment 0, B segment 1.
export const PAIR_FILTERS = Object.freeze({
  all: { label: "All lines", from: null, to: null },
  ab: { label: "A → B", from: 0, to: 1 },
  ba: { label: "B → A", from: 1, to: 0 },
  aa: { label: "A → A", from: 0, to: 0 },
  bb: { label: "B → B", from: 1, to: 1 },
});

/** Predicate (i, j) for the filter `name` over `segments` (0/1 per token); unknown names keep every line. */
export function pairFilter(name, segments) {
  const filter = Object.hasOwn(PAIR_FILTERS, name) ? PAIR_FILTERS[name] : PAIR_FILTERS.all; // never __proto__
  if (filter.from === null) return () => true;
  const seg = (k) => (segments?.[k] === 1 ? 1 : 0);
  return (i, j) => seg(i) === filter.from && seg(j) === filter.to;
}

/**
 * The lines worth drawing: [{h, i, j, w}] for each head of `heads` ([{h, values}], values n*cols row-major;
 * cols = n but for cross-attention's other sentence of keys), weight >= `threshold` (NaN never: a hidden
 * first token), keys up to the query for a causal model, kept by `keep(i, j)`. At most `budget` lines, the strongest (ties in head, query, key order), so a long input
 * stays a light drawing; `cut` is the weight of the weakest line kept when the budget cut (else null).
 */
export function collectLines(heads, { n, cols = n, causal = false, threshold = 0, keep = () => true, budget = Infinity }) {
  const lines = [];
  for (const { h, values } of heads) {
    for (let i = 0; i < n; i++) {
      for (let j = 0; j < (causal ? Math.min(i + 1, cols) : cols); j++) {
        const w = values[i * cols + j];
        if (w >= threshold && keep(i, j)) lines.push({ h, i, j, w });
      }
    }
  }
  if (lines.length <= budget) return { lines, cut: null };
  const order = lines.map((line, k) => k).sort((a, b) => lines[b].w - lines[a].w || a - b);
  const kept = order.slice(0, budget).sort((a, b) => a - b);
  return { lines: kept.map((k) => lines[k]), cut: lines[order[budget - 1]].w };
}

/**
 * "L2 H3: 'it' → 'animal' 0.412" ("≈" for quantized values); `tokens` already spelled for display, `keyTokens`
 * too where the keys are another sentence (cross-attention).
 */
export function lineText({ layer, h, i, j, w }, tokens, { exact = true, keyTokens = tokens } = {}) {
  const name = typeof h === "number" ? `H${h}` : h; // an aggregate of the heads goes by its name
  return `L${layer} ${name}: '${tokens[i]}' → '${keyTokens[j]}' ${exact ? "" : "≈"}${w.toFixed(3)}`;
}

/** Swatch groups: [{label, heads}], one unlabelled group without grouped-query heads, else "kv g" each. */
export function swatchGroups({ heads, kvHeads }) {
  const groups = kvGroups({ heads, kvHeads });
  if (groups.length === heads) return [{ label: "", heads: groups.map((g) => g.first) }];
  return groups.map(({ group, first, count }) => ({
    label: `kv ${group}`,
    heads: Array.from({ length: count }, (_, k) => first + k),
  }));
}

/** Heads shown after a swatch press: `only` isolates `h` (or shows all again when it was alone). */
export function toggleHead(hidden, h, heads, { only = false } = {}) {
  const next = new Set(hidden);
  if (!only) {
    if (next.has(h)) next.delete(h);
    else next.add(h);
    return next;
  }
  const alone = !next.has(h) && next.size === heads - 1;
  if (alone) return new Set();
  return new Set(Array.from({ length: heads }, (_, k) => k).filter((k) => k !== h));
}
