// Decoder for the compact transport (docs/design.md, "The HSA1 transport"):
//   "HSA1" | uint32 LE header length h | UTF-8 JSON header | zero pad to 4 | payload
// The header's quantization.scheme says what the payload is:
//   row-max-uint8, abs-uint8, abs-uint8-key-major: float32 LE row scale [L, H, n] | uint8 q [L, H, n, n],
//     value = q / levels * scale, levels = 2**bits - 1 (quantization.bits, 8 when absent: 255), q stored
//     [query][key] or (order "key-major") [key][query];
//   float32-shuffled: float32 LE values [L, H, n, n], exact (max_abs_error 0), their bytes grouped by
//     significance: byte 0 of every value, then byte 1, 2, 3 (the shuffle filter of HDF5 and Blosc).
// An encoder-decoder's buffer lists `sections` ({kind, layers, heads, rows, cols}: encoder n x n, decoder
// m x m, cross m x n, m = target_tokens.length) whose payloads follow in that order, in the one scheme, each
// read with [n, n] as [rows, cols] and starting 4-aligned; decodeCompact returns the encoder's, which
// holds all three as `.sections`. One head of an encoder-decoder (header `layer`, `head`, `kind`) is one
// section of that kind, returned as is.
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
  const bits = header.quantization?.bits ?? 8;
  if (!exact && !(Number.isInteger(bits) && bits >= 2 && bits <= 8)) {
    throw new CompactDecodeError(`quantization bits ${JSON.stringify(bits)} is not 2..8`);
  }
  const start = Math.ceil((8 + headerLength) / 4) * 4;
  if (header.sections === undefined) {
    const layout = { kind: "self", layers: L, heads: H, rows: n, cols: n };
    const end = start + sectionBytes(layout, exact);
    if (end !== buffer.byteLength) {
      throw new CompactDecodeError(
        `buffer is ${buffer.byteLength} bytes, expected ${end} for L=${L} H=${H} n=${n} (${scheme})`,
      );
    }
    return section(buffer, bytes, view, header, start, layout, exact, order)[0];
  }
  return decodeSections(buffer, bytes, view, header, start, exact, order);
}

// An encoder-decoder's buffer: the encoder, decoder and cross sections, in the header's order, each 4-aligned.
function decodeSections(buffer, bytes, view, header, start, exact, order) {
  if (!Array.isArray(header.sections)) throw new CompactDecodeError("header sections is not a list");
  const m = header.target_tokens?.length;
  if (!Array.isArray(header.target_tokens)) throw new CompactDecodeError("header has sections but no target_tokens");
  const want = { encoder: [header.n, header.n], decoder: [m, m], cross: [m, header.n] };
  const sections = {};
  let offset = start;
  for (const layout of header.sections) {
    const { kind, layers, heads, rows, cols } = layout ?? {};
    if (!Object.hasOwn(want, kind) || Object.hasOwn(sections, kind)) {
      throw new CompactDecodeError(`section kind ${JSON.stringify(kind)} is unknown or repeated`);
    }
    for (const [name, v] of [["layers", layers], ["heads", heads], ["rows", rows], ["cols", cols]]) {
      if (!Number.isInteger(v) || v < 0) throw new CompactDecodeError(`${kind} ${name}=${JSON.stringify(v)} is not a count`);
    }
    if (rows !== want[kind][0] || cols !== want[kind][1]) {
      throw new CompactDecodeError(`${kind} section is ${rows} x ${cols}, its tokens say ${want[kind].join(" x ")}`);
    }
    offset = Math.ceil(offset / 4) * 4;
    [sections[kind], offset] = section(buffer, bytes, view, header, offset, layout, exact, order);
  }
  const kinds = Object.keys(sections);
  // The whole answer has all three; one head (/api/attention/head/compact) the one asked for.
  if (kinds.length !== 3 && !(kinds.length === 1 && Number.isInteger(header.layer))) {
    throw new CompactDecodeError(`header lists sections ${JSON.stringify(kinds)}, expected encoder, decoder and cross`);
  }
  if (offset !== buffer.byteLength) {
    throw new CompactDecodeError(`buffer is ${buffer.byteLength} bytes, its sections end at ${offset}`);
  }
  const frozen = Object.freeze(sections);
  for (const attention of Object.values(sections)) {
    attention.sections = frozen;
    attention.architecture = header.architecture;
  }
  return sections.encoder ?? sections[kinds[0]];
}

// A section's payload: float32 values, or a float32 scale per query row and a byte per value.
function sectionBytes({ layers, heads, rows, cols }, exact) {
  const count = layers * heads * rows; // query rows
  return exact ? 4 * count * cols : 4 * count + count * cols;
}

// One section's Attention at `offset`, and the offset after it. Throws when the buffer ends before.
function section(buffer, bytes, view, header, offset, layout, exact, order) {
  const { layers, heads, rows, cols } = layout;
  const count = layers * heads * rows; // query rows
  const end = offset + sectionBytes(layout, exact);
  if (end > buffer.byteLength) {
    throw new CompactDecodeError(
      `buffer is ${buffer.byteLength} bytes, expected ${end} for ${layout.kind} L=${layers} H=${heads} ` +
        `${rows} x ${cols} (${header.quantization?.scheme ?? "row-max-uint8"})`,
    );
  }
  const shape = sectionShape(header, layout);
  if (exact) {
    const values = unshuffleFloat32(bytes.subarray(offset, end), count * cols);
    return [new Attention(header, { values, order, shape }), end];
  }
  const scales = float32s(buffer, view, offset, count);
  const q = new Uint8Array(buffer, offset + 4 * count, count * cols);
  return [new Attention(header, { scales, q, order, shape }), end];
}

