// Decoder for the compact attention transport (docs/design.md, "POST /api/attention/compact"):
//   "HSA1" | uint32 LE header length h | UTF-8 JSON header | zero pad to 4 |
//   float32 LE row scale [L, H, n] | uint8 q [L, H, n, n];   value = q / 255 * scale

const MAGIC = "HSA1";
const LITTLE_ENDIAN = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;

export class CompactDecodeError extends Error {}

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
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + headerLength)));
  const { layers: L, heads: H, n } = header;
  for (const [name, v] of [["layers", L], ["heads", H], ["n", n]]) {
    if (!Number.isInteger(v) || v < 0) throw new CompactDecodeError(`header ${name}=${JSON.stringify(v)} is not a count`);
  }
  if (!Array.isArray(header.tokens) || header.tokens.length !== n) {
    throw new CompactDecodeError(`header has ${header.tokens?.length} tokens for n=${n}`);
  }
  const scaleOffset = Math.ceil((8 + headerLength) / 4) * 4;
  const rows = L * H * n;
  const qOffset = scaleOffset + 4 * rows;
  const expected = qOffset + rows * n;
  if (buffer.byteLength !== expected) {
    throw new CompactDecodeError(
      `buffer is ${buffer.byteLength} bytes, expected ${expected} for L=${L} H=${H} n=${n}`,
    );
  }
  let scales;
  if (LITTLE_ENDIAN) {
    scales = new Float32Array(buffer, scaleOffset, rows);
  } else {
    scales = new Float32Array(rows);
    for (let i = 0; i < rows; i++) scales[i] = view.getFloat32(scaleOffset + 4 * i, true);
  }
  const q = new Uint8Array(buffer, qOffset, rows * n);
  return new Attention(header, scales, q);
}

/** Dequantized access to an [L, H, n, n] attention tensor held as row-max uint8. */
export class Attention {
  constructor(header, scales, q) {
    this.header = header;
    this.tokens = header.tokens;
    this.segments = header.segments ?? new Array(header.n).fill(0);
    this.special = header.special ?? new Array(header.n).fill(false);
    this.layers = header.layers;
    this.heads = header.heads;
    this.n = header.n;
    this.causal = Boolean(header.causal);
    this.truncated = Boolean(header.truncated);
    this.model = header.model;
    this.maxAbsError = header.quantization?.max_abs_error ?? 1 / 510;
    this.scales = scales;
    this.q = q;
  }

  checkHead(layer, head) {
    if (!Number.isInteger(layer) || layer < 0 || layer >= this.layers) {
      throw new RangeError(`layer ${layer} is outside 0..${this.layers - 1}`);
    }
    if (!Number.isInteger(head) || head < 0 || head >= this.heads) {
      throw new RangeError(`head ${head} is outside 0..${this.heads - 1}`);
    }
  }

  /** One head's n*n values (row-major, query rows) written into `out` (allocated if omitted). */
  headInto(layer, head, out = new Float32Array(this.n * this.n)) {
    this.checkHead(layer, head);
    const n = this.n;
    const row0 = (layer * this.heads + head) * n;
    const q = this.q;
    for (let i = 0; i < n; i++) {
      const s = this.scales[row0 + i] / 255;
      const base = (row0 + i) * n;
      const o = i * n;
      for (let j = 0; j < n; j++) out[o + j] = q[base + j] * s;
    }
    return out;
  }

  /** Mean over the heads of one layer, n*n values. */
  meanInto(layer, out = new Float32Array(this.n * this.n)) {
    this.checkHead(layer, 0);
    const n = this.n;
    const H = this.heads;
    out.fill(0);
    for (let h = 0; h < H; h++) {
      const row0 = (layer * H + h) * n;
      for (let i = 0; i < n; i++) {
        const s = this.scales[row0 + i] / (255 * H);
        const base = (row0 + i) * n;
        const o = i * n;
        for (let j = 0; j < n; j++) out[o + j] += this.q[base + j] * s;
      }
    }
    return out;
  }

  /** Index of the first token of the second segment, or -1 for a single sentence. */
  get boundary() {
    return this.segments.indexOf(1);
  }
}
