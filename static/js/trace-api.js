// The long-input routes (docs/design.md, "Long inputs: a trace, then what fits the screen"): count an
// input's tokens, trace it (an NDJSON stream of progress lines, then the result), and read the trace's
// overview and rows. Every fetch takes the run's AbortSignal: aborting the trace's stream closes the
// connection, and the server stops the forward before its next layer.

import { ApiError, COMPACT_SCHEME, describeDetail, post } from "./api.js";
import { decodeCompact } from "./decode.js";

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
 * Split a stream's text into complete lines: returns [lines, rest], `rest` the unfinished tail to prepend
 * to the next chunk. Pure (tests/js/).
 */
export function splitLines(buffer) {
  const lines = buffer.split("\n");
  const rest = lines.pop();
  return [lines.filter((line) => line.trim()), rest];
}

/** One NDJSON line of /api/trace: progress goes to `onProgress`; the done event is returned; an error throws. */
function readEvent(line, onProgress) {
  const event = JSON.parse(line);
  if (event.event === "progress") onProgress(event);
  else if (event.event === "error") throw new ApiError(describeDetail(event.detail) || "The trace failed.", 500);
  else if (event.event === "done") return event;
  return null;
}

/**
 * POST /api/trace, read as it streams (fetch + ReadableStream + TextDecoderStream): `onProgress({layer,
 * layers})` as each layer starts; resolves with the done event (`TraceDone`). A 4xx before the stream
 * (413 above the model's trace limit: the detail names it) and an error line after it throw ApiError.
 */
export async function streamTrace(query, { signal, onProgress = () => {} } = {}) {
  const response = await post("/api/trace", traceBody(query), signal);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let rest = "";
  let done = null;
  for (;;) {
    const { value, done: ended } = await reader.read();
    const [lines, tail] = splitLines(rest + (value ?? "") + (ended ? "\n" : ""));
    rest = tail;
    for (const line of lines) done = readEvent(line, onProgress) ?? done;
    if (ended) break;
  }
  if (!done) throw new ApiError("The trace ended before its result: the server stopped answering.", 0);
  return done;
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
