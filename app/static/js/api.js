// The page's only door to the server: the JSON and binary endpoints of docs/http-api.md.
// Errors become ApiError with a message a person can act on (the API's `detail`).
// In a snapshot file (app/snapshot/) the same door answers from the data the file carries (carried.js).

import { carried, carriedFetch, carries, gridHead } from "./carried.js";
import { decodeCompact } from "./decode.js";

export class ApiError extends Error {
  constructor(message, status) {
    super(message);
    this.status = status;
  }
}

/** FastAPI's detail is a string for our domain errors and a list for validation errors. */
export function describeDetail(detail) {
  if (typeof detail === "string") return detail;
  if (Array.isArray(detail)) {
    return detail
      .map((d) => {
        const where = Array.isArray(d.loc) ? d.loc.filter((p) => p !== "body").join(".") : "";
        return where ? `${where}: ${d.msg}` : String(d.msg ?? JSON.stringify(d));
      })
      .join("; ");
  }
  return detail ? JSON.stringify(detail) : "";
}

async function failure(response) {
  let detail = "";
  try {
    detail = describeDetail((await response.json()).detail);
  } catch {
    // A proxy or crash page: fall back to the status line.
  }
  const message = detail || `The server answered ${response.status} ${response.statusText}.`;
  return new ApiError(message, response.status);
}

export async function request(url, options) {
  let response;
  const snapshot = carried() !== null;
  try {
    response = snapshot ? await carriedFetch(url, options) : await fetch(url, options);
  } catch (error) {
    if (error.name === "AbortError") throw error;
    if (snapshot) throw new ApiError(`This snapshot could not read what it carries: ${error.message}`, 0);
    throw new ApiError("Could not reach the headscope server. Is it still running?", 0);
  }
  if (!response.ok) throw await failure(response);
  return response;
}

// One input as the API names its fields. `words` (merge word pieces), `newTokens` (continue a causal
// model's text first) and `chat` (the model's chat template) are sent only when set: false and 0 are the API's defaults, so plain bodies stay as
// they were. `target` (an encoder-decoder model's forced target) is sent only when it has text: a blank
// one means "the model writes it", which is the API's default. `weighting` likewise only when "norm"
// (weight × value norm shares in every answer of the run; "weight" is the API's default).
// `probe` ({seed, length}: the head probe's first sequence) replaces the text and every option of it.
export function body({ text, pair, model, words, newTokens = 0, chat = false, target = null, weighting = "weight", probe = null }) {
  if (probe) return { model: model || null, probe }; // the head probe's first sequence: ids, not a text
  const input = { text, text_pair: pair || null, model: model || null };
  if (newTokens > 0) input.max_new_tokens = newTokens;
  if (chat) input.chat = true;
  if (target?.trim()) input.target = target;
  const options = words ? { ...input, words: true } : input;
  return weighting === "norm" ? { ...options, weighting: "norm" } : options;
}

/** body() plus the attention `kind` a head or insight route reads (encoder-decoder runs only). */
export function kindBody(query) {
  return query.kind ? { ...body(query), kind: query.kind } : body(query);
}

/**
 * A rows x cols matrix of a JSON answer as rows*cols row-major values, the shape of a decoded head
 * (decode.js); n x n for every self-attention map, m x n for cross-attention's.
 */
export function flatRows(rows) {
  const cols = rows[0]?.length ?? 0;
  // Float64: the JSON's numbers drawn as they came (float32 would move a 6-decimal value by up to 3e-8).
  const out = new Float64Array(rows.length * cols);
  rows.forEach((row, i) => row.forEach((v, j) => (out[i * cols + j] = v ?? Number.NaN)));
  return out;
}

export async function post(url, payload, signal) {
  const options = { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(payload) };
  return request(url, { ...options, signal });
}

async function postCompact(url, payload, signal) {
  return decodeCompact(await (await post(url, payload, signal)).arrayBuffer());
}

/** POST a JSON body, parse the JSON answer (ApiError on a 4xx/5xx, AbortError when `signal` fires). */
export async function postJson(url, payload, signal) {
  return (await post(url, payload, signal)).json();
}

/** GET /api/models -> {default, models: [...]}. */
export async function fetchModels() {
  return (await request("/api/models")).json();
}

// abs-uint8 (scale 1 per row) gzips to about half the bytes of row-max-uint8 with the same 1/510 error
// bound, and its byte is exactly the thumbnails' colour index; stored key-major it gzips 7-18% smaller
// again. The detail view fetches the exact head anyway.
export const COMPACT_SCHEME = "abs-uint8-key-major";
// The grid's precision: the server takes the most bits that keep the first view within 0.3 bytes a value
// (8 from 128 tokens, 7 from 88, 6 from 64, 8 below; app/compact.py AUTO_BITS). Thumbnails cannot show a
// difference, and the detail fetches the exact head.
export const COMPACT_BITS = "auto";

