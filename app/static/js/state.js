// The view state: one frozen object, changed only through update(patch), which merges the patch, writes
// the URL once (so a reload or a shared link restores the same view) and notifies the subscribers.
// history.replaceState keeps the back button for real navigation instead of every click.
// Pure apart from the default URL writer, so Node's test runner imports it as the page does (tests/js/).

import { AGGREGATES, isAggregate } from "./aggregates.js";
import { PAIR_FILTERS } from "./lines.js";
import { DEFAULT_SCALE, parseScale } from "./scale.js";
import { DEFAULT_WEIGHTING, WEIGHTINGS, parseWeighting } from "./weighting.js";

const PROBES = ["heads"];
const INPUTS = ["probe"]; // "" (the text) or the head probe's first sequence (probe-input.js)
const MAX_SEED = 2 ** 32 - 1; // app/schemas/probe.py's bounds
const MAX_SEQUENCES = 32;

function parseBounded(value, fallback, lo, hi) {
  if (value === null || !/^\d{1,10}$/.test(value)) return fallback;
  const number = Number(value);
  return number >= lo && number <= hi ? number : fallback;
}

const VIEWS = ["heatmap", "tokens"];
const LINES = ["head", "layer"];
// Encoder-decoder models: which attention the grid and the detail show (seq2seq.js names them).
export const KINDS = ["encoder", "decoder", "cross"];

export const DEFAULT_STATE = Object.freeze({
  text: "",
  pair: "",
  model: "",
  layer: 0,
  head: 0,
  view: "heatmap",
  words: false, // word-level attention (the API's `words: true`) in every view
  weighting: DEFAULT_WEIGHTING, // "norm": weight × value norm shares in every view (the API's `weighting`)
  color: "", // statistic the grid's thumbnail frames are coloured by ("" = none)
  compare: false, // compare mode: a second input B next to A
  btext: "", // B's sentence; blank = A's sentence (to compare two models on one input)
  bmodel: "", // B's model; blank = A's model
  hideFirst: false, // the detail drops key column 0 (the attention sink) and renormalises each row
  newTokens: 0, // causal models: continue the text by up to this many tokens first (max_new_tokens)
  chat: false, // the text as a user's turn of the model's chat template (the API's `chat: true`)
  lines: "head", // token lines of the selected head, or of every head of its layer ("layer")
  pairs: "all", // token lines of a pair: all, or only A -> B, B -> A, A -> A, B -> B (lines.js PAIR_FILTERS)
  scale: DEFAULT_SCALE, // the detail heatmap's colour scale (scale.js SCALES); 0–1 keeps heads comparable
  target: "", // encoder-decoder models: the target the decoder is forced through; blank = the model writes it
  kind: "cross", // encoder-decoder models: encoder, decoder or cross attention; cross is the alignment picture
  probe: "", // "heads": the "Find heads" panel's probe is open (probe-view.js), run again from a link
  seed: 0, // the probe's seed (0..2^32 - 1)
  sequences: 8, // the probe's random sequences (1..32)
  input: "", // "probe": the run is the head probe's first sequence for `seed` (probe-input.js), not the text
});

// The page offers up to this many written tokens (the service's default HEADSCOPE_MAX_NEW_TOKENS; a service
// set lower answers 422 with its own limit, shown in the alert).
export const MAX_NEW_TOKENS = 32;

// A statistic's name as the API spells it (or "change"); anything else in a URL is ignored.
const COLOR_NAME = /^[a-z_]{1,32}$/;

function parseIndex(value, fallback) {
  if (value === null || !/^\d{1,4}$/.test(value)) return fallback;
  return Number(value);
}

/** A continuation length from a URL or the form: an integer clamped to 0..MAX_NEW_TOKENS, else 0. */
export function parseNewTokens(value) {
  return Math.min(parseIndex(value === null ? null : String(value).trim(), 0), MAX_NEW_TOKENS);
}

