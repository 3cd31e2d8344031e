// app/static/js/compare.js: the ranking of heads by change and B's input. Run: node --test tests/js/

import assert from "node:assert/strict";
import { test } from "node:test";

import { queryB, rankHeads } from "../../app/static/js/compare.js";

const order = (ranked) => ranked.map(({ layer, head }) => `${layer}:${head}`);

test("heads are ranked by change score, largest first", () => {
  const ranked = rankHeads([
    [0.1, 0.5, 0.2],
    [0.4, 0.05, 0.3],
  ]);
  assert.deepEqual(order(ranked), ["0:1", "1:0", "1:2", "0:2", "0:0", "1:1"]);
  assert.deepEqual(ranked[0], { layer: 0, head: 1, score: 0.5 });
});

test("ties keep model order: layer, then head", () => {
  const ranked = rankHeads([
    [0.2, 0.3, 0.2],
    [0.3, 0.2, 0.3],
  ]);
  assert.deepEqual(order(ranked), ["0:1", "1:0", "1:2", "0:0", "0:2", "1:1"]);
  assert.deepEqual(order(rankHeads([[0, 0], [0, 0]])), ["0:0", "0:1", "1:0", "1:1"]);
});

test("a missing score (NaN, null) goes last instead of scrambling the order", () => {
  const ranked = rankHeads([
    [Number.NaN, 0.1],
    [0.3, null],
  ]);
  assert.deepEqual(order(ranked), ["1:0", "0:1", "0:0", "1:1"]);
});

test("ranking does not change the scores it was given", () => {
  const score = [[0.1, 0.2]];
  rankHeads(score);
  assert.deepEqual(score, [[0.1, 0.2]]);
  assert.deepEqual(rankHeads([]), []);
});

test("B is its own sentence, or A's input (pair included) when B's text is blank; continued as A is", () => {
  const a = { text: "The cat sat.", pair: "It slept.", model: "m1", words: true, newTokens: 3, chat: true };
  const common = { words: true, newTokens: 3, chat: true };
  assert.deepEqual(queryB(a, { btext: "The dog sat.", bmodel: "" }), { text: "The dog sat.", pair: "", model: "m1", ...common });
  assert.deepEqual(queryB(a, { btext: "  \n", bmodel: "m2" }), { text: "The cat sat.", pair: "It slept.", model: "m2", ...common });
  assert.deepEqual(queryB({ ...a, words: false }, { btext: "", bmodel: "" }).words, false);
});
