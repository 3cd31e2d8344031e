// The page's encoder-decoder parts that need no browser: sections and axes (seq2seq.js), request bodies,
// rectangular heads in the cell cursor's keys and words, thumbnails, token lines, colour scales and "hide
// first token". The Attention here is made by hand to the decoded shape (decode.js: kind, rows, cols,
// queryTokens, keyTokens, headInto giving rows*cols row-major values). Run: node --test tests/js/

import assert from "node:assert/strict";
import { test } from "node:test";

import { body, flatRows, kindBody } from "../../app/static/js/api.js";
import { withoutFirstToken } from "../../app/static/js/decoder.js";
import { paintThumbnail } from "../../app/static/js/grid.js";
import { cellKey, cellText } from "../../app/static/js/keys.js";
import { collectLines, lineText } from "../../app/static/js/lines.js";
import { rowScaled, scaleValues } from "../../app/static/js/scale.js";
import {
  axesOf,
  axisNames,
  isRectangular,
  isSeq2seq,
  rolloutNote,
  sectionOf,
  seq2seqSummary,
  seq2seqTruncation,
  shapeOf,
} from "../../app/static/js/seq2seq.js";

const SOURCE = ["▁The", "▁house", "▁is", "▁wonderful", ".", "</s>"]; // n = 6
const TARGET = ["<pad>", "▁Das", "▁Haus", "▁ist"]; // m = 4: the decoder start token, then the target

/** A hand-made section: [layers][heads] matrices of rows x cols, as decode.js's Attention answers them. */
class Section {
  constructor(kind, { layers, heads, queryTokens, keyTokens, matrices, causal = false }) {
    Object.assign(this, { kind, layers, heads, queryTokens, keyTokens, matrices, causal });
    this.rows = queryTokens.length;
    this.cols = keyTokens.length;
    this.n = this.rows;
    this.tokens = queryTokens;
    this.querySpecial = queryTokens.map((t) => t.startsWith("<"));
    this.keySpecial = keyTokens.map((t) => t.startsWith("<"));
  }

  headInto(layer, head, out = new Float32Array(this.rows * this.cols)) {
    out.set(this.matrices[layer][head]);
    return out;
  }
}

/** m x n cross weights: each target row peaks on the source token it translates (a diagonal alignment). */
function alignment(m, n, peak = 0.7) {
  const out = new Float32Array(m * n);
  for (let i = 0; i < m; i++) {
    for (let j = 0; j < n; j++) out[i * n + j] = (1 - peak) / (n - 1);
    out[i * n + Math.min(i, n - 1)] = peak;
  }
  return out;
}

function fullAnswer({ generated = 0 } = {}) {
  const square = (tokens) => new Float32Array(tokens.length * tokens.length).fill(1 / tokens.length);
  const encoder = new Section("encoder", { layers: 2, heads: 4, queryTokens: SOURCE, keyTokens: SOURCE, matrices: [[square(SOURCE)]] });
  const decoder = new Section("decoder", { layers: 3, heads: 4, queryTokens: TARGET, keyTokens: TARGET, matrices: [[square(TARGET)]], causal: true });
  const cross = new Section("cross", { layers: 3, heads: 4, queryTokens: TARGET, keyTokens: SOURCE, matrices: [[alignment(4, 6)]] });
  // As decode.js has it: the decoder's and cross's rows are the target, whose last `generated` the model wrote.
  for (const section of [decoder, cross]) section.generated = generated;
  encoder.generated = 0;
  Object.assign(encoder, { architecture: "encoder-decoder", sections: { encoder, decoder, cross } });
  return encoder;
}

test("sections: the kind's Attention of a seq2seq answer, the answer itself otherwise", () => {
  const full = fullAnswer();
  assert.equal(isSeq2seq(full), true);
  assert.equal(sectionOf(full, "cross").kind, "cross");
  assert.equal(sectionOf(full, "encoder"), full);
  const plain = { n: 5, tokens: ["a"], kind: "self" };
  assert.equal(isSeq2seq(plain), false);
  assert.equal(sectionOf(plain, "cross"), plain); // an encoder's or a decoder's one attention, whatever the state says
  assert.equal(isSeq2seq({ architecture: "decoder" }), false);
  assert.equal(isSeq2seq(null), false);
});

