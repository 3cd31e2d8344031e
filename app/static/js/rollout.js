// Whole-model views in #analysis: attention rollout (final, and cumulative after each layer through a
// slider) from POST /api/rollout/compact, decoded by the attention decoder (heads = 1), drawn by the
// head heatmap code; attention flow on request from POST /api/flow, offered up to the service's token limit
// (the button says it, and is off above it, with the reason as a note rather than an error).
//
// The rollout panel sits below the grid and the detail, usually off screen after a run: it is fetched when
// the panel comes on screen (at once when it already is), so a run's first view moves only what it shows.
// #rollout's data-state says where it is: idle (waiting to be shown), loading, ready or error.
// Every fetch carries the watched run's AbortSignal: a new run aborts them, and nothing of the old run draws.

import { ApiError, fetchFlow, fetchRollout } from "./api.js";
import { clearHeatmap, renderHeatmap } from "./heatmap.js";
import { getState } from "./state.js";
import { weightingOf } from "./weighting.js";
import { flowButtonLabel, flowLimitNote } from "./truth.js";

const SIDE_MIN_PX = 280; // side-by-side with the statistics table: smaller than the detail's minimum

/** "0.5·A + 0.5·I per layer" for the identity weight the rollout header states (its `residual`). */
export function rolloutMix(residual) {
  if (!Number.isFinite(residual)) return "the residual stream mixed into each layer";
  const weight = (w) => String(Number(w.toFixed(3))); // 1 - 0.3 prints 0.7, not 0.7000000000000001
  return `${weight(1 - residual)}·A + ${weight(residual)}·I per layer`;
}

export class RolloutView {
  /**
   * `els`: {panel, plot, slider, sliderValue, caption, flowButton, flowMessage, flowNormalized, flowPlot};
   * `flowLimit`: the most tokens (or words) /api/flow takes (the page's limits.flow_max_tokens).
   */
  constructor(els, { flowLimit = null } = {}) {
    this.els = els;
    this.flowLimit = flowLimit;
    this.flowOver = false; // the watched input is over flowLimit: the button stays off
    this.rollout = null;
    this.flowResult = null; // both forms of the last flow answer: the switch redraws without a request
    this.query = null;
    this.shape = { causal: false, boundary: -1 }; // of the watched input: {causal, boundary, byteLevel, n}
    this.signal = null; // the watched run's
    this.observer = new IntersectionObserver((entries) => {
      if (entries.some((entry) => entry.isIntersecting)) this.load();
    });
    els.plot.dataset.state = "idle";
    els.slider.addEventListener("input", () => this.draw(Number(els.slider.value)));
    els.flowButton.addEventListener("click", () => this.flow());
    els.flowNormalized.addEventListener("change", () => {
      if (this.flowResult) this.drawFlow(this.flowResult);
    });
  }

  clear() {
    this.observer.disconnect();
    this.rollout = null;
    this.flowResult = null;
    const { flowPlot, flowMessage, plot, caption, slider } = this.els;
    clearHeatmap(plot);
    clearHeatmap(flowPlot);
    flowPlot.hidden = true;
    flowMessage.textContent = "";
    caption.textContent = "";
    slider.disabled = true;
    delete plot.dataset.layer;
    plot.dataset.state = "idle";
  }

  /** No rollout for the attention on screen (a seq2seq decoder's or cross): `note` says why, flow is off too. */
  off(note) {
    this.clear();
    const { caption, flowButton, flowMessage, plot } = this.els;
    caption.textContent = note;
    flowButton.disabled = true;
    flowButton.title = note;
    flowMessage.textContent = "";
    plot.dataset.state = "off";
  }

  /**
   * Follow `query` (`shape`: {causal, boundary} of its attention) for the run of `signal`: its rollout
   * loads once the panel shows, unless the run was aborted first.
   */
  watch(query, shape, { signal }) {
    this.clear();
    Object.assign(this, { query, shape, signal });
    const { flowButton, flowMessage } = this.els;
    const over = flowLimitNote(shape.n, this.flowLimit, query.words);
    this.flowOver = Boolean(over);
    flowButton.disabled = this.flowOver; // flow is its own request, on demand, within its limit
    flowButton.textContent = flowButtonLabel(this.flowLimit, query.words);
    flowButton.title = over ?? "Compute attention flow for this input";
    flowMessage.textContent = over ?? "";
    if (over) flowMessage.dataset.state = "limit";
    else delete flowMessage.dataset.state;
    signal.addEventListener("abort", () => this.observer.disconnect(), { once: true });
    this.observer.observe(this.els.panel); // reports at once when the panel is already on screen
  }