// Every fetch below takes the run's AbortSignal: a new run aborts what the old one still waits for.

const snapshotGrids = new Map(); // a snapshot's decoded grid by its body: the heads it lacks read from it

/** POST /api/attention/compact: every head, quantized (within the header's max_abs_error), decoded. */
export async function fetchCompact(query, { signal } = {}) {
  const url = `/api/attention/compact?scheme=${COMPACT_SCHEME}&bits=${COMPACT_BITS}`;
  if (!carried()) return postCompact(url, body(query), signal);
  const key = JSON.stringify(body(query));
  if (!snapshotGrids.has(key)) snapshotGrids.set(key, postCompact(url, body(query), signal));
  return snapshotGrids.get(key).catch((error) => {
    snapshotGrids.delete(key); // an aborted read is read again next time
    throw error;
  });
}

/**
 * POST /api/attention/head/compact: one head at full float32 precision, an exact Attention (1 x 1). A
 * snapshot without that head's exact values answers with its grid's (`exact` false, carried.js gridHead).
 */
export async function fetchHead(query, layer, head, { signal } = {}) {
  const url = "/api/attention/head/compact";
  const payload = { ...kindBody(query), layer, head };
  if (carried() && !carries(url, payload)) return gridHead(await fetchCompact(query, { signal }), { kind: query.kind, layer, head });
  return postCompact(url, payload, signal);
}

/** POST /api/attention/head as a Blob: one head's tokens and matrix at full precision (the head's JSON export). */
export async function fetchHeadBlob(query, layer, head, { signal } = {}) {
  return (await post("/api/attention/head", { ...kindBody(query), layer, head }, signal)).blob();
}

/** POST /api/attention as a Blob (the JSON export of every head). */
export async function fetchFullBlob(query, { signal } = {}) {
  return (await post("/api/attention", body(query), signal)).blob();
}

// The name a Content-Disposition gives (the server's is safe ASCII in quotes: app/snapshot/served.py).
const ATTACHMENT = /filename="([A-Za-z0-9._-]+)"/;

/**
 * POST /api/snapshot: the run as one self-contained .html file opening on `layer`, `head` (an index or an
 * aggregate's name) and the query's kind, as {blob, filename} (the name the server gives it).
 */
export async function fetchSnapshotBlob(query, layer, head, { signal } = {}) {
  const response = await post("/api/snapshot", { ...kindBody(query), layer, head }, signal);
  const named = ATTACHMENT.exec(response.headers.get("Content-Disposition") ?? "");
  return { blob: await response.blob(), filename: named ? named[1] : "headscope-snapshot.html" };
}

// Insight API (docs/http-api.md, "Insight routes"): statistics, rollout, flow, comparison.

/** POST /api/analysis: per-head statistics, labels and similar heads (no n*n payload). */
export async function fetchAnalysis(query, { signal } = {}) {
  return postJson("/api/analysis", kindBody(query), signal);
}

/**
 * POST /api/rollout/compact, decoded: layers = L cumulative rollouts, heads = 1 (rows sum to 1, as
 * attention); header.residual is the identity weight mixed into each layer.
 */
export async function fetchRollout(query, { signal } = {}) {
  return postCompact(`/api/rollout/compact?scheme=${COMPACT_SCHEME}`, kindBody(query), signal);
}

/** POST /api/flow: attention flow (flow and flow_normalized as n*n rows), 422 for long inputs. */
export async function fetchFlow(query, { signal } = {}) {
  const result = await postJson("/api/flow", kindBody(query), signal);
  return { ...result, flow: flatRows(result.flow), flow_normalized: flatRows(result.flow_normalized) };
}

// words and weighting belong to the comparison, not to either input: A's say them for both.
export function compareBody(a, b, words) {
  const input = (query) => body({ ...query, words: false, weighting: "weight" });
  const pair = { a: input(a), b: input(b) };
  if (a.kind) pair.kind = a.kind; // encoder-decoder inputs compare one kind of attention
  if (words) pair.words = true;
  if (a.weighting === "norm") pair.weighting = "norm";
  return pair;
}

/** POST /api/compare: per-head change scores of B against A on the aligned tokens. */
export async function fetchCompare(a, b, words, { signal } = {}) {
  return postJson("/api/compare", compareBody(a, b, words), signal);
}

/** POST /api/compare/head: one head's aligned A, B and A - B maps (m*m rows each). */
export async function fetchCompareHead(a, b, words, layer, head, { signal } = {}) {
  const maps = await postJson("/api/compare/head", { ...compareBody(a, b, words), layer, head }, signal);
  return { ...maps, a: flatRows(maps.a), b: flatRows(maps.b), diff: flatRows(maps.diff) };
}