test("shapes and axes: cross attention is target rows by source columns; square attention reads as before", () => {
  const cross = fullAnswer().sections.cross;
  assert.deepEqual(shapeOf(cross), { rows: 4, cols: 6 });
  assert.equal(isRectangular(cross), true);
  const axes = axesOf(cross);
  assert.deepEqual([axes.queryTokens, axes.keyTokens], [TARGET, SOURCE]);
  assert.deepEqual(axes.querySpecial, [true, false, false, false]);
  // An Attention decoded before sections existed has n and tokens only.
  const old = { n: 3, tokens: ["a", "b", "c"], special: [true, false, false] };
  assert.deepEqual(shapeOf(old), { rows: 3, cols: 3 });
  assert.equal(isRectangular(old), false);
  assert.deepEqual(axesOf(old), { queryTokens: old.tokens, keyTokens: old.tokens, querySpecial: old.special, keySpecial: old.special });
  assert.deepEqual(axisNames("cross"), { query: "target token (query)", key: "source token (key)" });
  assert.deepEqual(axisNames(undefined), { query: "query (attending)", key: "key (attended to)" });
});

test("the status line says what the model wrote; truncation names source and target", () => {
  assert.equal(
    seq2seqSummary(fullAnswer({ generated: 3 })),
    "6 source tokens → 4 target tokens (the model wrote 3 tokens) · encoder 2 layers × 4 heads, decoder 3 × 4",
  );
  assert.match(seq2seqSummary(fullAnswer({ generated: 1 })), /\(the model wrote 1 token\)/);
  assert.doesNotMatch(seq2seqSummary(fullAnswer()), /wrote/); // a forced target: nothing written
  const full = fullAnswer();
  assert.equal(seq2seqTruncation(full), "");
  full.truncated = true;
  full.sections.decoder.truncated = true;
  assert.equal(
    seq2seqTruncation(full),
    "Source truncated to 6 tokens, the most this model reads here. " +
      "Target truncated to 4 tokens, the most its decoder reads here: the rest was not forced.",
  );
  assert.equal(rolloutNote("encoder"), null);
  assert.match(rolloutNote("cross"), /encoder only/);
  assert.equal(rolloutNote("self"), null);
});

test("bodies: a target only when typed, the kind only for the head and insight routes", () => {
  const query = { text: "The house", pair: "", model: "t5", words: false };
  assert.deepEqual(body(query), { text: "The house", text_pair: null, model: "t5" }); // as before
  assert.deepEqual(body({ ...query, target: "   " }), body(query)); // blank: the model writes it
  assert.deepEqual(body({ ...query, target: "Das Haus" }), { ...body(query), target: "Das Haus" });
  const asked = { ...query, target: "Das Haus", kind: "cross" };
  assert.equal("kind" in body(asked), false); // the whole answer holds every kind
  assert.deepEqual(kindBody(asked), { ...body(asked), kind: "cross" });
  assert.deepEqual(kindBody(query), body(query)); // no kind for other models: their bodies stay as they were
});

test("a JSON m x n map flattens row-major with its own width", () => {
  assert.deepEqual([...flatRows([[0.1, 0.2, 0.7], [0.5, null, 0.5]])], [0.1, 0.2, 0.7, 0.5, Number.NaN, 0.5]);
  assert.deepEqual([...flatRows([])], []);
});

test("the cell cursor moves over m rows and n columns and reads both sentences", () => {
  const [m, n] = [4, 6];
  assert.deepEqual(cellKey({ i: 3, j: 5 }, "ArrowRight", false, m, n), { i: 3, j: 5 });
  assert.deepEqual(cellKey({ i: 3, j: 4 }, "ArrowDown", false, m, n), { i: 3, j: 4 });
  assert.deepEqual(cellKey({ i: 1, j: 0 }, "End", false, m, n), { i: 1, j: 5 });
  assert.deepEqual(cellKey({ i: 1, j: 2 }, "End", true, m, n), { i: 3, j: 5 });
  assert.deepEqual(cellKey({ i: 0, j: 2 }, "PageDown", false, m, n), { i: 3, j: 2 });
  assert.deepEqual(cellKey({ i: 0, j: 2 }, "End", false, 3), { i: 0, j: 2 }); // square: as before
  assert.equal(
    cellText({ tokens: ["<pad>", "Das", "Haus"], keyTokens: ["The", "house"], i: 2, j: 1, value: 0.73 }),
    "query 'Haus' (2) → key 'house' (1): 0.730",
  );
});

