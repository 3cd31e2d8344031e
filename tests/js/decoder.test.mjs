// app/static/js/decoder.js and the labels of decoder runs: grouped-query heads, the first token hidden with the
// rows renormalised, the top-k of a row, written tokens. Run: node --test tests/js/

import assert from "node:assert/strict";
import { test } from "node:test";

import { body } from "../../app/static/js/api.js";
import { displayToken, isGrouped, kvGroup, kvGroups, markWritten, topK, withDisplayTokens, withoutFirstToken } from "../../app/static/js/decoder.js";
import { modelLabel, runSummary, selectionLabel, shortHeadLabel } from "../../app/static/js/labels.js";

const EPS64 = 2 ** -52; // float64 machine epsilon

test("a query head's KV group is h // (heads / kvHeads)", () => {
  assert.deepEqual([...Array(4).keys()].map((h) => kvGroup(h, 4, 2)), [0, 0, 1, 1]);
  assert.deepEqual([...Array(9).keys()].map((h) => kvGroup(h, 9, 3)), [0, 0, 0, 1, 1, 1, 2, 2, 2]);
  assert.deepEqual([...Array(4).keys()].map((h) => kvGroup(h, 4, 1)), [0, 0, 0, 0]); // multi-query
  assert.deepEqual([...Array(3).keys()].map((h) => kvGroup(h, 3, 3)), [0, 1, 2]); // no grouping
  assert.equal(kvGroup(5, 12, undefined), 5); // a header without kv_heads: each head its own
  assert.equal(kvGroup(5, 12, 5), 5); // not a divisor: no grouping rather than a wrong one
});

test("groups: consecutive heads per KV head, one per head without grouping", () => {
  assert.equal(isGrouped({ heads: 4, kvHeads: 2 }), true);
  assert.equal(isGrouped({ heads: 12, kvHeads: 12 }), false);
  assert.equal(isGrouped({ heads: 12, kvHeads: undefined }), false);
  assert.deepEqual(kvGroups({ heads: 4, kvHeads: 2 }), [
    { group: 0, first: 0, count: 2 },
    { group: 1, first: 2, count: 2 },
  ]);
  assert.deepEqual(kvGroups({ heads: 3, kvHeads: 3 }).map((g) => g.count), [1, 1, 1]);
});

test("head names carry the KV group only when heads share key/values", () => {
  const grouped = { heads: 8, kvHeads: 4 };
  assert.equal(selectionLabel(3, 5, grouped), "L3 H5 · kv 2");
  assert.equal(selectionLabel(3, "mean", grouped), "layer 3, mean of all heads");
  assert.equal(selectionLabel(3, 5, { heads: 8, kvHeads: 8 }), "layer 3, head 5"); // unchanged without grouping
  assert.equal(selectionLabel(3, 5), "layer 3, head 5");
  assert.equal(shortHeadLabel(1, 3, grouped), "L1 H3 · kv 1");
  assert.equal(shortHeadLabel(1, 3, { heads: 8, kvHeads: 8 }), "L1 H3");
  assert.equal(modelLabel({ name: "l", layers: 3, heads: 4, kv_heads: 2, causal: true }), "l — 3 layers × 4 heads over 2 KV heads (causal)");
  assert.equal(modelLabel({ name: "b", layers: 6, heads: 12, kv_heads: 12, causal: false }), "b — 6 layers × 12 heads");
});

test("hiding the first token renormalises each row over the rest", () => {
  // Dyadic weights: every sum and quotient below is exact in float64, so the results compare with ===.
  const n = 3;
  const values = Float32Array.from([1, 0, 0, 0.5, 0.5, 0, 0.5, 0.25, 0.25]);
  const out = withoutFirstToken(values, n);
  assert.ok(out instanceof Float64Array && out.length === n * n);
  assert.ok([0, 3, 6].every((k) => Number.isNaN(out[k]))); // column 0 is gone (a gap)
  assert.ok(Number.isNaN(out[1]) && Number.isNaN(out[2])); // a causal first row has nothing left: no row
  assert.deepEqual([...out.slice(4, 6)], [1, 0]);
  assert.deepEqual([...out.slice(7, 9)], [0.5, 0.5]);
  assert.deepEqual([...values], [1, 0, 0, 0.5, 0.5, 0, 0.5, 0.25, 0.25]); // the input is left alone
});

test("renormalised rows sum to 1 and keep their proportions", () => {
  const n = 5;
  const values = new Float32Array(n * n);
  for (let i = 0; i < n; i++) for (let j = 0; j < n; j++) values[i * n + j] = (1 + ((7 * i + 3 * j) % 11)) / 17;
  const out = withoutFirstToken(values, n);
  for (let i = 0; i < n; i++) {
    let sum = 0;
    for (let j = 1; j < n; j++) sum += out[i * n + j];
    // n - 1 quotients, each within half an ulp, then n - 2 float64 additions: (2n) eps64 bounds it.
    assert.ok(Math.abs(sum - 1) <= 2 * n * EPS64, `row ${i} sums to ${sum}`);
    // Proportions: out[j] / out[k] = v[j] / v[k], both sides within a few ulps (two roundings each).
    const ratio = out[i * n + 2] / out[i * n + 1];
    const expected = values[i * n + 2] / values[i * n + 1];
    assert.ok(Math.abs(ratio - expected) <= 4 * EPS64 * expected);
  }
});

