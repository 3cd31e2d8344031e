// app/static/js/weighting.js and the weight × value norm switch's pure parts: what every request of a run sends,
// what the colour bar, the cell cursor and the export files call the values, a cell's size. The state's
// URL form is in state.test.mjs. Run: node --test tests/js/

import assert from "node:assert/strict";
import { test } from "node:test";

import { body, compareBody, kindBody } from "../../app/static/js/api.js";
import { cellText } from "../../app/static/js/keys.js";
import { allHeadsName, exportName, headJsonName, tokenLinesName } from "../../app/static/js/labels.js";
import {
  DEFAULT_WEIGHTING,
  SINK_BY_WEIGHTING,
  WEIGHTINGS,
  cellSizes,
  parseWeighting,
  readsLine,
  valueName,
  weightingOf,
} from "../../app/static/js/weighting.js";

const query = { text: "The cat sat.", pair: "", model: "m", words: false };

test("every body of a norm run says weighting norm; weights, the API's default, are not sent", () => {
  assert.deepEqual(body(query), { text: "The cat sat.", text_pair: null, model: "m" }); // as before the switch
  assert.deepEqual(body({ ...query, weighting: "weight" }), body(query));
  assert.deepEqual(body({ ...query, weighting: "norm" }), { ...body(query), weighting: "norm" });
  assert.deepEqual(body({ ...query, words: true, weighting: "norm" }), { ...body(query), words: true, weighting: "norm" });
  // The head, statistics, rollout and flow bodies are kindBody's: it keeps the weighting beside the kind.
  assert.deepEqual(kindBody({ ...query, weighting: "norm" }), { ...body(query), weighting: "norm" });
  assert.deepEqual(kindBody({ ...query, weighting: "norm", kind: "encoder" }), { ...body(query), weighting: "norm", kind: "encoder" });
});

test("a comparison's weighting is the pair's, never either input's (the API forbids it there)", () => {
  const b = { ...query, text: "The dog sat." };
  const pair = compareBody({ ...query, weighting: "norm" }, b, false);
  assert.deepEqual(pair, { a: body(query), b: body(b), weighting: "norm" });
  assert.equal("weighting" in pair.a || "weighting" in pair.b, false);
  // B's own field (were it set) does not decide: A's query is the run's.
  assert.deepEqual(compareBody(query, { ...b, weighting: "norm" }, true), { a: body(query), b: body(b), words: true });
  assert.deepEqual(compareBody({ ...query, weighting: "norm", kind: "cross" }, b, true), {
    a: body(query),
    b: body(b),
    kind: "cross",
    words: true,
    weighting: "norm",
  });
});

test("a weighting is one of the API's two names; an answer without one holds weights", () => {
  assert.equal(DEFAULT_WEIGHTING, "weight");
  assert.deepEqual(Object.keys(WEIGHTINGS), ["weight", "norm"]);
  for (const odd of [undefined, null, "", "Norm", "__proto__", "constructor", 1]) assert.equal(parseWeighting(odd), "weight");
  assert.equal(parseWeighting("norm"), "norm");
  assert.equal(weightingOf({ header: { weighting: "norm" } }), "norm");
  assert.equal(weightingOf({ header: {} }), "weight"); // the service leaves the default out of headers
  assert.equal(weightingOf(null), "weight");
});

test("the colour bar names the values and, when quantized, their bits", () => {
  assert.equal(valueName("weight"), "attention");
  assert.equal(valueName("weight", { exact: false, bits: 7 }), "attention (7-bit)");
  assert.equal(valueName("norm"), "weight × norm (share)");
  assert.equal(valueName("norm", { exact: false, bits: 8 }), "weight × norm (share, 8-bit)");
});

test("a cell's size is its share times its row's total; gaps stay gaps, missing totals give none", () => {
  const shares = Float32Array.from([0.25, 0.75, Number.NaN, 1, 0.5, 0.5]); // 2 rows x 3 keys
  const sizes = cellSizes(shares, [4, 2], 2, 3);
  // float32 shares times float64 totals: exact here (powers of two), so equal, not close.
  assert.deepEqual([...sizes], [1, 3, Number.NaN, 2, 1, 1]);
  assert.equal(cellSizes(shares, null, 2, 3), null); // a words answer, or the grid's values: no totals
  assert.equal(cellSizes(shares, [4], 2, 3), null); // totals of another shape are not guessed at
  assert.equal(cellSizes(shares, [4, 2], 3, 2), null);
});

test("the cell cursor reads a norm cell as the hover does: share, then size", () => {
  const cell = { tokens: ["the", "cat"], i: 1, j: 0, value: 0.41234 };
  assert.equal(cellText(cell), "query 'cat' (1) → key 'the' (0): 0.412"); // weights: as before
  assert.equal(cellText({ ...cell, norm: true }), "query 'cat' (1) → key 'the' (0): share 0.412");
  assert.equal(cellText({ ...cell, norm: true, size: 1.3712 }), "query 'cat' (1) → key 'the' (0): share 0.412 · ‖α f‖ 1.37");
  assert.equal(cellText({ ...cell, norm: true, size: Number.NaN }), "query 'cat' (1) → key 'the' (0): share 0.412");
  assert.equal(cellText({ ...cell, size: 1.3712 }), "query 'cat' (1) → key 'the' (0): 0.412"); // a size is a norm's
  assert.match(cellText({ ...cell, norm: true, size: 2, renormalised: true, j: 1 }), /share 0\.412 · ‖α f‖ 2\.00 \(renormalised/);
});

test("exported files of norm shares say -norm in their names", () => {
  assert.equal(exportName("m", 2, 7, { weighting: "norm" }), "headscope-m-L2-H7-norm");
  assert.equal(exportName("m", 2, 7, { weighting: "weight" }), exportName("m", 2, 7)); // as before the switch
  assert.equal(headJsonName("m", 2, "mean", { weighting: "norm", words: true }), "headscope-m-L2-mean-norm-words.json");
  assert.equal(allHeadsName("m", { weighting: "norm" }), "headscope-m-all-heads-norm.json");
  assert.equal(tokenLinesName("m", 1, 3, { weighting: "norm" }), "headscope-m-L1-H3-norm-tokens.svg");
  assert.equal(tokenLinesName("m", 1, 3, { allHeads: true, weighting: "norm" }), "headscope-m-L1-all-heads-norm-tokens.svg");
});

test("the glossary says what a sink head looks like under each weighting, and which one the table reads", () => {
  assert.deepEqual(Object.keys(SINK_BY_WEIGHTING), Object.keys(WEIGHTINGS));
  assert.match(SINK_BY_WEIGHTING.weight, /busy/);
  assert.match(SINK_BY_WEIGHTING.weight, /\[CLS\], \[SEP\] or the first token/);
  assert.match(SINK_BY_WEIGHTING.norm, /quiet: those tokens' values are small/);
  // The example's figures are the ones tests/mha/test_norms.py measures.
  assert.match(SINK_BY_WEIGHTING.norm, /L2 H7 puts 0\.91 of its weight on \[CLS\] and \[SEP\].*but 0\.19 of its norm/);
  assert.match(readsLine("norm"), /read weight × value norm shares/);
  assert.match(readsLine("weight"), /read the attention weights/);
  assert.equal(readsLine("bogus"), readsLine("weight"));
});
