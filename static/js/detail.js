// Head detail: the selected head (or aggregate) of a run as a heatmap or token lines, first from the 8-bit
// grid data, then, for a head a person settles on, from its exact float32 values (fetched by itself up to
// AUTO_EXACT_MAX_N tokens, on request above it).

import { $, $all } from "./dom.js";
import { fetchHead } from "./api.js";
import { AGGREGATES, isAggregate } from "./aggregates.js";
import { markWritten, withoutFirstToken } from "./decoder.js";
import { renderHeatmap } from "./heatmap.js";
import { exportName, selectionLabel } from "./labels.js";
import { getState } from "./state.js";
import { renderTokenView } from "./tokens.js";

const EXACT_DELAY_MS = 350; // wait for arrow-key bursts to settle before asking for exact values
// The exact head is binary float32, ~3.3 bytes a value after gzip: fetched by itself up to this n (~220 KB),
// on request above it (~0.85 MB at 512 tokens, for every head a person settles on).
export const AUTO_EXACT_MAX_N = 256;

/** Mark the tab of `view` selected. */
export function showTabs(view) {
  for (const tab of $all("tabs")) tab.setAttribute("aria-selected", String(tab.dataset.view === view));
}

/**
 * n*n values of (layer, head) in `run`: the exact head when it arrived, else the 8-bit grid data. The
 * caller renormalises without the first token when the state asks for it.
 */
function detailValues(run, layer, head) {
  const { attention } = run;
  if (isAggregate(head)) return { values: AGGREGATES[head].compute(attention, layer), exact: false };
  const exact = run.exact.get(`${layer}:${head}`);
  if (exact) return { values: exact, exact: true };
  return { values: attention.headInto(layer, head), exact: false };
}

export class Detail {
  /** `written`: the WrittenView that follows the selected head (written.js). */
  constructor({ written }) {
    this.written = written;
    this.run = null; // the run last drawn
    this.timer = 0;
    this.controller = null; // the exact head in flight; a newer selection aborts it
    $("exact").addEventListener("click", () => {
      if (!this.run) return;
      const { layer, head } = getState();
      $("exact").hidden = true;
      $("detailCaption").textContent = "Loading exact values…";
      this.scheduleExact(this.run, layer, head, 0);
    });
  }

  /** Draw the state's selection of `run`; `keepZoom` false for a new run, which starts unzoomed. */
  async draw(run, { keepZoom = true } = {}) {
    this.run = run;
    const { attention } = run;
    const { layer, head, view, hideFirst } = getState();
    const { values: drawn, exact } = detailValues(run, layer, head);
    const values = hideFirst ? withoutFirstToken(drawn, attention.n) : drawn;
    const modelName = attention.model ?? run.query.model ?? "";
    const label = selectionLabel(layer, head, attention);
    $("detailTitle").textContent = `Head detail: ${label}`;
    const notes = [
      exact
        ? "Exact float32 values."
        : `8-bit values (within ±${attention.maxAbsError.toFixed(4)})${
            isAggregate(head) || attention.n > AUTO_EXACT_MAX_N ? "" : "; exact values on the way"
          }.`,
    ];
    if (attention.truncated) notes.push(`Input truncated to ${attention.n} tokens (the model's maximum).`);
    if (attention.causal) notes.push("Hatched cells are masked: a causal model cannot look ahead.");
    if (hideFirst) notes.push("First token hidden (grey): each row renormalised over the rest.");
    if (attention.generated > 0) {
      notes.push(
        `✎ marks the ${attention.generated} token(s) the model wrote (orange bands); click one's row to see what it looked at.`,
      );
    }
    notes.push(view === "heatmap" ? "Drag to zoom, double-click to reset." : "Hover a token to isolate its lines.");
    $("detailCaption").textContent = notes.join(" ");

    const heatmapVisible = view === "heatmap";
    $("detailScroll").hidden = !heatmapVisible;
    $("tokenView").hidden = heatmapVisible;
    showTabs(view);
    $("exportPng").disabled = !heatmapVisible;

    const spec = {
      tokens: markWritten(attention.tokens, attention.generated),
      values,
      causal: attention.causal,
      boundary: attention.boundary,
      segments: attention.segments,
      special: attention.special,
      exact,
      title: `${modelName} · ${label}`,
      written: attention.generated,
      byteLevel: attention.byteLevel,
      renormalised: hideFirst,
      onRow: (i) => this.written.choose(i),
      filename: exportName(attention.model, layer, head),
      keepZoom, // a new run starts unzoomed; another head of the same run keeps the zoomed region
    };
    if (heatmapVisible) {
      await renderHeatmap($("headDetail"), spec);
    } else {
      renderTokenView($("tokenView"), spec);
    }
    this.written.show(run, values, { head: label, renormalised: hideFirst });
    const wantsExact = !exact && !isAggregate(head);
    $("exact").hidden = !(wantsExact && attention.n > AUTO_EXACT_MAX_N);
    if (wantsExact && attention.n <= AUTO_EXACT_MAX_N) this.scheduleExact(run, layer, head);
    else if (!wantsExact) this.cancelExact();
  }

  cancelExact() {
    clearTimeout(this.timer);
    this.controller?.abort();
    this.controller = null;
  }

  // Full precision for the head a person settled on (POST /api/attention/head/compact, binary float32), then
  // redraw. A newer selection cancels the wait and the fetch; a new run aborts the fetch with its own.
  scheduleExact(run, layer, head, delay = EXACT_DELAY_MS) {
    this.cancelExact();
    const controller = new AbortController();
    this.controller = controller;
    const signal = AbortSignal.any([run.signal, controller.signal]);
    this.timer = setTimeout(async () => {
      try {
        const exact = await fetchHead(run.query, layer, head, { signal });
        if (run.signal.aborted) return; // arrived for a newer selection: kept, in case it comes back
        run.exact.set(`${layer}:${head}`, exact.headInto(0, 0));
        const state = getState();
        if (state.layer === layer && state.head === head) await this.draw(run);
      } catch (error) {
        if (signal.aborted) return;
        // The quantized view stays usable; say why exact values are missing.
        $("detailCaption").textContent += ` Exact values unavailable: ${error.message}`;
      }
    }, delay);
  }
}
