// Decoder for the compact transport (docs/design.md, "POST /api/attention/compact"):
//   "HSA1" | uint32 LE header length h | UTF-8 JSON header | zero pad to 4 | payload
// The header's quantization.scheme says what the payload is:
//   row-max-uint8, abs-uint8, abs-uint8-key-major: float32 LE row scale [L, H, n] | uint8 q [L, H, n, n],
//     value = q / 255 * scale, q stored [query][key] or (order "key-major") [key][query];
//   float32-shuffled: float32 LE values [L, H, n, n], exact (max_abs_error 0), their bytes grouped by
//     significance: byte 0 of every value, then byte 1, 2, 3 (the shuffle filter of HDF5 and Blosc).
// Pure: no DOM, so Node's test runner imports it as the page does (tests/js/).

const MAGIC = "HSA1";
const LITTLE_ENDIAN = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;
// Each scheme's storage order (app/compact.py); the header states it too, and the two must agree.
const SCHEME_ORDER = Object.freeze({
  "row-max-uint8": "query-major",
  "abs-uint8": "query-major",
  "abs-uint8-key-major": "key-major",
  "float32-shuffled": "query-major",
});

export class CompactDecodeError extends Error {}

// A little-endian float32 run of the buffer; a view when the platform is little-endian too.
function float32s(buffer, view, offset, count) {
  if (LITTLE_ENDIAN) return new Float32Array(buffer, offset, count);
  const out = new Float32Array(count);
  for (let i = 0; i < count; i++) out[i] = view.getFloat32(offset + 4 * i, true);
  return out;
}

/** `count` float32 values from 4 byte planes (plane k holds byte k, little-endian, of every value). */
export function unshuffleFloat32(planes, count) {
  const bytes = new Uint8Array(4 * count);
  for (let k = 0; k < 4; k++) {
    const plane = planes.subarray(k * count, (k + 1) * count);
    for (let i = 0; i < count; i++) bytes[4 * i + k] = plane[i];
  }
  return float32s(bytes.buffer, new DataView(bytes.buffer), 0, count);
}

/** Parse an HSA1 buffer into an Attention. Throws CompactDecodeError with the offending values. */
export function decodeCompact(buffer) {
  if (!(buffer instanceof ArrayBuffer)) throw new CompactDecodeError("expected an ArrayBuffer");
  if (buffer.byteLength < 8) throw new CompactDecodeError(`buffer of ${buffer.byteLength} bytes is too short`);
  const bytes = new Uint8Array(buffer);
  const magic = String.fromCharCode(bytes[0], bytes[1], bytes[2], bytes[3]);
  if (magic !== MAGIC) throw new CompactDecodeError(`bad magic ${JSON.stringify(magic)}, expected "${MAGIC}"`);
  const view = new DataView(buffer);
  const headerLength = view.getUint32(4, true);
  if (8 + headerLength > buffer.byteLength) {
    throw new CompactDecodeError(`header length ${headerLength} exceeds buffer of ${buffer.byteLength} bytes`);
  }
  let header;
  try {
    header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + headerLength)));
  } catch (error) {
    throw new CompactDecodeError(`header is not JSON: ${error.message}`);
  }
  const { layers: L, heads: H, n } = header;
  for (const [name, v] of [["layers", L], ["heads", H], ["n", n]]) {
    if (!Number.isInteger(v) || v < 0) throw new CompactDecodeError(`header ${name}=${JSON.stringify(v)} is not a count`);
  }
  if (!Array.isArray(header.tokens) || header.tokens.length !== n) {
    throw new CompactDecodeError(`header has ${header.tokens?.length} tokens for n=${n}`);
  }
  const scheme = header.quantization?.scheme ?? "row-max-uint8";
  if (!Object.hasOwn(SCHEME_ORDER, scheme)) throw new CompactDecodeError(`unknown scheme ${JSON.stringify(scheme)}`);
  const order = SCHEME_ORDER[scheme];
  const stated = header.quantization?.order ?? order;
  if (stated !== order) {
    throw new CompactDecodeError(`order ${JSON.stringify(stated)} does not match scheme ${JSON.stringify(scheme)}`);
  }
  const exact = scheme === "float32-shuffled";
  const offset = Math.ceil((8 + headerLength) / 4) * 4;
  const rows = L * H * n;
  const expected = exact ? offset + 4 * rows * n : offset + 4 * rows + rows * n;
  if (buffer.byteLength !== expected) {
    throw new CompactDecodeError(
      `buffer is ${buffer.byteLength} bytes, expected ${expected} for L=${L} H=${H} n=${n} (${scheme})`,
    );
  }
  if (exact) return new Attention(header, { values: unshuffleFloat32(bytes.subarray(offset), rows * n), order });
  const scales = float32s(buffer, view, offset, rows);
  const q = new Uint8Array(buffer, offset + 4 * rows, rows * n);
  return new Attention(header, { scales, q, order });
}

