// The page's only door to the server: the JSON and binary endpoints of docs/design.md.
// Errors become ApiError with a message a person can act on (the API's `detail`).

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

async function request(url, options) {
  let response;
  try {
    response = await fetch(url, options);
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new ApiError("Could not reach the headscope server. Is it still running?", 0);
  }
  if (!response.ok) throw await failure(response);
  return response;
}

// One input as the API names its fields; `words` (merge word pieces) is accepted by every endpoint.
function input({ text, pair, model }) {
  return { text, text_pair: pair || null, model: model || null };
}

// `words` is sent only when set: false is the API's default, so word-less bodies stay as they were.
function body(query) {
  return JSON.stringify(query.words ? { ...input(query), words: true } : input(query));
}

const JSON_HEADERS = { "Content-Type": "application/json" };

/** GET /api/models -> {default, models: [...]}. */
export async function fetchModels() {
  return (await request("/api/models")).json();
}

// abs-uint8 (scale 1 per row) gzips to about half the bytes of row-max-uint8 with the same 1/510 error
// bound, and its byte is exactly the thumbnails' colour index; stored key-major it gzips 7-18% smaller
// again. The detail view fetches the exact head anyway.
export const COMPACT_SCHEME = "abs-uint8-key-major";

async function postCompact(url, payload, { signal } = {}) {
  const response = await request(url, { method: "POST", headers: JSON_HEADERS, body: payload, signal });
  return decodeCompact(await response.arrayBuffer());
}

/** POST /api/attention/compact: every head, 8-bit (within the header's max_abs_error), decoded. */
export async function fetchCompact(query, { signal } = {}) {
  return postCompact(`/api/attention/compact?scheme=${COMPACT_SCHEME}`, body(query), { signal });
}

/** POST /api/attention/head/compact: one head at full float32 precision, an exact Attention (1 x 1). */
export async function fetchHead(query, layer, head, { signal } = {}) {
  return postCompact("/api/attention/head/compact", JSON.stringify({ ...JSON.parse(body(query)), layer, head }), { signal });
}

async function postJson(url, payload, { signal } = {}) {
  const response = await request(url, { method: "POST", headers: JSON_HEADERS, body: JSON.stringify(payload), signal });
  return response.json();
}

/** POST /api/attention as a Blob (the JSON export). */
export async function fetchFullBlob(query) {
  const response = await request("/api/attention", { method: "POST", headers: JSON_HEADERS, body: body(query) });
  return response.blob();
}

// Insight API (docs/design.md, "Insight API"): statistics, rollout, flow, comparison.

/** POST /api/analysis: per-head statistics, labels and similar heads (no n*n payload). */
export async function fetchAnalysis(query, { signal } = {}) {
  return postJson("/api/analysis", JSON.parse(body(query)), { signal });
}

/** POST /api/rollout/compact, decoded: layers = L cumulative rollouts, heads = 1 (rows sum to 1, as attention). */
export async function fetchRollout(query, { signal } = {}) {
  return postCompact(`/api/rollout/compact?scheme=${COMPACT_SCHEME}`, body(query), { signal });
}

/** POST /api/flow: attention flow, refused (422, the limit in its detail) for long inputs. */
export async function fetchFlow(query, { signal } = {}) {
  return postJson("/api/flow", JSON.parse(body(query)), { signal });
}

function compareBody(a, b, words) {
  return words ? { a: input(a), b: input(b), words: true } : { a: input(a), b: input(b) };
}

/** POST /api/compare: per-head change scores of B against A on the aligned tokens. */
export async function fetchCompare(a, b, words, { signal } = {}) {
  return postJson("/api/compare", compareBody(a, b, words), { signal });
}

/** POST /api/compare/head: one head's aligned A, B and A - B maps. */
export async function fetchCompareHead(a, b, words, layer, head, { signal } = {}) {
  return postJson("/api/compare/head", { ...compareBody(a, b, words), layer, head }, { signal });
}