test("top-k of a row: largest first, ties in token order, NaN skipped, within [from, to)", () => {
  const n = 4;
  const values = Float64Array.from([0.1, 0.4, 0.4, 0.1, Number.NaN, 0.2, 0.3, 0.5, 0, 0, 0, 0, 0, 0, 0, 0]);
  assert.deepEqual(topK(values, n, 0, 3), [
    { index: 1, weight: 0.4 },
    { index: 2, weight: 0.4 },
    { index: 0, weight: 0.1 },
  ]);
  assert.deepEqual(topK(values, n, 1, 5), [
    { index: 3, weight: 0.5 },
    { index: 2, weight: 0.3 },
    { index: 1, weight: 0.2 },
  ]);
  assert.deepEqual(topK(values, n, 1, 5, { to: 3 }).map((e) => e.index), [2, 1]); // the prompt only
  assert.deepEqual(topK(values, n, 0, 0), []);
});

test("written tokens: ✎ on the axes, readable text, the status line", () => {
  assert.deepEqual(markWritten(["<s>", "The", "Ġcat", "Ġsat"], 2), ["<s>", "The", "✎ Ġcat", "✎ Ġsat"]);
  assert.deepEqual(markWritten(["a", "b"], 0), ["a", "b"]);
  assert.equal(displayToken("Ġcat"), "␣cat");
  assert.equal(displayToken("▁cat"), "␣cat");
  assert.equal(displayToken("ĠĠĠ"), "␣␣␣"); // indentation: every mark is a space byte
  assert.equal(displayToken("ĊĊ"), "↵↵");
  assert.equal(displayToken("Ċĉx"), "↵⇥x");
  assert.equal(displayToken("✎ Ġsat"), "✎ ␣sat"); // after markWritten too
  assert.equal(displayToken(displayToken("Ġcat")), "␣cat"); // idempotent: views may apply it twice
  assert.equal(displayToken("<b>"), "<b>");
  assert.equal(displayToken("##ing"), "##ing"); // WordPiece tokens are shown as they are
  // Byte-level marks only for a byte-level tokenizer (the API's byte_level): a WordPiece "Ġ" is a letter.
  assert.equal(displayToken("Ġcat", true), "␣cat");
  assert.equal(displayToken("Ġcat", false), "Ġcat");
  assert.equal(displayToken("Ċĉ", false), "Ċĉ");
  assert.equal(displayToken("▁cat", false), "␣cat"); // SentencePiece's space mark is no byte
  assert.equal(displayToken("Ġcat", undefined), "␣cat"); // left out: as before the flag
  const plain = { n: 11, layers: 6, heads: 12, kvHeads: 12, generated: 0 };
  assert.equal(runSummary(plain), "11 tokens · 6 layers × 12 heads"); // as before decoders
  const continued = { n: 17, layers: 3, heads: 4, kvHeads: 2, generated: 5 };
  assert.equal(runSummary(continued, 5), "12 prompt tokens + 5 written · 3 layers × 4 heads (2 KV heads)");
  assert.equal(runSummary({ ...continued, generated: 2, n: 14 }, 5), "12 prompt tokens + 2 written (of 5 asked) · 3 layers × 4 heads (2 KV heads)");
  // A snapshot's grid pooled into blocks (header input_n): the input's tokens, then the blocks.
  const pooled = { ...plain, n: 128, header: { input_n: 512 } };
  assert.equal(runSummary(pooled), "512 tokens, pooled to 128 × 128 blocks · 6 layers × 12 heads");
});

test("max_new_tokens is sent only when a continuation is asked for", () => {
  assert.deepEqual(body({ text: "a", pair: "", model: "m", words: false }), { text: "a", text_pair: null, model: "m" });
  assert.deepEqual(body({ text: "a", pair: "", model: "m", words: false, newTokens: 0 }), { text: "a", text_pair: null, model: "m" });
  assert.deepEqual(body({ text: "a", pair: "", model: "m", words: true, newTokens: 4 }), {
    text: "a",
    text_pair: null,
    model: "m",
    max_new_tokens: 4,
    words: true,
  });
});

test("the JSON export gains display_tokens in front, the answer itself untouched", async () => {
  const answer = { model: "m", tokens: ["<s>", "Ġcat", "Ċ"], attention: [[[[1]]]] };
  const blob = new Blob([JSON.stringify(answer)]);
  const spelled = JSON.parse(await withDisplayTokens(blob, { tokens: answer.tokens, byteLevel: true }).text());
  assert.deepEqual(spelled, { display_tokens: ["<s>", "␣cat", "↵"], ...answer });
  assert.deepEqual(Object.keys(spelled)[0], "display_tokens");
  const wordPiece = JSON.parse(await withDisplayTokens(blob, { tokens: answer.tokens, byteLevel: false }).text());
  assert.deepEqual(wordPiece.display_tokens, answer.tokens);
});