/**
 * An [L, H, n, n] attention tensor as the transport holds it: uint8 with row scales, or float32 values
 * (`exact`). headInto/meanInto give n*n row-major [query][key] values whatever the stored order.
 */
export class Attention {
  constructor(header, { scales = null, q = null, values = null, order = "query-major" }) {
    this.header = header;
    this.tokens = header.tokens;
    this.segments = header.segments ?? new Array(header.n).fill(0);
    this.special = header.special ?? new Array(header.n).fill(false);
    this.layers = header.layers;
    this.heads = header.heads;
    this.kvHeads = header.kv_heads ?? header.heads; // query head h reads KV head h // (heads / kvHeads)
    this.n = header.n;
    this.causal = Boolean(header.causal);
    this.truncated = Boolean(header.truncated);
    this.generated = header.generated ?? 0; // the last `generated` tokens were written by the model
    this.byteLevel = header.byte_level !== false; // "Ġ" is a space byte (decoder.js displayToken)
    this.model = header.model;
    this.scheme = header.quantization?.scheme ?? "row-max-uint8";
    this.maxAbsError = header.quantization?.max_abs_error ?? 1 / 510;
    this.keyMajor = order === "key-major";
    this.scales = scales;
    this.q = q;
    this.values = values;
  }

  /** True when the values are the model's own float32, not quantized. */
  get exact() {
    return this.values !== null;
  }

  checkHead(layer, head) {
    if (!Number.isInteger(layer) || layer < 0 || layer >= this.layers) {
      throw new RangeError(`layer ${layer} is outside 0..${this.layers - 1}`);
    }
    if (!Number.isInteger(head) || head < 0 || head >= this.heads) {
      throw new RangeError(`head ${head} is outside 0..${this.heads - 1}`);
    }
  }

  /** out[i * n + j] (+)= weight * value of (layer, head) at query i, key j. */
  accumulate(layer, head, out, weight, add) {
    const n = this.n;
    const row0 = (layer * this.heads + head) * n; // first query row of this head
    const base = row0 * n;
    if (this.values) {
      const v = this.values;
      for (let k = 0; k < n * n; k++) out[k] = (add ? out[k] : 0) + weight * v[base + k];
      return out;
    }
    const q = this.q;
    const s = new Float64Array(n); // per query row: scale / 255 * weight
    for (let i = 0; i < n; i++) s[i] = (this.scales[row0 + i] / 255) * weight;
    if (this.keyMajor) {
      for (let j = 0; j < n; j++) {
        const src = base + j * n; // key j's column, over the queries
        for (let i = 0; i < n; i++) {
          const o = i * n + j;
          out[o] = (add ? out[o] : 0) + q[src + i] * s[i];
        }
      }
    } else {
      for (let i = 0; i < n; i++) {
        const src = base + i * n;
        const o = i * n;
        const si = s[i];
        for (let j = 0; j < n; j++) out[o + j] = (add ? out[o + j] : 0) + q[src + j] * si;
      }
    }
    return out;
  }

  /** One head's n*n values (row-major, query rows) written into `out` (allocated if omitted). */
  headInto(layer, head, out = new Float32Array(this.n * this.n)) {
    this.checkHead(layer, head);
    return this.accumulate(layer, head, out, 1, false);
  }

  /** Mean over the heads of one layer, n*n values. */
  meanInto(layer, out = new Float32Array(this.n * this.n)) {
    this.checkHead(layer, 0);
    out.fill(0);
    for (let h = 0; h < this.heads; h++) this.accumulate(layer, h, out, 1 / this.heads, true);
    return out;
  }

  /** Tokens of the prompt: the ones before those the model wrote. */
  get prompt() {
    return this.n - this.generated;
  }

  /** Index of the first token of the second segment, or -1 for a single sentence. */
  get boundary() {
    return this.segments.indexOf(1);
  }
}