  /** Fetch and draw the watched rollout (after its final layer). Resolves false when its run was aborted. */
  async load() {
    this.observer.disconnect();
    const { signal } = this;
    const { plot, slider, caption } = this.els;
    plot.dataset.state = "loading";
    caption.textContent = "Computing attention rollout…";
    try {
      const rollout = await fetchRollout(this.query, { signal });
      if (signal.aborted) return false;
      this.rollout = rollout;
      slider.max = String(rollout.layers - 1);
      slider.value = String(rollout.layers - 1);
      slider.disabled = rollout.layers < 2;
      await this.draw(rollout.layers - 1);
      if (signal.aborted) return false;
      plot.dataset.state = "ready";
      return true;
    } catch (error) {
      if (signal.aborted) return false;
      caption.textContent = `Rollout unavailable: ${error.message}`;
      plot.dataset.state = "error";
      return false;
    }
  }

  /** Draw the cumulative rollout after `layer` (0-based; the last is the final rollout R). */
  async draw(layer) {
    const rollout = this.rollout;
    if (!rollout) return;
    const { plot, sliderValue, caption } = this.els;
    const last = layer === rollout.layers - 1;
    sliderValue.textContent = `${layer}${last ? " (final)" : ""}`;
    caption.textContent =
      `Row i: how much output token i after layer ${layer} draws on input token j, through every head ` +
      `and the residual stream (heads averaged, ${rolloutMix(rollout.header.residual)}). ` +
      `${rollout.bits}-bit values (within ±${rollout.maxAbsError.toFixed(4)}).` +
      (weightingOf(rollout) === "norm" ? " Chained from weight × value norm shares, not weights." : "");
    await renderHeatmap(plot, {
      tokens: rollout.tokens,
      values: rollout.headInto(layer, 0),
      causal: rollout.causal,
      boundary: rollout.boundary,
      segments: rollout.segments,
      special: rollout.special,
      byteLevel: rollout.byteLevel,
      exact: false,
      title: `${rollout.model} · rollout after layer ${layer}${last ? " (final)" : ""}`,
      filename: `headscope-rollout-L${layer}`,
      keepZoom: true,
      minPx: SIDE_MIN_PX,
      scale: { title: `rollout${weightingOf(rollout) === "norm" ? " of norm shares" : ""} (${rollout.bits}-bit)` },
      colorScale: getState().scale, // the detail's colour scale: its colour bar says which
    });
    plot.dataset.layer = String(layer);
  }

  /** Draw one form of a flow answer, as the "Rows normalised" switch says, and say which it is. */
  async drawFlow(result) {
    const { flowMessage, flowPlot, flowNormalized } = this.els;
    const normalized = flowNormalized.checked;
    flowPlot.hidden = false;
    flowPlot.dataset.form = normalized ? "normalized" : "raw";
    await renderHeatmap(flowPlot, {
      tokens: result.tokens,
      values: normalized ? result.flow_normalized : result.flow,
      causal: this.shape.causal,
      boundary: this.shape.boundary,
      byteLevel: this.shape.byteLevel,
      exact: true,
      title: `${result.model} · attention flow (${normalized ? "rows normalised" : "raw max-flow"})`,
      filename: normalized ? "headscope-flow-normalized" : "headscope-flow-raw",
      keepZoom: false,
      minPx: SIDE_MIN_PX,
      scale: { title: normalized ? "flow share" : "max-flow" },
      colorScale: getState().scale,
    });
    flowMessage.textContent = normalized
      ? "Row i: the share of output token i's flow that reaches each input token (each row sums to 1, as published)."
      : "Entry [i, j]: the most attention that can flow from output token i to input token j (raw; rows need not sum to 1).";
    if (this.query?.weighting === "norm") flowMessage.textContent += " Through weight × value norm shares, not weights.";
    flowMessage.dataset.state = "ready";
  }

  /** Redraw what is drawn (rollout, flow) in the state's colour scale. */
  async recolor() {
    if (this.rollout) await this.draw(Number(this.els.slider.value));
    if (this.flowResult) await this.drawFlow(this.flowResult);
  }

  /** Attention flow of the loaded query; a refusal (422: a limit the page did not know) is said as a note. */
  async flow() {
    if (!this.query) return;
    const { signal } = this;
    const { flowButton, flowMessage } = this.els;
    flowButton.disabled = true;
    flowMessage.textContent = "Computing attention flow…";
    flowMessage.dataset.state = "loading";
    try {
      const result = await fetchFlow(this.query, { signal });
      if (signal.aborted) return;
      this.flowResult = result;
      await this.drawFlow(result);
    } catch (error) {
      if (signal.aborted) return;
      // 422 is a fact about this input (its length), not a fault: a note, in the service's words.
      const refused = error instanceof ApiError && error.status === 422;
      flowMessage.textContent = refused ? error.message : `Attention flow failed: ${error.message}`;
      flowMessage.dataset.state = refused ? "limit" : "error";
    } finally {
      if (!signal.aborted) flowButton.disabled = this.flowOver;
    }
  }
}
