// app/static/js/lines.js: token lines of every head of a layer (head colours, the pair filter, the line budget,
// the swatches) and their view state in the URL. Run: node --test tests/js/

import assert from "node:assert/strict";
import { test } from "node:test";

import {
  DISTINCT_STYLES,
  PALETTE,
  collectLines,
  headStyle,
  lineText,
  pairFilter,
  swatchGroups,
  toggleHead,
} from "../../app/static/js/lines.js";
import { DEFAULT_STATE, encodeState, readState } from "../../app/static/js/state.js";
import { lineThreshold } from "../../app/static/js/tokens.js";

// sRGB hex -> CIELAB (D65), for the colour difference ΔE76 (Euclidean in Lab).
function lab(hex) {
  const v = Number.parseInt(hex.slice(1), 16);
  const [r, g, b] = [(v >> 16) & 255, (v >> 8) & 255, v & 255].map((c) => {
    const x = c / 255;
    return x <= 0.04045 ? x / 12.92 : ((x + 0.055) / 1.055) ** 2.4;
  });
  const f = (t) => (t > 216 / 24389 ? Math.cbrt(t) : ((24389 / 27) * t + 16) / 116);
  const X = f((0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047);
  const Y = f(0.2126 * r + 0.7152 * g + 0.0722 * b);
  const Z = f((0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883);
  return [116 * Y - 16, 500 * (X - Y), 200 * (Y - Z)];
}

test("the 16 head colours are far apart, and none is too pale for a thin line on white", () => {
  assert.equal(PALETTE.length, 16);
  let closest = Infinity;
  for (let a = 0; a < PALETTE.length; a++) {
    for (let b = a + 1; b < PALETTE.length; b++) {
      closest = Math.min(closest, Math.hypot(...lab(PALETTE[a]).map((x, k) => x - lab(PALETTE[b])[k])));
    }
  }
  // A just-noticeable difference is ΔE76 ≈ 2.3; 15 keeps two heads apart as thin, translucent lines.
  assert.ok(closest >= 15, `closest pair ΔE76 ${closest.toFixed(1)}`);
  // Lightness L* <= 75: a line at full weight stands out from the white page (yellow #f0e442 has 89).
  for (const hex of PALETTE) assert.ok(lab(hex)[0] <= 75, `${hex} L* ${lab(hex)[0].toFixed(0)}`);
});

test("heads past 16 repeat a colour with a dash: (colour, dash) is unique up to 64 heads", () => {
  assert.deepEqual(headStyle(0), { color: PALETTE[0], dash: "" });
  assert.deepEqual(headStyle(17), { color: PALETTE[1], dash: headStyle(16).dash });
  assert.notEqual(headStyle(16).dash, "");
  const styles = Array.from({ length: DISTINCT_STYLES }, (_, h) => JSON.stringify(headStyle(h)));
  assert.equal(new Set(styles).size, 64);
  assert.equal(DISTINCT_STYLES, 64);
});

test("the pair filter keeps exactly the lines from one segment to the other", () => {
  const segments = [0, 0, 0, 1, 1];
  const pairs = (name) => {
    const keep = pairFilter(name, segments);
    const kept = [];
    for (let i = 0; i < 5; i++) for (let j = 0; j < 5; j++) if (keep(i, j)) kept.push(`${i}${j}`);
    return kept;
  };
  assert.deepEqual(pairs("ab"), ["03", "04", "13", "14", "23", "24"]);
  assert.deepEqual(pairs("ba"), ["30", "31", "32", "40", "41", "42"]);
  assert.deepEqual(pairs("bb"), ["33", "34", "43", "44"]);
  assert.equal(pairs("aa").length, 9);
  assert.equal(pairs("all").length, 25);
  assert.equal(pairs("__proto__").length, 25); // not a filter: every line
  assert.equal(pairFilter("ab", undefined)(0, 1), false); // no segments: one sentence, no B
});

test("lines: weight at or above the threshold, never NaN, nothing ahead of a causal query", () => {
  const n = 3;
  // Binary fractions, exact in float32: 2^-7 < 0.01 < 2^-6.
  const values = Float32Array.from([0.5, 0.5, 0, 0.0078125, 0.015625, 0.9765625, Number.NaN, 0.25, 0.75]);
  const { lines, cut } = collectLines([{ h: 4, values }], { n, threshold: lineThreshold(n) });
  assert.equal(lineThreshold(n), 0.01);
  assert.deepEqual(
    lines.map(({ h, i, j }) => [h, i, j]),
    [[4, 0, 0], [4, 0, 1], [4, 1, 1], [4, 1, 2], [4, 2, 1], [4, 2, 2]],
  );
  assert.equal(cut, null);
  const causal = collectLines([{ h: 4, values }], { n, causal: true, threshold: 0.01 }).lines;
  assert.ok(causal.every(({ i, j }) => j <= i) && causal.length === 4);
  const kept = collectLines([{ h: 0, values }], { n, threshold: 0.01, keep: (i, j) => i !== j }).lines;
  assert.deepEqual(kept.map(({ i, j }) => `${i}${j}`), ["01", "12", "21"]);
});

test("the budget keeps the strongest lines in drawing order and says where it cut", () => {
  const n = 2;
  const heads = [
    { h: 0, values: [0.6, 0.4, 0.3, 0.7] },
    { h: 1, values: [0.9, 0.1, 0.5, 0.5] },
  ];
  const { lines, cut } = collectLines(heads, { n, budget: 3 });
  assert.deepEqual(lines.map(({ h, i, j, w }) => [h, i, j, w]), [[0, 1, 1, 0.7], [1, 0, 0, 0.9], [0, 0, 0, 0.6]].sort(
    (a, b) => a[0] - b[0] || a[1] - b[1] || a[2] - b[2],
  ));
  assert.equal(cut, 0.6);
  // Ties at the cut: the earlier head, query and key win, as drawn.
  const tied = collectLines(heads, { n, budget: 4 });
  assert.deepEqual(tied.lines.filter(({ w }) => w === 0.5).map(({ i, j }) => `${i}${j}`), ["10"]);
  assert.equal(tied.cut, 0.5);
});

test("a line reads as head, tokens and value; 8-bit values say they are approximate", () => {
  const tokens = ["the", "animal", "it"];
  assert.equal(lineText({ layer: 2, h: 3, i: 2, j: 1, w: 0.41234 }, tokens), "L2 H3: 'it' → 'animal' 0.412");
  const approximate = lineText({ layer: 0, h: 1, i: 0, j: 0, w: 1 }, tokens, { exact: false });
  assert.equal(approximate, "L0 H1: 'the' → 'the' ≈1.000");
  assert.equal(lineText({ layer: 1, h: "mean", i: 0, j: 2, w: 0.05 }, tokens), "L1 mean: 'the' → 'it' 0.050");
});

test("swatches group the query heads by their KV head", () => {
  assert.deepEqual(swatchGroups({ heads: 4, kvHeads: 2 }), [
    { label: "kv 0", heads: [0, 1] },
    { label: "kv 1", heads: [2, 3] },
  ]);
  assert.deepEqual(swatchGroups({ heads: 3, kvHeads: 3 }), [{ label: "", heads: [0, 1, 2] }]);
  assert.deepEqual(swatchGroups({ heads: 2, kvHeads: undefined }), [{ label: "", heads: [0, 1] }]);
});

test("a swatch press hides or shows its head; 'only' isolates it, and again shows all", () => {
  let hidden = toggleHead(new Set(), 1, 4);
  assert.deepEqual([...hidden], [1]);
  hidden = toggleHead(hidden, 1, 4);
  assert.deepEqual([...hidden], []);
  hidden = toggleHead(hidden, 2, 4, { only: true });
  assert.deepEqual([...hidden].sort(), [0, 1, 3]);
  hidden = toggleHead(hidden, 0, 4, { only: true }); // another head alone
  assert.deepEqual([...hidden].sort(), [1, 2, 3]);
  assert.deepEqual([...toggleHead(hidden, 0, 4, { only: true })], []); // the lone head again: all
});

test("lines and pairs travel in the URL only when set; malformed values fall back", () => {
  assert.equal(encodeState(DEFAULT_STATE).includes("lines"), false);
  const state = { ...DEFAULT_STATE, lines: "layer", pairs: "ba" };
  assert.deepEqual(readState(`?${encodeState(state)}`), state);
  for (const search of ["?lines=all&pairs=__proto__", "?lines=&pairs=AB", "?lines=layers&pairs=toString"]) {
    const { lines, pairs } = readState(search);
    assert.deepEqual({ lines, pairs }, { lines: "head", pairs: "all" }, search);
  }
});
