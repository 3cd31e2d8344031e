// The long-input routes (docs/long-inputs.md, "Over HTTP"): count an
// input's tokens, trace it (an NDJSON stream of progress lines, then the result), and read the trace's
// overview and rows. Every fetch takes the run's AbortSignal: aborting the trace's stream closes the
// connection, and the server stops the forward before its next layer.

import { COMPACT_SCHEME, post } from "./api.js";
import { decodeCompact } from "./decode.js";
import { streamProgress } from "./progress-stream.js";

/** The trace routes' body: the input alone (they take no `words` and no continuation). */
export function traceBody({ text, pair, model, chat = false }) {
  const input = { text, text_pair: pair || null, model: model || null };
  return chat ? { ...input, chat: true } : input;
}

/** UTF-8 bytes of `text` (what a tokenizer reads), without building the encoded copy. */
export function utf8Length(text) {
  let bytes = 0;
  for (const char of text ?? "") {
    const code = char.codePointAt(0);
    bytes += code < 0x80 ? 1 : code < 0x800 ? 2 : code < 0x10000 ? 3 : 4;
  }
  return bytes;
}

/** POST /api/trace/tokens: {model, n, max_tokens, trace_max_tokens} (the tokenizer alone, no forward). */
export async function fetchTokens(query, { signal } = {}) {
  return (await post("/api/trace/tokens", traceBody(query), signal)).json();
}

/**
 * POST /api/trace, read as it streams (progress-stream.js): `onProgress({layer, layers})` as each layer
 * starts; resolves with the done event (`TraceDone`). A 4xx before the stream (413 above the model's trace
 * limit: the detail names it) and an error line after it throw ApiError. Options: {signal, onProgress}.
 */
export async function streamTrace(query, options = {}) {
  const ended = "The trace ended before its result: the server stopped answering.";
  return streamProgress("/api/trace", traceBody(query), { ...options, failed: "The trace failed.", ended });
}

/**
 * POST /api/trace/overview (size 128, reduce max: pooled during the forward), decoded as any compact answer:
 * n = s blocks, tokens one label a block; `header.edges` the blocks' token boundaries, `header.input_n`.
 */
export async function fetchOverview(query, { signal } = {}) {
  const response = await post(`/api/trace/overview?scheme=${COMPACT_SCHEME}`, traceBody(query), signal);
  return decodeCompact(await response.arrayBuffer());
}

/** POST /api/trace/row: query token `q`'s exact weights (6 decimals) on every key of one head: {q, n, values}. */
export async function fetchRow(query, layer, head, q, { signal } = {}) {
  return (await post("/api/trace/row", { ...traceBody(query), layer, head, q }, signal)).json();
}
