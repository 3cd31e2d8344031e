// The "Find heads" panel in #analysis: on request, the field's head probe (POST /api/probe: a seeded random
// sequence repeated once, every head scored by the previous-token, duplicate-token and induction patterns)
// drawn as a scatter of every head, one point a head, coloured by layer, on two chosen axes (the three
// scores, or the text on screen's head statistics), with each score's chance level as a line; the heads the
// probe labels as chips, best first; CSV and JSON exports. Clicking a point or a chip opens that head on
// the probe's own input (probe-input.js).
// #probe-panel's data-state: idle, loading, ready or error. The probe is in the URL (probe=heads&seed=0):
// a link reopens it. It depends on the model alone, so a new text keeps it; another model clears it.

import { statColor } from "./colors.js";
import { el } from "./dom.js";
import { download } from "./export.js";
import {
  DEFAULT_AXES, KIND_NAMES, PROBE_KINDS, axesOf, chanceLevels, chanceText, formatScore, parseSeed, probeBody,
  probeCsv, probeFileName, rankHeads, scatterTraces, streamProbe,
} from "./probe.js";
import { shortHeadLabel } from "./labels.js";
import { runPanel } from "./panel-run.js";
import { getState, update } from "./state.js";

const TOP = 5; // heads listed as chips, per kind
const PLOT_CONFIG = { displaylogo: false, showSendToCloud: false, responsive: true, showTips: false };

export class ProbeView {
  /**
   * `els`: {panel, seed, sequences, button, cancel, progress, message, xAxis, yAxis, plot, caption, top, csv, json};
   * onOpen(layer, head, model) opens a head on the probe's input of the probed model; `stats()` is the text on screen's head
   * statistics ({key: L x H}),
   * `nameOf(key)` a statistic's name.
   */
  constructor(els, { onOpen, stats, nameOf }) {
    this.els = els;
    this.onOpen = onOpen;
    this.stats = stats;
    this.nameOf = nameOf;
    this.model = null; // the watched run's model ("" the default)
    this.signal = null;
    this.controller = null;
    this.result = null;
    els.panel.dataset.state = "idle";
    els.button.addEventListener("click", () => this.probe());
    for (const select of [els.xAxis, els.yAxis]) select.addEventListener("change", () => this.draw());
    els.csv.addEventListener("click", () => this.save("csv"));
    els.json.addEventListener("click", () => this.save("json"));
  }

  /** Follow `run`: its model is the one probed. Another model clears the result; a link's probe runs. */
  watch(run) {
    if (this.els.panel.hidden) return; // a snapshot file: the probe needs a server (snapshot-page.js)
    const model = run.query.model || "";
    this.signal = run.signal;
    if (model !== this.model) {
      this.controller?.abort();
      this.clear();
      this.model = model;
    } else if (this.result) {
      this.fillAxes(); // the new text's statistics join the axes
      this.draw();
    }
    const { probe, seed, sequences } = getState();
    this.els.seed.value = String(seed);
    this.els.sequences.value = String(sequences);
    if (probe === "heads" && !this.result && !this.controller) this.probe();
  }

  clear() {
    const { plot, top, caption, message, panel } = this.els;
    this.result = null;
    window.Plotly?.purge(plot);
    plot.hidden = true;
    top.replaceChildren();
    caption.textContent = "";
    message.textContent = "";
    for (const part of this.els.panel.querySelectorAll(".probe-result")) part.hidden = true;
    panel.dataset.state = "idle";
  }

  /** The seed and sequences asked for, or null (the message says why). */
  asked() {
    const seed = parseSeed(this.els.seed.value);
    const sequences = Number(this.els.sequences.value);
    if (seed === null) return this.refuse("The seed is a whole number from 0 to 4294967295.");
    if (!Number.isInteger(sequences) || sequences < 1 || sequences > 32) return this.refuse("Sequences: 1 to 32.");
    return { seed, sequences };
  }

  refuse(text) {
    this.els.message.textContent = text;
    this.els.panel.dataset.state = "error";
    return null;
  }

  /** Run the probe on the watched model, with progress; a new model (or another click) aborts it. */
  async probe() {
    const asked = this.asked();
    if (!asked || this.model === null) return;
    await runPanel(this, {
      loading: "Probing every head on a repeated random sequence…",
      failed: "Probing failed",
      refused: (error) => error.status < 500, // the service's own words
      request: (signal, onProgress) => {
        update({ probe: "heads", seed: asked.seed, sequences: asked.sequences });
        return streamProbe(probeBody({ model: this.model, ...asked }), {
          signal,
          onProgress: ({ done, chunks }) =>
            onProgress(done, chunks, `Probing every head: ${done} of ${chunks} batches of sequences done…`),
        });
      },
      show: async () => {
        this.fillAxes();
        await this.draw();
      },
    });
  }

