// app/static/js/decode.js against buffers app/compact.py made (tests/js/fixtures, kept current by
// tests/js/test_js_fixtures.py). Run: node --test tests/js/

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { CompactDecodeError, decodeCompact, styledApart, unshuffleFloat32 } from "../../app/static/js/decode.js";

const FIXTURES = new URL("./fixtures/", import.meta.url);
const expected = JSON.parse(readFileSync(new URL("expected.json", FIXTURES), "utf8"));
const { quant8, quant8_mean_of_3: quant8MeanOf3, quant6 } = expected.tolerances;

/** A fixture as the ArrayBuffer fetch() gives the page (its own buffer, offset 0). */
function load(name) {
  const bytes = readFileSync(new URL(name, FIXTURES));
  return bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength);
}

function maxDiff(got, want) {
  let worst = 0;
  for (let k = 0; k < want.length; k++) worst = Math.max(worst, Math.abs(got[k] - want[k]));
  return worst;
}

const flat = (rows) => rows.flat();

test("every 8-bit scheme decodes within the stated bound, whatever its order", () => {
  for (const name of ["pair-row-max-uint8.hsa1", "pair-abs-uint8.hsa1", "pair-abs-uint8-key-major.hsa1"]) {
    const a = decodeCompact(load(name));
    const source = expected.sources.pair;
    assert.equal(a.exact, false, name);
    assert.equal(a.maxAbsError, 1 / 510, name);
    for (let l = 0; l < a.layers; l++) {
      for (let h = 0; h < a.heads; h++) {
        const diff = maxDiff(a.headInto(l, h), flat(source[l][h]));
        assert.ok(diff <= quant8, `${name} L${l} H${h}: ${diff} > ${quant8}`);
      }
    }
  }
});

test("fewer bits: q counts 2**bits - 1 levels, within the header's wider bound", () => {
  const name = "pair-abs-uint8-key-major-6bit.hsa1";
  const a = decodeCompact(load(name));
  const source = expected.sources.pair;
  assert.equal(a.bits, 6);
  assert.equal(a.maxAbsError, 1 / 126);
  let worst = 0;
  for (let l = 0; l < a.layers; l++) {
    for (let h = 0; h < a.heads; h++) worst = Math.max(worst, maxDiff(a.headInto(l, h), flat(source[l][h])));
  }
  assert.ok(worst <= quant6, `${worst} > ${quant6}`);
  // Read as 255 levels it would be off by a factor 4: the bound is only met through header.bits.
  assert.ok(worst > quant8, `6-bit values within the 8-bit bound (${worst}): the fixture tests nothing`);
});

test("a header's bits outside 2..8 is refused", () => {
  const bytes = new Uint8Array(load("pair-abs-uint8-key-major-6bit.hsa1"));
  const length = new DataView(bytes.buffer).getUint32(4, true);
  const text = new TextDecoder().decode(bytes.subarray(8, 8 + length));
  for (const bad of ["9", "0", "1"]) {
    const edited = new TextEncoder().encode(text.replace('"bits": 6', `"bits": ${bad}`));
    assert.equal(edited.length, length, bad);
    const copy = bytes.slice();
    copy.set(edited, 8);
    assert.throws(() => decodeCompact(copy.buffer), CompactDecodeError, bad);
  }
});

test("key-major holds the same bytes as query-major, transposed", () => {
  const rows = decodeCompact(load("pair-abs-uint8.hsa1"));
  const columns = decodeCompact(load("pair-abs-uint8-key-major.hsa1"));
  assert.equal(rows.keyMajor, false);
  assert.equal(columns.keyMajor, true);
  assert.equal(columns.scheme, "abs-uint8-key-major");
  for (let l = 0; l < rows.layers; l++) {
    for (let h = 0; h < rows.heads; h++) assert.deepEqual(columns.headInto(l, h), rows.headInto(l, h));
    assert.deepEqual(columns.meanInto(l), rows.meanInto(l));
  }
});

