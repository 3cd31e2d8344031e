// A snapshot's carried answers (app/snapshot/, docs/snapshots.md). A snapshot file holds one run of the page
// as a JSON data block, #headscope-snapshot: the answers of the routes its first view and head detail ask,
// each as the server would send it (gzip, base64) or as JSON. When that block is there, api.js answers its
// requests from it (carriedFetch, a fetch that never leaves the file) instead of the network.
// Answers are found by route plus the few fields that vary within one run (layer, head, kind); every
// other field of a request must be the run's own, or the answer says that it needs a server.

// What a request's body may say of the input, and its value when the body leaves it out (api.js body()).
const INPUT = { text: "", text_pair: null, model: null, max_new_tokens: 0, chat: false, target: null, words: false, weighting: "weight" };
// The trace routes' body names the input alone (trace-api.js traceBody).
const TRACE_INPUT = ["text", "text_pair", "model", "chat"];

// Route -> the carried answer's key, from the request's body (app/snapshot/answers.py writes the same keys).
const ROUTES = Object.freeze({
  "/api/models": () => "models",
  "/api/attention/compact": () => "compact",
  "/api/analysis": (b) => `analysis:${b.kind ?? "encoder"}`,
  "/api/attention/head/compact": (b) => `head:${b.kind ?? "encoder"}:${b.layer}:${b.head}`,
  "/api/rollout/compact": (b) => `rollout:${b.kind ?? "encoder"}`,
  "/api/flow": (b) => `flow:${b.kind ?? "encoder"}`,
  "/api/trace/tokens": () => "tokens",
  "/api/attention/progress": () => "progress",
});

let data; // the parsed block: undefined until read, null on the page a server serves

/** The snapshot's data block, parsed once; null where there is none (a served page, Node's tests). */
export function carried() {
  if (data === undefined) {
    const block = typeof document === "undefined" ? null : document.getElementById("headscope-snapshot");
    data = block ? JSON.parse(block.textContent) : null;
  }
  return data;
}

/** The run's view state, for initState (state.js); null on a served page. */
export function carriedState() {
  return carried()?.state ?? null;
}

function bytesOf(base64) {
  if (typeof Uint8Array.fromBase64 === "function") return Uint8Array.fromBase64(base64);
  const text = atob(base64);
  const bytes = new Uint8Array(text.length);
  for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
  return bytes;
}

function answer(body, status, type) {
  return new Response(body, { status, headers: { "Content-Type": type } });
}

function refusal(status, detail) {
  return answer(JSON.stringify({ detail }), status, "application/json");
}

/** The first field of `body` (of the input fields `fields`) that differs from the carried run's input, or null. */
function otherInput(body, input, fields) {
  return fields.find((key) => (body[key] ?? INPUT[key]) !== (input[key] ?? INPUT[key])) ?? null;
}

/** The key of the answer `url` with `body` asks for (null: a route the snapshot does not carry). */
export function answerKey(url, body = {}) {
  const route = ROUTES[url.split("?")[0]];
  return route ? route(body) : null;
}

/** True when the snapshot carries the answer to POST `url` with `payload` (an object). */
export function carries(url, payload) {
  const key = answerKey(url, payload);
  return key !== null && Object.hasOwn(carried()?.answers ?? {}, key);
}

/**
 * fetch(url, options) answered from the carried data: a Response as the server would give it (gzipped
 * answers decompressed by the browser's DecompressionStream), 404 naming what needs a server, 409 for an
 * input other than the run's. An aborted signal rejects with an AbortError, as fetch does.
 */
export async function carriedFetch(url, options = {}) {
  if (options.signal?.aborted) throw new DOMException("The request was aborted.", "AbortError");
  const snapshot = carried();
  const body = options.body ? JSON.parse(options.body) : {};
  const key = answerKey(url, body);
  const path = url.split("?")[0];
  if (key === null || !Object.hasOwn(snapshot.answers, key)) {
    return refusal(404, `${path} needs a headscope server: this file is a snapshot of one run. ${snapshot.rerun}`);
  }
  const fields = path.startsWith("/api/trace/") ? TRACE_INPUT : Object.keys(INPUT);
  const differs = options.body ? otherInput(body, snapshot.input, fields) : null;
  if (differs) {
    return refusal(409, `This snapshot carries one run; another ${differs} needs a headscope server. ${snapshot.rerun}`);
  }
  const carriedAnswer = snapshot.answers[key];
  if (carriedAnswer.status) return refusal(carriedAnswer.status, carriedAnswer.detail);
  if (Object.hasOwn(carriedAnswer, "json")) return answer(JSON.stringify(carriedAnswer.json), 200, "application/json");
  if (Object.hasOwn(carriedAnswer, "text")) return answer(carriedAnswer.text, 200, carriedAnswer.type);
  const gzipped = new Blob([bytesOf(carriedAnswer.gzip)]).stream().pipeThrough(new DecompressionStream("gzip"));
  return answer(gzipped, 200, carriedAnswer.type);
}

/**
 * One head of a run's decoded grid (decode.js Attention), as fetchHead's answer for a head the snapshot does
 * not carry exactly: its 8-bit values, with their bound and why they are not exact.
 */
export function gridHead(full, { kind, layer, head }) {
  const attention = full.sections?.[kind] ?? full;
  return {
    exact: false,
    bits: attention.bits,
    maxAbsError: attention.maxAbsError,
    note: carried()?.exact_note ?? "",
    header: { row_norms: null },
    headInto: () => attention.headInto(layer, head),
  };
}
