// Export of the run on screen: the detail figure as PNG or SVG (Plotly), the token lines as SVG, every head
// as JSON (POST /api/attention) or the selected head alone as JSON (POST /api/attention/head), under the
// run's AbortSignal, with the tokens as the page spells them beside the raw ones (display_tokens). Each file
// is named for what it holds (labels.js). "Save as HTML" downloads the run as one offline file opening on
// the selected head (POST /api/snapshot), named by the server.

import { $, el } from "./dom.js";
import { ApiError, fetchFullBlob, fetchHeadBlob, fetchSnapshotBlob } from "./api.js";
import { AGGREGATES, isAggregate } from "./aggregates.js";
import { setBusy, showError } from "./form.js";
import { withDisplayTokens } from "./decoder.js";
import { exportImage } from "./heatmap.js";
import { allHeadsName, exportName, headJsonName, tokenLinesName } from "./labels.js";
import { fileModel, isSeq2seq, shapeOf } from "./seq2seq.js";
import { getState } from "./state.js";
import { weightingOf } from "./weighting.js";

/** Save `blob` as `filename` (a link clicked, then let go). */
export function download(blob, filename) {
  const url = URL.createObjectURL(blob);
  const a = el("a", { attrs: { href: url, download: filename } });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

/**
 * n*cols row-major values (cols = n unless rectangular) as n rows of numbers, rounded to 6 decimals as the
 * API's JSON answers are.
 */
export function matrixRows(values, n, cols = n) {
  const row = (i) => Array.from(values.subarray(i * cols, (i + 1) * cols), (v) => +v.toFixed(6));
  return Array.from({ length: n }, (_, i) => row(i));
}

// An aggregate is computed in the page from the quantized grid data: the file says so and gives the error bound
// (a mean of values each within ±e is within ±e), and which values they are (weights or norm shares).
function aggregateBlob(attention, layer, head) {
  const { tokens } = attention;
  const { rows, cols } = shapeOf(attention);
  const values = AGGREGATES[head].compute(attention, layer);
  // An encoder-decoder's section says which one, and cross-attention's keys are the source's tokens.
  const seq2seq = isSeq2seq(attention) ? { kind: attention.kind, key_tokens: attention.keyTokens } : {};
  const weighting = weightingOf(attention);
  const norm = weighting === "norm";
  const doc = {
    model: attention.model,
    tokens,
    ...seq2seq,
    layer,
    head,
    weighting, // as the API's answers say it
    description: `${AGGREGATES[head].title}, from the page's ${attention.bits}-bit ${norm ? "weight × value norm shares" : "values"}`,
    max_abs_error: attention.maxAbsError,
    attention: matrixRows(values, rows, cols),
  };
  return new Blob([JSON.stringify(doc)], { type: "application/json" });
}

// The JSON of every head and of one head is the API's answer, which says `"weighting": "norm"` (and gives
// `row_norms`) for norm shares; the file names say "-norm" too.
async function exportJson(run, { layer, head, alone }) {
  const { attention, query } = run;
  const words = Boolean(query.words);
  const weighting = weightingOf(attention);
  setBusy(alone ? "Preparing this head's JSON…" : "Preparing JSON of every head…");
  if (!alone) {
    const blob = await fetchFullBlob(query, { signal: run.signal });
    // Every head of every kind: its `tokens` are the source's, those of the answer's first Attention.
    download(withDisplayTokens(blob, run.full ?? attention), allHeadsName(attention.model, { words, weighting }));
  } else if (isAggregate(head)) {
    const blob = withDisplayTokens(aggregateBlob(attention, layer, head), attention);
    download(blob, headJsonName(fileModel(attention), layer, head, { words, weighting }));
  } else {
    const blob = await fetchHeadBlob(query, layer, head, { signal: run.signal });
    download(withDisplayTokens(blob, attention), headJsonName(fileModel(attention), layer, head, { words, weighting }));
  }
  setBusy("");
}

// The snapshot is built on the server (a second or more for a large run): meanwhile the button says so and
// is off (aria-disabled, not `disabled`, which the long-input view sets and clears on its own), so one press
// builds one file.
async function exportHtml(run, { layer, head }) {
  const button = $("exportHtml");
  if (button.getAttribute("aria-busy") === "true") return;
  const label = button.textContent;
  button.setAttribute("aria-busy", "true");
  button.setAttribute("aria-disabled", "true");
  button.textContent = "Saving…";
  setBusy("Building the HTML file: every head of this run…");
  try {
    const { blob, filename } = await fetchSnapshotBlob(run.query, layer, head, { signal: run.signal });
    download(blob, filename);
    setBusy("");
  } finally {
    button.removeAttribute("aria-busy");
    button.removeAttribute("aria-disabled");
    button.textContent = label;
  }
}

/**
 * Export `run` (null before the first run) as "png", "svg", "json" (every head), "json-head" (this head) or
 * "html" (the run as one offline file).
 */
export async function exportAs(run, format) {
  if (!run) {
    showError("Run a sentence first, then export it.");
    return;
  }
  showError("");
  const { layer, head, view, lines } = getState();
  const weighting = run.long ? "weight" : weightingOf(run.attention); // the figure's colour bar says it too
  const name = exportName(fileModel(run.attention), layer, head, { weighting });
  try {
    if (format === "json" || format === "json-head") {
      await exportJson(run, { layer, head, alone: format === "json-head" });
    } else if (format === "html") {
      await exportHtml(run, { layer, head });
    } else if (view === "tokens" && format === "svg") {
      const source = new XMLSerializer().serializeToString($("tokenView").querySelector("svg.token-lines"));
      const file = tokenLinesName(fileModel(run.attention), layer, head, { allHeads: lines === "layer", weighting });
      download(new Blob([source], { type: "image/svg+xml" }), file);
    } else {
      await exportImage($("headDetail"), format, name);
    }
  } catch (error) {
    if (run.signal.aborted) return; // a new run took over; its own status line stays
    setBusy("");
    showError(error instanceof ApiError ? error.message : `Export failed: ${error.message}`);
  }
}