test("header fields: tokens verbatim, segments, boundary, causal", () => {
  const a = decodeCompact(load("pair-row-max-uint8.hsa1"));
  assert.deepEqual(a.tokens, ["[CLS]", "<b>", "é", '"', "\\", "😀"]);
  assert.deepEqual([a.layers, a.heads, a.n, a.causal, a.truncated, a.model], [2, 3, 6, false, false, "fixture"]);
  assert.equal(a.boundary, 4); // the first token of the pair
  assert.deepEqual(a.special, [true, false, false, false, false, false]);
  const single = decodeCompact(load("causal-abs-uint8-key-major.hsa1"));
  assert.equal(single.boundary, -1);
  assert.equal(single.causal, true);
});

test("[UNK] is styled apart as the special tokens are, though not special; a header without marks has none", () => {
  assert.deepEqual(styledApart([true, false, false, true], [false, true, false, false], 4), [true, true, false, true]);
  assert.deepEqual(styledApart([true, false], undefined, 2), [true, false]); // an answer from before `unknown`
  assert.deepEqual(styledApart(undefined, undefined, 2), [false, false]);
});

test("a causal model's masked cells decode to exactly 0", () => {
  const a = decodeCompact(load("causal-abs-uint8-key-major.hsa1"));
  const n = a.n;
  for (let l = 0; l < a.layers; l++) {
    for (let h = 0; h < a.heads; h++) {
      const values = a.headInto(l, h);
      for (let i = 0; i < n; i++) for (let j = i + 1; j < n; j++) assert.equal(values[i * n + j], 0);
      assert.ok(maxDiff(values, flat(expected.sources.causal[l][h])) <= quant8);
    }
  }
});

test("the layer mean is the mean of the heads, within the bound", () => {
  const a = decodeCompact(load("pair-row-max-uint8.hsa1"));
  const source = expected.sources.pair;
  for (let l = 0; l < a.layers; l++) {
    const want = flat(source[l][0]).map((_, k) => source[l].reduce((sum, head) => sum + flat(head)[k], 0) / a.heads);
    const diff = maxDiff(a.meanInto(l), want);
    assert.ok(diff <= quant8MeanOf3, `L${l}: ${diff}`);
  }
});

test("float32-shuffled is the model's values exactly", () => {
  const a = decodeCompact(load("head-float32-shuffled.hsa1"));
  assert.equal(a.exact, true);
  assert.equal(a.maxAbsError, 0);
  assert.deepEqual([a.layers, a.heads, a.header.layer, a.header.head], [1, 1, 1, 2]);
  // JSON carries each float32 exactly (as a double): equality, not closeness.
  assert.deepEqual(Array.from(a.headInto(0, 0)), flat(expected.sources.head[0][0]));
  assert.throws(() => a.headInto(0, 1), RangeError);
});

test("unshuffleFloat32 regroups byte planes", () => {
  const values = new Float32Array([1, 0.5, 2 ** -20, 0.1]);
  const bytes = new Uint8Array(values.buffer);
  const planes = new Uint8Array(16);
  for (let k = 0; k < 4; k++) for (let i = 0; i < 4; i++) planes[k * 4 + i] = bytes[4 * i + k];
  assert.deepEqual(Array.from(planes.subarray(12)), [0x3f, 0x3f, 0x35, 0x3d]); // the sign-and-exponent plane
  assert.deepEqual(unshuffleFloat32(planes, 4), values);
});