  axes() {
    return axesOf(this.result, this.stats() ?? {}, this.nameOf);
  }

  /** The axis selects: every axis on offer, the choice kept where it still is one. */
  fillAxes() {
    const axes = this.axes();
    for (const [select, fallback] of [[this.els.xAxis, DEFAULT_AXES.x], [this.els.yAxis, DEFAULT_AXES.y]]) {
      const chosen = select.value || fallback;
      select.replaceChildren(...axes.map(({ key, name }) => el("option", { text: name, attrs: { value: key } })));
      select.value = axes.some(({ key }) => key === chosen) ? chosen : fallback;
    }
  }

  /** The scatter on the chosen axes, the chance lines, the caption and the chips. */
  async draw() {
    const result = this.result;
    if (!result) return;
    const { plot, caption, xAxis, yAxis } = this.els;
    const axes = this.axes();
    const x = axes.find(({ key }) => key === xAxis.value) ?? axes[0];
    const y = axes.find(({ key }) => key === yAxis.value) ?? axes[2];
    const colorOf = (layer) => statColor(result.layers > 1 ? layer / (result.layers - 1) : 0);
    const data = scatterTraces(result, x, y, colorOf);
    const line = { color: "#888", dash: "dot", width: 1 };
    const levels = (axis) => (PROBE_KINDS.includes(axis.key) ? chanceLevels(result, axis.key) : []);
    const shapes = [
      ...levels(x).map((v) => ({ type: "line", xref: "x", yref: "paper", x0: v, x1: v, y0: 0, y1: 1, line })),
      ...levels(y).map((v) => ({ type: "line", xref: "paper", yref: "y", x0: 0, x1: 1, y0: v, y1: v, line })),
    ];
    const layout = {
      margin: { l: 56, r: 8, t: 8, b: 48 },
      xaxis: { title: { text: x.name }, zeroline: false },
      yaxis: { title: { text: y.name }, zeroline: false },
      legend: { title: { text: "layer" } },
      shapes,
      hovermode: "closest",
      uirevision: `${result.model}:${x.key}:${y.key}`,
    };
    plot.hidden = false;
    for (const part of this.els.panel.querySelectorAll(".probe-result")) part.hidden = false;
    await window.Plotly.react(plot, data, layout, PLOT_CONFIG);
    if (!plot.dataset.bound) {
      plot.dataset.bound = "true";
      plot.on("plotly_click", (event) => {
        const [layer, head] = event.points?.[0]?.customdata ?? [];
        if (Number.isInteger(layer)) this.onOpen(layer, head, this.model);
      });
    }
    const chance = PROBE_KINDS.map((k) => `${KIND_NAMES[k]} ${chanceText(result, k)}`).join(", ");
    caption.textContent =
      `${result.layers * result.heads} heads of ${result.model} (${result.kind} attention) on ${result.sequences} ` +
      `random sequences of ${result.length} tokens, each repeated once (seed ${result.seed}). Dotted lines: chance ` +
      `(${chance}). A head is labelled when its score is at least ${result.threshold} and its chance + ` +
      `${result.margin}. Click a point or a chip to open that head on the probe's own input, in the detail view above.`;
    this.drawChips();
  }

  drawChips() {
    const result = this.result;
    const rows = PROBE_KINDS.map((kind) => {
      const heads = rankHeads(result, kind, TOP);
      const chips = heads.map(([layer, head, score]) => {
        const chip = el("button", {
          className: "chip",
          text: `${shortHeadLabel(layer, head)} ${formatScore(score)}`,
          attrs: { type: "button", title: `Open layer ${layer}, head ${head}` },
          data: { layer, head, kind },
        });
        chip.addEventListener("click", () => this.onOpen(layer, head, this.model));
        return el("li", {}, [chip]);
      });
      const list = el("ol", { className: "chips ranking", attrs: { "aria-label": `Top ${KIND_NAMES[kind]} heads` } }, chips);
      const none = el("span", { className: "hint", text: "none clears the rule" });
      return el("div", { className: "ranking-row" }, [
        el("span", { className: "hint", text: `${KIND_NAMES[kind].replace(" score", "")} heads:` }),
        heads.length ? list : none,
      ]);
    });
    this.els.top.replaceChildren(...rows);
  }

  save(extension) {
    const result = this.result;
    if (!result) return;
    const text = extension === "csv" ? probeCsv(result) : JSON.stringify(result);
    const type = extension === "csv" ? "text/csv" : "application/json";
    download(new Blob([text], { type }), probeFileName(result, extension));
  }
}
