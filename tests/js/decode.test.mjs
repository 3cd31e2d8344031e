// static/js/decode.js against buffers app/compact.py made (tests/js/fixtures, kept current by
// tests/js/test_js_fixtures.py). Run: node --test tests/js/

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { CompactDecodeError, decodeCompact, unshuffleFloat32 } from "../../static/js/decode.js";

const FIXTURES = new URL("./fixtures/", import.meta.url);
const expected = JSON.parse(readFileSync(new URL("expected.json", FIXTURES), "utf8"));
const { quant8, quant8_mean_of_3: quant8MeanOf3 } = expected.tolerances;

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
