// The "Which heads matter" panel in #analysis: on request (it costs about L·H/2 forwards), each head's
// output zeroed in turn and the change in the model's output measured (POST /api/head-effects). Drawn as
// an L x H map coloured on a log scale, the heads of largest effect as chips, and an "effect" column in the
// statistics table (onColumn), all naming the output they refer to. Clicking a head opens it.
// #effects-panel's data-state: idle, loading, ready or error. A measurement carries the run's AbortSignal: a
// new run aborts it (closing the stream stops the server's work). An encoder-decoder's answer holds the
// heads of its three attentions: the panel shows those of the kind on screen.

import { STAT_GRADIENT, statColor } from "./colors.js";
import { el } from "./dom.js";
import { effectOutputs, effectsBody, formatEffect, logScale, measureText, streamEffects, topHeads } from "./effects.js";
import { shortHeadLabel } from "./labels.js";
import { runPanel } from "./panel-run.js";
import { KIND_LABELS } from "./seq2seq.js";

export const EFFECT = "effect"; // the statistics table's column
const TOP = 5; // heads listed as chips

export class EffectsView {
  /**
   * `els`: {panel, button, cancel, progress, message, outputField, output, caption, map, legend, top, ranking};
   * onOpen(layer, head) selects a head; onColumn(column or null) gives the statistics table its column.
   */
  constructor(els, { onOpen, onColumn }) {
    this.els = els;
    this.onOpen = onOpen;
    this.onColumn = onColumn;
    this.query = null; // the watched run's
    this.kind = "encoder"; // an encoder-decoder's kind on screen (its heads are shown)
    this.signal = null;
    this.body = ""; // effectsBody of the watched input, as JSON: a result of the same input is kept
    this.controller = null; // aborts the measurement in flight
    this.result = null;
    this.outputs = [];
    this.selected = null; // [layer, head] shown in the detail
    els.panel.dataset.state = "idle";
    els.button.addEventListener("click", () => this.measure());
    els.output.addEventListener("change", () => this.draw());
    els.map.addEventListener("click", (event) => {
      const cell = event.target.closest("[data-head]");
      if (cell) this.onOpen(Number(cell.dataset.layer), Number(cell.dataset.head));
    });
  }

  /**
   * Follow `run` ({query, full, signal}): the button measures its input. A result for the same input
   * (another weighting, words or compare) stays on screen; any other is cleared.
   */
  watch(run) {
    this.controller?.abort();
    this.controller = null; // the aborted measurement leaves the panel to this
    this.query = run.query;
    this.signal = run.signal;
    const body = JSON.stringify(effectsBody(run.query));
    const { button, message, panel, progress } = this.els;
    progress.hidden = true;
    const kind = run.query.kind ?? "encoder";
    if (this.result && body === this.body) {
      button.disabled = false;
      panel.dataset.state = "ready";
      if (kind !== this.kind) {
        // Another kind of the same answer: its heads, the same output chosen where the list is the same.
        this.kind = kind;
        this.outputs = effectOutputs(this.result, kind);
        const chosen = this.els.output.value;
        this.fillOutputs();
        if (Number(chosen) < this.outputs.length) this.els.output.value = chosen;
        this.draw();
      }
      return;
    }
    this.clear();
    this.body = body;
    this.kind = kind;
    if (run.query.probe) {
      // Random tokens have no output worth measuring a loss of: the ablation takes a text.
      button.disabled = true;
      message.textContent = "Which heads matter measures a text: go back to your text to measure it.";
      panel.dataset.state = "idle";
      return;
    }
    button.disabled = false;
    button.title = "Zero each head's output in turn and measure what the output loses (about L·H/2 forwards)";
    panel.dataset.state = "idle";
  }

  clear() {
    const { map, legend, top, ranking, caption, outputField, output, message } = this.els;
    this.result = null;
    this.outputs = [];
    map.replaceChildren();
    map.hidden = true;
    legend.replaceChildren();
    legend.hidden = true;
    ranking.replaceChildren();
    top.hidden = true;
    caption.textContent = "";
    message.textContent = "";
    output.replaceChildren();
    outputField.hidden = true;
    this.onColumn(null);
  }