/** State from a query string; unknown or malformed values fall back to defaults. */
export function readState(search = window.location.search) {
  const params = new URLSearchParams(search);
  const head = params.get("head");
  const view = params.get("view");
  return {
    text: params.get("text") ?? DEFAULT_STATE.text,
    pair: params.get("pair") ?? DEFAULT_STATE.pair,
    model: params.get("model") ?? DEFAULT_STATE.model,
    layer: parseIndex(params.get("layer"), DEFAULT_STATE.layer),
    head: isAggregate(head) ? head : parseIndex(head, DEFAULT_STATE.head),
    view: VIEWS.includes(view) ? view : DEFAULT_STATE.view,
    words: params.get("words") === "1",
    weighting: parseWeighting(params.get("weighting")),
    color: COLOR_NAME.test(params.get("color") ?? "") ? params.get("color") : DEFAULT_STATE.color,
    compare: params.get("compare") === "1",
    btext: params.get("btext") ?? DEFAULT_STATE.btext,
    bmodel: params.get("bmodel") ?? DEFAULT_STATE.bmodel,
    hideFirst: params.get("nofirst") === "1",
    newTokens: parseNewTokens(params.get("continue")),
    chat: params.get("chat") === "1",
    lines: LINES.includes(params.get("lines")) ? params.get("lines") : DEFAULT_STATE.lines,
    pairs: Object.hasOwn(PAIR_FILTERS, params.get("pairs") ?? "") ? params.get("pairs") : DEFAULT_STATE.pairs,
    scale: parseScale(params.get("scale")),
    target: params.get("target") ?? DEFAULT_STATE.target,
    kind: KINDS.includes(params.get("kind")) ? params.get("kind") : DEFAULT_STATE.kind,
    probe: PROBES.includes(params.get("probe")) ? params.get("probe") : DEFAULT_STATE.probe,
    seed: parseBounded(params.get("seed"), DEFAULT_STATE.seed, 0, MAX_SEED),
    sequences: parseBounded(params.get("sequences"), DEFAULT_STATE.sequences, 1, MAX_SEQUENCES),
    input: INPUTS.includes(params.get("input")) ? params.get("input") : DEFAULT_STATE.input,
  };
}

/**
 * The values of `search` that readState could not use and replaced by defaults: [{name, value}], in the
 * link's order, so the page can say what it ignored. A model name is checked against the server's list
 * elsewhere (truth.js); a continuation over the page's limit is clamped, not ignored.
 */
export function ignoredParams(search = window.location.search) {
  const usable = {
    layer: (v) => parseIndex(v, null) !== null,
    head: (v) => isAggregate(v) || parseIndex(v, null) !== null,
    view: (v) => VIEWS.includes(v),
    color: (v) => COLOR_NAME.test(v),
    continue: (v) => parseIndex(v.trim(), null) !== null,
    kind: (v) => KINDS.includes(v),
    weighting: (v) => Object.hasOwn(WEIGHTINGS, v),
    probe: (v) => PROBES.includes(v),
    seed: (v) => parseBounded(v, null, 0, MAX_SEED) !== null,
    sequences: (v) => parseBounded(v, null, 1, MAX_SEQUENCES) !== null,
    input: (v) => INPUTS.includes(v),
    ...Object.fromEntries(["words", "compare", "nofirst", "chat"].map((flag) => [flag, (v) => v === "1" || v === "0"])),
  };
  const ignored = [];
  for (const [name, value] of new URLSearchParams(search)) {
    if (Object.hasOwn(usable, name) && !usable[name](value)) ignored.push({ name, value });
  }
  return ignored;
}