test("damaged buffers fail with the values that are wrong", () => {
  const good = new Uint8Array(load("pair-abs-uint8.hsa1"));
  const cases = [
    [new Uint8Array([...new TextEncoder().encode("XXXX"), ...good.subarray(4)]), /bad magic "XXXX", expected "HSA1"/],
    [good.slice(0, -3), new RegExp(`buffer is ${good.length - 3} bytes, expected ${good.length} for L=2 H=3 n=6 \\(abs-uint8\\)`)],
    [good.slice(0, 6), /buffer of 6 bytes is too short/],
    [good.slice(0, 40), /header length \d+ exceeds buffer of 40 bytes/],
    [swap(good, '"abs-uint8"', '"abs-uint9"'), /unknown scheme "abs-uint9"/],
    [swap(good, '"abs-uint8"', '"toString" '), /unknown scheme "toString"/],
    [swap(new Uint8Array(load("pair-abs-uint8-key-major.hsa1")), '"key-major"', '"key-minor"'), /order "key-minor" does not match scheme "abs-uint8-key-major"/],
    [swap(good, '"query-major"', '"key-major"  '), /order "key-major" does not match scheme "abs-uint8"/],
    [swap(good, '"n": 6', '"n": 7'), /header has 6 tokens for n=7/],
    [swap(good, '"n": 6', '"n":-1'), /header n=-1 is not a count/],
  ];
  for (const [bytes, message] of cases) {
    const buffer = bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength);
    assert.throws(() => decodeCompact(buffer), (error) => error instanceof CompactDecodeError && message.test(error.message));
  }
  assert.throws(() => decodeCompact(good), /expected an ArrayBuffer/); // a view is not the buffer fetch gives
});

/** The buffer with `from` replaced by `to` (same length, so the header length stays right). */
function swap(bytes, from, to) {
  assert.equal(from.length, to.length);
  const text = new TextDecoder("latin1").decode(bytes);
  const at = text.indexOf(from);
  assert.ok(at > 0, `${from} not in the buffer`);
  const out = bytes.slice();
  out.set(new TextEncoder().encode(to), at);
  return out;
}

// -- an encoder-decoder's buffer: three sections ----------------------------------------------------------

const SEQ2SEQ = ["seq2seq-row-max-uint8.hsa1", "seq2seq-abs-uint8-key-major.hsa1", "seq2seq-float32-shuffled.hsa1"];

test("seq2seq: the encoder is returned and holds all three sections, each within its bound", () => {
  for (const name of SEQ2SEQ) {
    const encoder = decodeCompact(load(name));
    assert.equal(encoder.architecture, "encoder-decoder", name);
    assert.equal(encoder.sections.encoder, encoder, name);
    assert.deepEqual(Object.keys(encoder.sections), ["encoder", "decoder", "cross"]);
    const bound = encoder.exact ? 0 : quant8;
    for (const [kind, source] of Object.entries(expected.sources.seq2seq)) {
      const a = encoder.sections[kind];
      assert.equal(a.kind, kind);
      assert.equal(a.sections, encoder.sections);
      assert.deepEqual([a.layers, a.heads, a.rows, a.cols], [source.length, source[0].length, source[0][0].length, source[0][0][0].length]);
      assert.equal(a.n, a.rows);
      for (let l = 0; l < a.layers; l++) {
        for (let h = 0; h < a.heads; h++) {
          const diff = maxDiff(a.headInto(l, h), flat(source[l][h]));
          assert.ok(diff <= bound, `${name} ${kind} L${l} H${h}: ${diff} > ${bound}`);
          assert.equal(a.headInto(l, h).length, a.rows * a.cols);
        }
      }
    }
  }
});

test("seq2seq: queries and keys are the target's and the source's tokens, section by section", () => {
  const { encoder, decoder, cross } = decodeCompact(load("seq2seq-row-max-uint8.hsa1")).sections;
  const source = ["[CLS]", "<b>", "é", '"', "\\"];
  const target = ["<pad>", "▁é", "</s>"];
  assert.deepEqual([encoder.queryTokens, encoder.keyTokens, encoder.tokens], [source, source, source]);
  assert.deepEqual([decoder.queryTokens, decoder.keyTokens, decoder.tokens], [target, target, target]);
  assert.deepEqual([cross.queryTokens, cross.keyTokens, cross.tokens], [target, source, target]);
  assert.deepEqual(cross.querySpecial, [true, false, true]);
  assert.deepEqual(cross.keySpecial, [true, false, false, false, false]);
  assert.deepEqual([encoder.causal, decoder.causal, cross.causal], [false, true, false]);
  // The target was cut and the model wrote its last 2 tokens; the source is as given.
  assert.deepEqual([encoder.truncated, decoder.truncated, cross.truncated], [false, true, true]);
  assert.deepEqual([encoder.generated, decoder.generated, cross.generated], [0, 2, 2]);
  assert.deepEqual([decoder.prompt, cross.prompt], [1, 1]);
  assert.deepEqual([encoder.rows, encoder.cols, decoder.rows, decoder.cols, cross.rows, cross.cols], [5, 5, 3, 3, 3, 5]);
  assert.deepEqual(cross.segments, [0, 0, 0]);
});

