// A slow answer's progress (docs/http-api.md, /api/attention/progress). The page asks for an answer
// as ever; when it has not come after a while, it watches the work in flight for the same input
// (POST /api/attention/progress, NDJSON): a model's load shows as a bar at once, the forward's layers once
// the run has taken FORWARD_MS, beside the Cancel button, which aborts the run (its request closes and the
// server's forward stops before its next layer). A fast answer shows nothing: no watch even starts. The bar
// and its Cancel are the long inputs' trace bar (long-mode.js), drawn here for both.

import { body } from "./api.js";
import { $ } from "./dom.js";
import { streamProgress } from "./progress-stream.js";

export const LOAD_MS = 1000; // a model still to load: a load over about a second shows its bar
export const FORWARD_MS = 2000; // a forward over about two seconds shows its layers and Cancel

/** "Layer 12 of 30" as layer 11 (0-based) starts; a later pass of a continuation says which. Pure. */
export function layerView({ layer, layers, pass = 0 }) {
  const text = `Layer ${layer + 1} of ${layers}${pass ? ` (pass ${pass + 1})` : ""}`;
  return { text, value: layer, max: layers };
}

/**
 * What the bar shows for a progress line of /api/attention/progress `elapsed` ms into the run: a load at
 * once, a layer from FORWARD_MS on; null: nothing (yet). Pure (tests/js/).
 */
export function progressView(event, elapsed) {
  if (event?.event === "load") {
    // Nothing measured yet (a GGUF's config, read on its first load, reports only as its parts end): an
    // indeterminate bar, which moves, rather than "0 %", which reads as stuck.
    if (!(event.step > 0)) return { text: `Loading ${event.model}…` };
    const percent = Math.floor((100 * event.step) / Math.max(event.steps, 1));
    return { text: `Loading ${event.model}: ${percent} %`, value: event.step, max: event.steps };
  }
  if (event?.event === "progress" && elapsed >= FORWARD_MS) return layerView(event);
  return null;
}

/** How long a run waits for its answer before it watches: a loaded model cannot show a load. Pure. */
export function watchDelay(loaded) {
  return loaded ? FORWARD_MS : LOAD_MS;
}

/** The bar: `{text, value, max}`, or `{text}` alone while nothing is measured yet (indeterminate). */
export function showBar({ text, value, max }) {
  const bar = $("traceBar");
  $("traceProgress").hidden = false;
  $("traceLabel").textContent = text;
  if (value === undefined) {
    bar.removeAttribute("value"); // indeterminate
    for (const name of ["aria-valuenow", "aria-valuemax", "aria-valuetext"]) bar.removeAttribute(name);
    return;
  }
  bar.max = max;
  bar.value = value;
  bar.setAttribute("aria-valuemax", String(max));
  bar.setAttribute("aria-valuenow", String(value));
  bar.setAttribute("aria-valuetext", text);
}

export function hideBar() {
  $("traceProgress").hidden = true;
}

/**
 * Watch `query`'s work while its answer is awaited (`loaded`: its model is loaded already); returns stop(),
 * to call once the answer came or failed. The watch's own request is never aborted: it ends by itself once
 * the work ends (an answer, or a run aborted), and its lines are ignored once stopped.
 */
export function watchWork(query, { loaded }) {
  const started = performance.now();
  let stopped = false;
  let latest = null;
  const show = () => {
    if (stopped) return;
    const view = progressView(latest, performance.now() - started);
    if (view) showBar(view);
    else if (performance.now() - started >= FORWARD_MS) showBar({ text: "Waiting for the model…" }); // queued, or no line yet
  };
  const watch = setTimeout(() => {
    const onProgress = (event) => ((latest = event), show());
    const options = { onProgress, onLoad: onProgress, failed: "", ended: "" };
    // A courtesy: a watch that fails changes nothing of the run.
    streamProgress("/api/attention/progress", body(query), options).catch(() => {});
  }, watchDelay(loaded));
  const forward = setTimeout(show, FORWARD_MS); // the latest line, or that the model runs
  return () => {
    if (stopped) return;
    stopped = true;
    clearTimeout(watch);
    clearTimeout(forward);
    hideBar();
  };
}

/** `work()` awaited with `query`'s work watched meanwhile (watchWork), the watch stopped however it ends. */
export async function watched(query, loaded, work) {
  const stop = watchWork(query, { loaded });
  try {
    return await work();
  } finally {
    stop();
  }
}
