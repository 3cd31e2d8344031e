// Whole-model views in #analysis: attention rollout (final, and cumulative after each layer through a
// slider) from POST /api/rollout/compact, decoded by the attention decoder (heads = 1), drawn by the
// head heatmap code; attention flow on request from POST /api/flow, whose 422 for long inputs is shown
// as a note in words, not as an error.

import { ApiError, fetchFlow, fetchRollout } from "./api.js";
import { clearHeatmap, renderHeatmap } from "./heatmap.js";

const SIDE_MIN_PX = 280; // side-by-side with the statistics table: smaller than the detail's minimum

export class RolloutView {
  /** `els`: {plot, slider, sliderValue, caption, flowButton, flowMessage, flowPlot}. */
  constructor(els) {
    this.els = els;
    this.rollout = null;
    this.query = null;
    this.generation = 0;
    els.slider.addEventListener("input", () => this.draw(Number(els.slider.value)));
    els.flowButton.addEventListener("click", () => this.flow());
  }

  clear() {
    this.generation++;
    this.rollout = null;
    const { flowPlot, flowMessage, plot } = this.els;
    clearHeatmap(plot);
    clearHeatmap(flowPlot);
    flowPlot.hidden = true;
    flowMessage.textContent = "";
    delete plot.dataset.layer;
  }

  /** Fetch and draw the rollout of `query` (after its final layer). Resolves false when superseded. */
  async load(query) {
    this.clear();
    const generation = this.generation;
    this.query = query;
    const rollout = await fetchRollout(query);
    if (generation !== this.generation) return false;
    this.rollout = rollout;
    const { slider, flowButton } = this.els;
    slider.max = String(rollout.layers - 1);
    slider.value = String(rollout.layers - 1);
    slider.disabled = rollout.layers < 2;
    flowButton.disabled = false;
    await this.draw(rollout.layers - 1);
    return true;
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
      `and the residual stream (heads averaged, 0.5·A + 0.5·I per layer). 8-bit values (within ±${rollout.maxAbsError.toFixed(4)}).`;
    await renderHeatmap(plot, {
      tokens: rollout.tokens,
      values: rollout.headInto(layer, 0),
      causal: rollout.causal,
      boundary: rollout.boundary,
      segments: rollout.segments,
      special: rollout.special,
      exact: false,
      title: `${rollout.model} · rollout after layer ${layer}${last ? " (final)" : ""}`,
      filename: `headscope-rollout-L${layer}`,
      keepZoom: true,
      minPx: SIDE_MIN_PX,
      scale: { title: "rollout (8-bit)" },
    });
    plot.dataset.layer = String(layer);
  }

  /** Attention flow of the loaded query; the API's limit (422) becomes the message itself. */
  async flow() {
    if (!this.query) return;
    const generation = this.generation;
    const { flowButton, flowMessage, flowPlot } = this.els;
    flowButton.disabled = true;
    flowMessage.textContent = "Computing attention flow…";
    flowMessage.dataset.state = "loading";
    try {
      const result = await fetchFlow(this.query);
      if (generation !== this.generation) return;
      flowPlot.hidden = false;
      await renderHeatmap(flowPlot, {
        tokens: result.tokens,
        values: result.flow,
        causal: Boolean(this.rollout?.causal),
        boundary: this.rollout?.boundary ?? -1,
        exact: true,
        title: `${result.model} · attention flow`,
        filename: "headscope-flow",
        keepZoom: false,
        minPx: SIDE_MIN_PX,
        scale: { title: "max-flow" },
      });
      flowMessage.textContent = "Entry [i, j]: the most attention that can flow from output token i to input token j (rows need not sum to 1).";
      flowMessage.dataset.state = "ready";
    } catch (error) {
      if (generation !== this.generation) return;
      // 422 is the length limit: a fact about this input, said in the API's words.
      flowMessage.textContent =
        error instanceof ApiError && error.status === 422 ? error.message : `Attention flow failed: ${error.message}`;
      flowMessage.dataset.state = error instanceof ApiError && error.status === 422 ? "limit" : "error";
    } finally {
      if (generation === this.generation) flowButton.disabled = false;
    }
  }
}
