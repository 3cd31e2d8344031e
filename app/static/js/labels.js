// What the page calls things: model options, the selected head, export file names. Pure (no DOM), so the
// unit tests in tests/js/ import it as the page does.

import { AGGREGATES, isAggregate } from "./aggregates.js";
import { isGrouped, kvGroup } from "./decoder.js";

/**
 * "name — 6 layers × 12 heads (causal)", "... × 4 heads over 2 KV heads ..."; a model that is not loaded yet
 * does not know its size. What its file's headers said follows: "· llama · 135 M params · Q4_1 · 98 MB".
 * A model that cannot load (a broken store entry, a failed load) is only that: "name — unavailable: why",
 * the reason cut to REASON_CHARS (the option's title holds all of it).
 */
export function modelLabel(m) {
  if (m.error) {
    const why = m.error.length > REASON_CHARS ? `${m.error.slice(0, REASON_CHARS - 1)}…` : m.error;
    return `${m.name} — unavailable: ${why}`;
  }
  const grouped = m.kv_heads != null && m.kv_heads < m.heads ? ` over ${m.kv_heads} KV heads` : "";
  const size = m.layers == null ? "loads on first use" : `${m.layers} layers × ${m.heads} heads${grouped}`;
  const facts = modelFacts(m);
  return `${m.name} — ${size}${m.causal ? " (causal)" : ""}${facts ? ` · ${facts}` : ""}`;
}

const REASON_CHARS = 160; // a menu line, not a paragraph

/** "llama · 135 M params · Q4_1 · 98 MB": family, parameters, quantization and size on disk, as known. */
export function modelFacts(m) {
  const family = m.header_family ?? (m.parameters != null ? m.family : null);
  const parts = [
    family,
    m.parameters != null ? `${scaled(m.parameters, PARAMETER_UNITS)} params` : null,
    m.quantization,
    m.size_bytes != null ? scaled(m.size_bytes, BYTE_UNITS) : null,
  ];
  return parts.filter((part) => part != null && part !== "").join(" · ");
}

const PARAMETER_UNITS = ["", " K", " M", " B", " T"];
const BYTE_UNITS = [" B", " kB", " MB", " GB", " TB"];

/** 134515008 -> "135 M"; two significant digits under 10 ("1.2 B"), as a model's size is usually said. */
function scaled(value, units) {
  let unit = 0;
  while (value >= 999.5 && unit < units.length - 1) {
    value /= 1000;
    unit += 1;
  }
  const shown = value < 9.95 && unit > 0 ? value.toFixed(1) : String(Math.round(value));
  return `${shown}${units[unit]}`;
}

/**
 * [[group title, [models]]] for the menu: one group per source of /api/models `sources` ({id, label}, in the
 * server's order, titled by its label), each in list order, empty ones left out. A model of a source the
 * list does not name (none: from a server before sources) joins the first group; with no sources at all,
 * each source is a group titled by its id.
 */
export function modelGroups(models, sources = []) {
  const ids = () => [...new Set(models.map((m) => m.source ?? "bundled"))];
  const known = sources.length ? sources : ids().map((id) => ({ id, label: id }));
  const groups = new Map(known.map(({ id }) => [id, []]));
  for (const m of models) groups.get(groups.has(m.source) ? m.source : known[0].id).push(m);
  return known.filter(({ id }) => groups.get(id).length).map(({ id, label }) => [label, groups.get(id)]);
}

/**
 * "layer 2, head 5" or "layer 2, mean of all heads"; with grouped-query heads (`model` = {heads, kvHeads})
 * a head is named with its key/value group, "L2 H5 · kv 1".
 */
export function selectionLabel(layer, head, model = null) {
  if (isAggregate(head)) return `layer ${layer}, ${AGGREGATES[head].title}`;
  if (model && isGrouped(model)) return `L${layer} H${head} · kv ${kvGroup(head, model.heads, model.kvHeads)}`;
  return `layer ${layer}, head ${head}`;
}

/** A short head name for chips: "L2 H5", with its group when heads share key/values ("L2 H5 · kv 1"). */
export function shortHeadLabel(layer, head, model = null) {
  return model && isGrouped(model) ? selectionLabel(layer, head, model) : `L${layer} H${head}`;
}

/**
 * The status line after a run: "11 tokens · 6 layers × 12 heads"; with grouped-query heads "... (2 KV heads)";
 * after a continuation "8 prompt tokens + 3 written · ..." (and "of 5 asked" when the model stopped early).
 */
export function runSummary(attention, asked = 0) {
  const { n, layers, heads, kvHeads, generated = 0 } = attention;
  const grouped = isGrouped(attention) ? ` (${kvHeads} KV heads)` : "";
  // A grid pooled into blocks (a snapshot past its size limit: header input_n) says the input's length.
  const input = attention.header?.input_n ?? n;
  let tokens = input > n ? `${input} tokens, pooled to ${n} × ${n} blocks` : `${n} tokens`;
  if (asked > 0 || generated > 0) {
    tokens = `${n - generated} prompt tokens + ${generated} written${generated < asked ? ` (of ${asked} asked)` : ""}`;
  }
  return `${tokens} · ${layers} layers × ${heads} heads${grouped}`;
}

function safeModel(model) {
  return (model || "model").replace(/[^A-Za-z0-9._-]+/g, "_");
}

// Weight × value norm shares (weighting.js) are another quantity than weights: their files say "-norm".
const normSuffix = (weighting) => (weighting === "norm" ? "-norm" : "");

/**
 * A file name stem for exports: the model name reduced to [A-Za-z0-9._-] (never a path), layer, head, and
 * "-norm" for weight × value norm shares.
 */
export function exportName(model, layer, head, { weighting = "weight" } = {}) {
  return `headscope-${safeModel(model)}-L${layer}-${isAggregate(head) ? head : `H${head}`}${normSuffix(weighting)}`;
}

/** The token-lines SVG: of the selected head, or of every head of its layer overlaid ("-L2-all-heads"). */
export function tokenLinesName(model, layer, head, { allHeads = false, weighting = "weight" } = {}) {
  if (!allHeads) return `${exportName(model, layer, head, { weighting })}-tokens.svg`;
  return `headscope-${safeModel(model)}-L${layer}-all-heads${normSuffix(weighting)}-tokens.svg`;
}

/** The JSON export of every head names what it holds: "headscope-<model>-all-heads.json" ("-norm", "-words"). */
export function allHeadsName(model, { words = false, weighting = "weight" } = {}) {
  return `headscope-${safeModel(model)}-all-heads${normSuffix(weighting)}${words ? "-words" : ""}.json`;
}

/** The JSON export of the selected head alone: "headscope-<model>-L2-H7.json" ("-norm", "-words"). */
export function headJsonName(model, layer, head, { words = false, weighting = "weight" } = {}) {
  return `${exportName(model, layer, head, { weighting })}${words ? "-words" : ""}.json`;
}
