// The view state lives in the URL query string so a reload or a shared link restores the same view.
// history.replaceState keeps the back button for real navigation instead of every click.

import { isAggregate } from "./aggregates.js";

const VIEWS = ["heatmap", "tokens"];

export const DEFAULT_STATE = Object.freeze({
  text: "",
  pair: "",
  model: "",
  layer: 0,
  head: 0,
  view: "heatmap",
});

function parseIndex(value, fallback) {
  if (value === null || !/^\d{1,4}$/.test(value)) return fallback;
  return Number(value);
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
  };
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
  return params.toString();
}

/** Replace the current history entry's URL with `state`. */
export function writeState(state) {
  const url = `${window.location.pathname}?${encodeState(state)}`;
  window.history.replaceState(null, "", url);
}