test("seq2seq: a cross head's layer mean and key-major storage agree with the query-major one", () => {
  const rows = decodeCompact(load("seq2seq-row-max-uint8.hsa1")).sections.cross;
  const columns = decodeCompact(load("seq2seq-abs-uint8-key-major.hsa1")).sections.cross;
  assert.equal(columns.keyMajor, true);
  const source = expected.sources.seq2seq.cross;
  for (let l = 0; l < rows.layers; l++) {
    // one head per layer here: the mean is that head
    assert.ok(maxDiff(columns.meanInto(l), flat(source[l][0])) <= quant8);
    assert.ok(maxDiff(rows.meanInto(l), flat(source[l][0])) <= quant8);
  }
  const decoder = decodeCompact(load("seq2seq-abs-uint8-key-major.hsa1")).sections.decoder;
  const m = decoder.rows;
  for (let l = 0; l < decoder.layers; l++) {
    const values = decoder.headInto(l, 0);
    for (let i = 0; i < m; i++) for (let j = i + 1; j < m; j++) assert.equal(values[i * m + j], 0);
  }
});

test("every Attention says its kind and shape; a plain buffer is one square 'self'", () => {
  const a = decodeCompact(load("pair-row-max-uint8.hsa1"));
  assert.deepEqual([a.kind, a.rows, a.cols, a.sections, a.architecture], ["self", 6, 6, null, null]);
  assert.equal(a.queryTokens, a.tokens);
  assert.equal(a.keyTokens, a.tokens);
  assert.deepEqual(a.keySpecial, a.special);
});

test("damaged seq2seq buffers fail with the values that are wrong", () => {
  const good = new Uint8Array(load("seq2seq-row-max-uint8.hsa1"));
  const cases = [
    [good.slice(0, -1), new RegExp(`buffer is ${good.length - 1} bytes, expected ${good.length} for cross`)],
    [new Uint8Array([...good, 0, 0, 0, 0]), new RegExp(`buffer is ${good.length + 4} bytes, its sections end at ${good.length}`)],
    [swap(good, '"kind": "cross"', '"kind": "crosx"'), /section kind "crosx" is unknown or repeated/],
    [swap(good, '"kind": "decoder"', '"kind":"encoder" '), /section kind "encoder" is unknown or repeated/],
    [swap(good, '"rows": 3, "cols": 5', '"rows": 3, "cols": 4'), /cross section is 3 x 4, its tokens say 3 x 5/],
    [swap(good, '"target_tokens"', '"target_tokenz"'), /header has sections but no target_tokens/],
  ];
  for (const [bytes, message] of cases) {
    const buffer = bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength);
    assert.throws(() => decodeCompact(buffer), (error) => error instanceof CompactDecodeError && message.test(error.message));
  }
});

test("seq2seq: one head is one section of its kind, exact", () => {
  const a = decodeCompact(load("seq2seq-head-cross.hsa1"));
  assert.deepEqual([a.kind, a.layers, a.heads, a.rows, a.cols, a.exact], ["cross", 1, 1, 3, 5, true]);
  assert.deepEqual(Object.keys(a.sections), ["cross"]);
  assert.deepEqual([a.header.layer, a.header.head], [2, 0]);
  // JSON carries each float32 exactly (as a double): equality, not closeness.
  assert.deepEqual(Array.from(a.headInto(0, 0)), flat(expected.sources.seq2seq.cross[2][0]));
});