  /** Measure the watched input, with progress; a new run (or another click) aborts it. */
  async measure() {
    if (!this.query) return;
    await runPanel(this, {
      loading: "Zeroing each head in turn…",
      failed: "Measuring failed",
      // 422 is a fact about this input or model, not a fault: said in the service's words.
      refused: (error) => error.status === 422,
      request: (signal, onProgress) =>
        streamEffects(this.query, {
          signal,
          onProgress: ({ done, layers }) =>
            onProgress(done, layers, `Zeroing each head in turn: ${done} of ${layers} layers done…`),
        }),
      show: (result) => {
        this.outputs = effectOutputs(result, this.kind);
        this.fillOutputs();
        this.draw();
      },
    });
  }

  fillOutputs() {
    const { output, outputField } = this.els;
    output.replaceChildren(
      ...this.outputs.map(({ label }, i) => el("option", { text: label, attrs: { value: String(i) } })),
    );
    output.value = "0";
    outputField.hidden = this.outputs.length < 2; // the caption names a single one
  }

  /** Draw the chosen output's effects: map, legend, chips, caption, and the table's column. */
  draw() {
    const result = this.result;
    if (!result) return;
    const { map, legend, top, ranking, caption } = this.els;
    const { label, values } = this.outputs[Number(this.els.output.value) || 0];
    const scale = logScale(values);
    const heads = values[0]?.length ?? 0;
    const whose = result.sections ? ` Heads of the ${KIND_LABELS[this.kind].toLowerCase()}.` : "";
    caption.textContent =
      `Effect on the ${label}: each head's output zeroed in turn, ${measureText(result.measure)}` +
      `${result.truncated ? " (the input was cut to the service's limit)" : ""}.${whose} Colour on a log scale; click a head to open it.`;
    map.style.gridTemplateColumns = `max-content repeat(${heads}, minmax(12px, 40px))`;
    const cells = [el("span", { className: "effects-corner" })];
    for (let h = 0; h < heads; h++) cells.push(el("span", { className: "effects-axis", text: `H${h}` }));
    values.forEach((row, layer) => {
      cells.push(el("span", { className: "effects-axis", text: `L${layer}` }));
      row.forEach((value, head) => {
        const cell = el("span", {
          className: "effects-cell",
          attrs: { title: `L${layer} H${head}: ${formatEffect(value)}` },
          data: { layer, head, value: String(value) },
        });
        cell.style.background = statColor(scale.t(value));
        cells.push(cell);
      });
    });
    map.replaceChildren(...cells);
    map.hidden = false;
    const bar = el("span", { className: "legend-bar", attrs: { "aria-hidden": "true" } });
    bar.style.backgroundImage = STAT_GRADIENT;
    legend.replaceChildren(
      el("span", { className: "legend-name", text: "log scale" }),
      el("span", { className: "legend-min", text: scale.hi ? `≤ ${formatEffect(scale.lo)}` : "0" }),
      bar,
      el("span", { className: "legend-max", text: formatEffect(scale.hi) }),
    );
    legend.hidden = false;
    ranking.replaceChildren(
      ...topHeads(values, TOP).map(([layer, head, value]) => {
        const chip = el("button", {
          className: "chip",
          text: `${shortHeadLabel(layer, head)} ${formatEffect(value)}`,
          attrs: { type: "button", title: `Open layer ${layer}, head ${head}` },
          data: { layer, head },
        });
        chip.addEventListener("click", () => this.onOpen(layer, head));
        return el("li", {}, [chip]);
      }),
    );
    top.hidden = false;
    const unit = result.measure === "kl" ? "KL, nats" : "1 − cos";
    this.onColumn({
      key: EFFECT,
      name: `Effect if zeroed (${unit})`,
      help: `Each head's output zeroed: ${measureText(result.measure)}; on the ${label}.`,
      values,
      format: formatEffect,
    });
    if (this.selected) this.select(...this.selected);
  }

  /** Mark the head shown in the detail view. */
  select(layer, head) {
    this.selected = [layer, head];
    for (const cell of this.els.map.querySelectorAll(".effects-cell.selected")) cell.classList.remove("selected");
    this.els.map.querySelector(`[data-layer="${layer}"][data-head="${head}"]`)?.classList.add("selected");
  }
}
