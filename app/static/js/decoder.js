// What today's decoder models add to a run, as pure functions (no DOM; tests/js/ imports them as the page
// does): grouped-query heads (query head h reads key/value head h // (heads / kvHeads)), the first-token
// "attention sink" hidden and the rest renormalised, the top-k of a row, and tokens as readable text.

/** KV group of query head `head` in a model of `heads` query heads over `kvHeads` key/value heads. */
export function kvGroup(head, heads, kvHeads) {
  if (!(kvHeads > 0) || heads % kvHeads !== 0) return head; // no (or no valid) grouping: a head is its own
  return Math.floor(head / (heads / kvHeads));
}

/** True when query heads share key/value heads (kvHeads < heads). */
export function isGrouped({ heads, kvHeads }) {
  return kvHeads > 0 && kvHeads < heads && heads % kvHeads === 0;
}

/** [{group, first, count}] of consecutive query heads per KV head; one group per head without grouping. */
export function kvGroups({ heads, kvHeads }) {
  const per = isGrouped({ heads, kvHeads }) ? heads / kvHeads : 1;
  return Array.from({ length: heads / per }, (_, group) => ({ group, first: group * per, count: per }));
}

/**
 * `values` (n*cols row-major; cols = n unless rectangular) without key column 0, each row renormalised over
 * the rest: column 0 becomes NaN (drawn as a gap), and a row with no weight left (a causal model's first row)
 * NaN throughout. Float64, summed left to right, so a reference that sums the same way gets the same numbers.
 */
export function withoutFirstToken(values, n, cols = n) {
  const out = new Float64Array(n * cols);
  for (let i = 0; i < n; i++) {
    const o = i * cols;
    let rest = 0;
    for (let j = 1; j < cols; j++) rest += values[o + j];
    out[o] = Number.NaN;
    for (let j = 1; j < cols; j++) out[o + j] = rest > 0 ? values[o + j] / rest : Number.NaN;
  }
  return out;
}

/**
 * The `k` largest finite weights of row `i` of `values` (n*n), over the keys in [from, to): [{index, weight}],
 * largest first, ties in token order.
 */
export function topK(values, n, i, k, { from = 0, to = n } = {}) {
  const entries = [];
  for (let j = Math.max(0, from); j < Math.min(n, to); j++) {
    const weight = values[i * n + j];
    if (Number.isFinite(weight)) entries.push({ index: j, weight });
  }
  entries.sort((a, b) => b.weight - a.weight || a.index - b.index);
  return entries.slice(0, k);
}

// Byte-level BPE (GPT-2, RoBERTa, Llama 3) spells the bytes of a space, newline and tab "Ġ", "Ċ", "ĉ";
// SentencePiece spells a space "▁". Each one of them is that character, wherever it sits in the token. The
// page shows them as visible signs: a bare space would vanish at the start of an axis label, yet it is what
// tells "␣cat" (a new word) from "cat" (a word's continuation).
// The byte-level marks are respelled only for a byte-level tokenizer (the API's `byte_level`): in a
// WordPiece model's token "Ġ" is a letter someone typed, and shown as it is.
const SENTENCEPIECE_MARKS = [[/▁/gu, "␣"]];
const BYTE_LEVEL_MARKS = [[/Ġ/gu, "␣"], [/Ċ/gu, "↵"], [/ĉ/gu, "⇥"], ...SENTENCEPIECE_MARKS];

/**
 * A token as every view of the page shows it (axes, hover, token lines, panels, image exports): the
 * tokenizer's marks as visible signs, "Ġcat" -> "␣cat", "Ċ" -> "↵" where `byteLevel` (the answer's
 * `byte_level`; left out: true), "▁cat" -> "␣cat" always. The API's JSON keeps the raw tokens.
 */
export function displayToken(token, byteLevel = true) {
  let text = String(token);
  for (const [mark, replacement] of byteLevel ? BYTE_LEVEL_MARKS : SENTENCEPIECE_MARKS) {
    text = text.replace(mark, replacement);
  }
  return text;
}

/**
 * The whole-answer JSON `blob` (POST /api/attention) with `display_tokens`, the page's spelling of its
 * `tokens`, as its first field: written in front of the text, so an answer of 150 MB is never parsed.
 */
export function withDisplayTokens(blob, { tokens, byteLevel }) {
  const spelled = JSON.stringify(tokens.map((token) => displayToken(token, byteLevel)));
  return new Blob([`{"display_tokens":${spelled},`, blob.slice(1)], { type: "application/json" });
}

/** Axis labels: the written tokens (the last `generated`) prefixed with ✎. */
export function markWritten(tokens, generated) {
  const prompt = tokens.length - generated;
  return tokens.map((token, i) => (i >= prompt ? `✎ ${token}` : token));
}