/**
 * The tokens the page styles apart from the text's words: the special ones and the tokenizer's [UNK] (not
 * special: a word it cannot spell, but no word the reader can see either). Either list may be absent.
 */
export function styledApart(special, unknown, n) {
  return Array.from({ length: n }, (_, i) => Boolean(special?.[i] || unknown?.[i]));
}

// Which tokens a section's queries and keys are, and what its rows mean (docs/design.md, HSA1).
function sectionShape(header, { kind, layers, heads, rows, cols }) {
  const source = { tokens: header.tokens, special: styledApart(header.special, header.unknown, header.n) };
  const m = header.target_tokens?.length ?? 0;
  const target = { tokens: header.target_tokens, special: styledApart(header.target_special, header.target_unknown, m) };
  const [queries, keys] = { self: [source, source], encoder: [source, source], decoder: [target, target], cross: [target, source] }[kind];
  const onTarget = kind === "decoder" || kind === "cross";
  return {
    kind,
    layers,
    heads,
    rows,
    cols,
    queries,
    keys,
    // The decoder reads left to right; cross attention sees the whole source; self as the header says.
    causal: kind === "decoder" || (kind === "self" && Boolean(header.causal)),
    truncated: Boolean(onTarget ? header.target_truncated : header.truncated),
    // The encoder reads the source as given: the tokens the model wrote are the target's last ones.
    generated: kind === "encoder" ? 0 : (header.generated ?? 0),
    kvHeads: kind === "self" || kind === "encoder" ? (header.kv_heads ?? heads) : heads,
  };
}

/**
 * An [L, H, rows, cols] attention tensor as the transport holds it: uint8 with row scales, or float32
 * values (`exact`). `kind` is "self" (an encoder's or decoder's only attention) or, in an encoder-decoder's
 * answer, "encoder", "decoder" or "cross" (queries: the target's tokens, keys: the source's); rows and cols
 * are its query and key counts, n = rows. headInto/meanInto give rows*cols values row-major [query][key]
 * whatever the stored order.
 */
export class Attention {
  constructor(header, { scales = null, q = null, values = null, order = "query-major", shape }) {
    this.header = header;
    this.kind = shape.kind;
    this.rows = shape.rows;
    this.cols = shape.cols;
    this.queryTokens = shape.queries.tokens;
    this.keyTokens = shape.keys.tokens;
    this.querySpecial = shape.queries.special;
    this.keySpecial = shape.keys.special;
    this.tokens = this.queryTokens;
    // Segments (a pair's second text) are the source's; a target is one text.
    const sourceRows = shape.queries.tokens === header.tokens;
    this.segments = (sourceRows && header.segments) || new Array(shape.rows).fill(0);
    this.special = this.querySpecial;
    this.layers = shape.layers;
    this.heads = shape.heads;
    this.kvHeads = shape.kvHeads; // query head h reads KV head h // (heads / kvHeads)
    this.n = shape.rows;
    this.causal = shape.causal;
    this.truncated = shape.truncated;
    this.generated = shape.generated; // the last `generated` query tokens were written by the model
    this.byteLevel = header.byte_level !== false; // "Ġ" is a space byte (decoder.js displayToken)
    this.model = header.model;
    this.architecture = header.architecture ?? null;
    this.sections = null; // an encoder-decoder's {encoder, decoder, cross}
    this.scheme = header.quantization?.scheme ?? "row-max-uint8";
    this.bits = header.quantization?.bits ?? 8; // q's levels: 2**bits - 1, one byte each
    this.maxAbsError = header.quantization?.max_abs_error ?? 1 / (2 * (2 ** this.bits - 1));
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

  /** out[i * cols + j] (+)= weight * value of (layer, head) at query i, key j. */
  accumulate(layer, head, out, weight, add) {
    const rows = this.rows;
    const cols = this.cols;
    const row0 = (layer * this.heads + head) * rows; // first query row of this head
    const base = row0 * cols;
    if (this.values) {
      const v = this.values;
      for (let k = 0; k < rows * cols; k++) out[k] = (add ? out[k] : 0) + weight * v[base + k];
      return out;
    }
    const q = this.q;
    const levels = 2 ** this.bits - 1;
    const s = new Float64Array(rows); // per query row: scale / levels * weight
    for (let i = 0; i < rows; i++) s[i] = (this.scales[row0 + i] / levels) * weight;
    if (this.keyMajor) {
      for (let j = 0; j < cols; j++) {
        const src = base + j * rows; // key j's column, over the queries
        for (let i = 0; i < rows; i++) {
          const o = i * cols + j;
          out[o] = (add ? out[o] : 0) + q[src + i] * s[i];
        }
      }
    } else {
      for (let i = 0; i < rows; i++) {
        const src = base + i * cols;
        const o = i * cols;
        const si = s[i];
        for (let j = 0; j < cols; j++) out[o + j] = (add ? out[o + j] : 0) + q[src + j] * si;
      }
    }
    return out;
  }

  /** One head's rows*cols values (row-major, query rows) written into `out` (allocated if omitted). */
  headInto(layer, head, out = new Float32Array(this.rows * this.cols)) {
    this.checkHead(layer, head);
    return this.accumulate(layer, head, out, 1, false);
  }

  /** Mean over the heads of one layer, rows*cols values. */
  meanInto(layer, out = new Float32Array(this.rows * this.cols)) {
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