test("thumbnails stretch a rectangle: rows down, columns across", () => {
  // 2 x 4, one hot cell per row: row 0 at key 3, row 1 at key 0. A 4 x 4 image: 2 px a row, 1 px a key.
  const matrix = new Float32Array([0, 0, 0, 1, 1, 0, 0, 0]);
  const image = { width: 4, height: 4, data: new Uint8ClampedArray(64) };
  paintThumbnail(image, matrix, 2, false, 4);
  const rows = Array.from({ length: 4 }, (_, y) => Array.from({ length: 4 }, (_, x) => image.data[4 * (y * 4 + x)]));
  assert.deepEqual(rows[0], rows[1]); // one query row spans two pixel rows
  assert.deepEqual(rows[2], rows[3]);
  assert.notEqual(rows[0][3], rows[0][0]); // row 0's peak is the last key
  assert.equal(rows[0][0], rows[2][1]); // zero weights paint alike wherever they lie
  assert.equal(rows[0][3], rows[2][0]); // and so do the peaks
});

test("token lines of cross attention join target tokens (left) to source tokens (right)", () => {
  const cross = fullAnswer().sections.cross;
  const values = cross.headInto(0, 0);
  const { lines } = collectLines([{ h: 0, values }], { n: 4, cols: 6, threshold: 0.5 });
  assert.deepEqual(lines.map(({ i, j }) => [i, j]), [[0, 0], [1, 1], [2, 2], [3, 3]]);
  // Every (query, key) pair is reachable: the last source columns exist past the target's rows.
  const all = collectLines([{ h: 0, values }], { n: 4, cols: 6 });
  assert.equal(all.lines.length, 24);
  assert.equal(Math.max(...all.lines.map((l) => l.j)), 5);
  const text = lineText({ layer: 1, ...lines[2] }, ["<pad>", "Das", "Haus", "ist"], { keyTokens: ["The", "house", "is"] });
  assert.equal(text, "L1 H0: 'Haus' → 'is' 0.700");
});

test("colour scales and 'hide first token' work row by row over n columns", () => {
  const values = new Float32Array([0.5, 0.25, 0.25, 0.1, 0.2, 0.7]); // 2 x 3
  const f = Math.fround; // the inputs as the Float32Array holds them; the division is the same float64 one
  assert.deepEqual([...rowScaled(values, 2, 3)], [1, 0.5, 0.5, f(0.1) / f(0.7), f(0.2) / f(0.7), 1]);
  assert.equal(scaleValues(values, 2, "row", 3).z.length, 6);
  const hidden = withoutFirstToken(values, 2, 3);
  assert.equal(hidden.length, 6);
  assert.ok(Number.isNaN(hidden[0]) && Number.isNaN(hidden[3]));
  // Row 0: 0.25 / (0.25 + 0.25) exactly; row 1: 0.2 / 0.9 and 0.7 / 0.9 sum to one.
  assert.equal(hidden[1], 0.5);
  assert.equal(hidden[2], 0.5);
  // float64 sums of two terms of float32 inputs: one rounding each, well under 1e-15.
  assert.ok(Math.abs(hidden[4] + hidden[5] - 1) < 1e-15);
});

test("a decoded seq2seq buffer (app/compact.py's fixture) goes through the same helpers", async () => {
  const { readFileSync } = await import("node:fs");
  const { decodeCompact } = await import("../../app/static/js/decode.js");
  const fixtures = new URL("./fixtures/", import.meta.url);
  const bytes = readFileSync(new URL("seq2seq-float32-shuffled.hsa1", fixtures));
  const full = decodeCompact(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
  const want = JSON.parse(readFileSync(new URL("expected.json", fixtures), "utf8")).sources.seq2seq.cross;
  assert.equal(isSeq2seq(full), true);
  const cross = sectionOf(full, "cross");
  const { rows, cols } = shapeOf(cross);
  assert.deepEqual([rows, cols], [want[0][0].length, want[0][0][0].length]);
  assert.deepEqual(axesOf(cross).keyTokens, full.tokens); // keys: the source
  assert.equal(isRectangular(cross), true);
  // The detail's cell (query i, key j) of layer 2 head 0 is the model's value (exact scheme: the same float32).
  const values = cross.headInto(2, 0);
  assert.equal(values[1 * cols + 1], Math.fround(want[2][0][1][1]));
  assert.match(seq2seqSummary(full), /^5 source tokens → 3 target tokens/);
});

test("export files of an encoder-decoder name the kind, so the three kinds of one head never collide", async () => {
  const { fileModel } = await import("../../app/static/js/seq2seq.js");
  const { headJsonName } = await import("../../app/static/js/labels.js");
  const cross = { ...fullAnswer().sections.cross, model: "t5-tiny", architecture: "encoder-decoder" };
  assert.equal(headJsonName(fileModel(cross), 2, 1), "headscope-t5-tiny-cross-L2-H1.json");
  assert.equal(fileModel({ model: "bert", kind: "self", architecture: null }), "bert");
});