/** Query string for a state; empty fields are left out to keep links short. */
export function encodeState(state) {
  const params = new URLSearchParams();
  if (state.text) params.set("text", state.text);
  if (state.pair) params.set("pair", state.pair);
  if (state.model) params.set("model", state.model);
  params.set("layer", String(state.layer));
  params.set("head", String(state.head));
  params.set("view", state.view);
  if (state.words) params.set("words", "1");
  if (state.weighting !== DEFAULT_WEIGHTING) params.set("weighting", state.weighting);
  if (state.color) params.set("color", state.color);
  if (state.compare) {
    params.set("compare", "1");
    if (state.btext) params.set("btext", state.btext);
    if (state.bmodel) params.set("bmodel", state.bmodel);
  }
  if (state.hideFirst) params.set("nofirst", "1");
  if (state.newTokens) params.set("continue", String(state.newTokens));
  if (state.chat) params.set("chat", "1");
  if (state.lines !== DEFAULT_STATE.lines) params.set("lines", state.lines);
  if (state.pairs !== DEFAULT_STATE.pairs) params.set("pairs", state.pairs);
  if (state.scale !== DEFAULT_SCALE) params.set("scale", state.scale);
  if (state.target) params.set("target", state.target);
  if (state.kind !== DEFAULT_STATE.kind) params.set("kind", state.kind);
  if (state.probe) {
    params.set("probe", state.probe);
    params.set("seed", String(state.seed));
    if (state.sequences !== DEFAULT_STATE.sequences) params.set("sequences", String(state.sequences));
  }
  if (state.input) {
    params.set("input", state.input);
    params.set("seed", String(state.seed)); // the probe input's seed, the panel's too
  }
  return params.toString();
}

/** Replace the current history entry's URL with `state`. */
export function writeState(state) {
  const url = `${window.location.pathname}?${encodeState(state)}`;
  window.history.replaceState(null, "", url);
}

let current = Object.freeze({ ...DEFAULT_STATE });
let write = writeState;
const listeners = new Set();

/** The state now: frozen, so a reader cannot change it behind update()'s back. */
export function getState() {
  return current;
}

/**
 * Start over from `initial` (the page: readState() of its URL) with no subscribers. `write` replaces the
 * URL writer (tests count its calls); nothing is written until the first update.
 */
export function initState(initial = DEFAULT_STATE, { write: writer = writeState } = {}) {
  current = Object.freeze({ ...DEFAULT_STATE, ...initial });
  write = writer;
  listeners.clear();
  return current;
}

/**
 * The one writer: merge `patch`, write the URL once, then call each subscriber with (state, changed keys)
 * when any value changed. A field the state does not have is a bug and throws before anything changes.
 * Returns the set of changed keys.
 */
export function update(patch) {
  const unknown = Object.keys(patch).filter((key) => !Object.hasOwn(DEFAULT_STATE, key));
  if (unknown.length) throw new TypeError(`unknown state field(s) ${unknown.join(", ")}`);
  const changed = new Set(Object.keys(patch).filter((key) => !Object.is(current[key], patch[key])));
  current = Object.freeze({ ...current, ...patch });
  write(current); // also when nothing changed: a URL with malformed values is written out clean
  if (changed.size) for (const listener of [...listeners]) listener(current, changed);
  return changed;
}

/** Call `listener(state, changed)` after every update that changes something; returns the unsubscribe. */
export function subscribe(listener) {
  listeners.add(listener);
  return () => listeners.delete(listener);
}

/** The selection moved inside a model of `layers` x `heads`: layer clamped, a head index clamped. */
export function clampSelection({ layer, head }, { layers, heads }) {
  return {
    layer: Math.min(Math.max(0, layer), layers - 1),
    head: isAggregate(head) ? head : Math.min(Math.max(0, head), heads - 1),
  };
}

/**
 * The selection after an arrow key, or null for any other key. Left/right: the neighbouring column (the
 * aggregate columns come after the heads, as in the grid); up/down: the neighbouring layer. Edges hold.
 */
export function moveSelection({ layer, head }, key, { layers, heads }) {
  const columns = [...Array(heads).keys(), ...Object.keys(AGGREGATES)];
  const col = Math.max(0, columns.indexOf(head));
  if (key === "ArrowLeft") return { layer, head: columns[Math.max(0, col - 1)] };
  if (key === "ArrowRight") return { layer, head: columns[Math.min(columns.length - 1, col + 1)] };
  if (key === "ArrowUp") return { layer: Math.max(0, layer - 1), head };
  if (key === "ArrowDown") return { layer: Math.min(layers - 1, layer + 1), head };
  return null;
}
