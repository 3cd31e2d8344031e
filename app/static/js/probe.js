// "Find heads", the parts without DOM: POST /api/probe read as it streams (progress lines for long probes,
// then the result), the axes a person can plot (the probe's three scores, then the head statistics of the
// text on screen), the scatter's traces (one per layer, so the legend colours by layer), the chips'
// ranking (only the heads the probe labels), and the CSV and JSON exports. Pure but for fetch, so tests/js/
// imports it as the page does.

import { streamProgress } from "./progress-stream.js";

export const PROBE_KINDS = ["previous_token", "duplicate_token", "induction"];
export const KIND_NAMES = Object.freeze({
  previous_token: "previous-token score",
  duplicate_token: "duplicate-token score",
  induction: "induction score",
});
export const DEFAULT_AXES = Object.freeze({ x: "previous_token", y: "induction" });
export const DEFAULT_SEQUENCES = 8;
export const PROBE_LENGTH = 50; // the tokens drawn, then repeated: the route's default, which the page runs
export const MAX_SEQUENCES = 32; // app/schemas/probe.py
export const MAX_SEED = 2 ** 32 - 1;

/** The route's body: the model on screen, the seed and sequences asked for, the default length. */
export function probeBody({ model, seed = 0, sequences = DEFAULT_SEQUENCES }) {
  return { model: model || null, seed, sequences };
}

/** A seed from a URL or the form: a whole number in 0..MAX_SEED, else null. */
export function parseSeed(value) {
  const text = String(value ?? "").trim();
  if (!/^\d{1,10}$/.test(text)) return null;
  const seed = Number(text);
  return seed <= MAX_SEED ? seed : null;
}

/**
 * POST /api/probe, read as it streams: `onProgress({done, layers})` after each layer of a long probe;
 * resolves with the done event (ProbeDone). A 4xx before the stream and an error line after it throw
 * ApiError. Options: {signal, onProgress}.
 */
export async function streamProbe(body, options = {}) {
  const ended = "The probe ended before its result: the server stopped answering.";
  return streamProgress("/api/probe", body, { ...options, failed: "Probing the heads failed.", ended });
}

/**
 * The axes on offer: [{key, name, values: L x H}], the probe's scores first, then `stats` (the text on
 * screen's head statistics, {key: L x H}) where they have the probe's shape, named by `nameOf(key)`.
 */
export function axesOf(result, stats = {}, nameOf = (key) => key) {
  const axes = PROBE_KINDS.map((key) => ({ key, name: KIND_NAMES[key], values: result.scores[key] }));
  for (const [key, values] of Object.entries(stats)) {
    const shaped = values?.length === result.layers && values[0]?.length === result.heads;
    if (shaped && !PROBE_KINDS.includes(key)) axes.push({ key, name: `${nameOf(key)} (this text)`, values });
  }
  return axes;
}

/** A score as the page writes it: three decimals; an absent one (null) as a dash. */
export function formatScore(v) {
  return Number.isFinite(v) ? v.toFixed(3) : "–";
}

/**
 * Plotly traces of every head as a point (x, y from the two axes), one trace per layer so the legend and
 * the colours are the layers'; each point's customdata is [layer, head] and its hover names the head and
 * its three scores. A head with an absent value on either axis is left out (Plotly draws no null).
 */
export function scatterTraces(result, xAxis, yAxis, colorOf) {
  const traces = [];
  for (let layer = 0; layer < result.layers; layer++) {
    const trace = { type: "scatter", mode: "markers", name: `L${layer}`, x: [], y: [], customdata: [], text: [] };
    trace.marker = { color: colorOf(layer), size: 9, line: { width: 0.5, color: "#333" } };
    trace.hovertemplate = "%{text}<extra></extra>";
    for (let head = 0; head < result.heads; head++) {
      const x = xAxis.values[layer][head];
      const y = yAxis.values[layer][head];
      if (!Number.isFinite(x) || !Number.isFinite(y)) continue;
      trace.x.push(x);
      trace.y.push(y);
      trace.customdata.push([layer, head]);
      trace.text.push(hoverText(result, layer, head));
    }
    traces.push(trace);
  }
  return traces;
}

/** "L3 H5<br>previous-token score 0.012<br>..." (Plotly's hover takes <br> for a line break). */
export function hoverText(result, layer, head) {
  const lines = PROBE_KINDS.map((kind) => `${KIND_NAMES[kind]} ${formatScore(result.scores[kind][layer][head])}`);
  return [`L${layer} H${head}`, ...lines].join("<br>");
}

/**
 * The heads the probe labels `kind`, as [layer, head, score], highest score first (ties in model order),
 * at most `count`.
 */
export function rankHeads(result, kind, count) {
  const heads = [];
  result.labels.forEach((row, layer) =>
    row.forEach((kinds, head) => {
      if (kinds.includes(kind)) heads.push([layer, head, result.scores[kind][layer][head]]);
    }),
  );
  heads.sort((a, b) => b[2] - a[2] || a[0] - b[0] || a[1] - b[1]);
  return heads.slice(0, count);
}

/**
 * A kind's chance levels, distinct (to 1e-6: the float32 values of one mask agree to ~1e-7), ascending:
 * one for most models; one per window for a model whose layers' sliding windows differ.
 */
export function chanceLevels(result, kind) {
  const levels = new Set();
  for (const row of result.chance[kind]) for (const v of row) if (Number.isFinite(v)) levels.add(+v.toFixed(6));
  return [...levels].sort((a, b) => a - b);
}

/** "0.020" or "0.010 to 0.020": a kind's chance as the caption says it. */
export function chanceText(result, kind) {
  const levels = chanceLevels(result, kind);
  if (!levels.length) return "–";
  const [lo, hi] = [levels[0], levels.at(-1)];
  return lo === hi ? formatScore(lo) : `${formatScore(lo)} to ${formatScore(hi)}`;
}

function csvField(value) {
  const text = value === null || value === undefined ? "" : String(value);
  return /[",\n\r]/.test(text) ? `"${text.replaceAll('"', '""')}"` : text;
}

/**
 * One row a head: layer, head, each kind's score, spread and chance (full precision as the answer has
 * them; an absent one empty), its labels joined by spaces, after a comment line naming the probe. RFC 4180: a field with a comma, quote or newline quoted.
 */
export function probeCsv(result) {
  const header = ["layer", "head", ...PROBE_KINDS.flatMap((k) => [k, `${k}_spread`, `${k}_chance`]), "labels"];
  const rows = [header];
  for (let layer = 0; layer < result.layers; layer++) {
    for (let head = 0; head < result.heads; head++) {
      const values = PROBE_KINDS.flatMap((k) => [result.scores, result.spread, result.chance].map((t) => t[k][layer][head]));
      rows.push([layer, head, ...values, result.labels[layer][head].join(" ")]);
    }
  }
  const note = `# ${result.model}, seed ${result.seed}, ${result.sequences} sequences of ${result.length} tokens repeated once; labelled at score >= ${result.threshold} and >= chance + ${result.margin}`;
  return [note, ...rows.map((row) => row.map(csvField).join(","))].join("\n") + "\n";
}

/** The export's file name: "probe-<model>-seed0-8x50.csv" (the model's name made safe for a file). */
export function probeFileName(result, extension) {
  const model = String(result.model).replace(/[^A-Za-z0-9._-]+/g, "_");
  return `probe-${model}-seed${result.seed}-${result.sequences}x${result.length}.${extension}`;
}
