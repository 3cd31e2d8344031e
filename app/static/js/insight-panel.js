// The insight views of a run in #analysis: statistics table, colour-by select and legend, similar heads,
// rollout and flow, and compare mode. They load after the grid and the detail are drawn, so they never
// delay the first picture; document.body.dataset.insight goes "loading" -> "ready" (or "error").
// Every fetch carries the run's AbortSignal: a new run aborts them and nothing of the old run is drawn.

import { $ } from "./dom.js";
import { fetchAnalysis } from "./api.js";
import { isAggregate } from "./aggregates.js";
import { CompareView } from "./compare.js";
import { EffectsView } from "./effects-view.js";
import { CHANGE, StatsTable, colorScaleFor, fillColorBy, formatStat, renderLegend, renderSimilar, statTable } from "./insight.js";
import { readInitialState, showError } from "./form.js";
import { renderGlossary, watchOverflow } from "./glossary.js";
import { statName, standoutBadges } from "./names.js";
import { ProbeView } from "./probe-view.js";
import { RolloutView } from "./rollout.js";
import { rolloutNote } from "./seq2seq.js";
import { getState, subscribe, update } from "./state.js";
import { weightingOf } from "./weighting.js";

export class InsightPanel {
  /**
   * `grid` gets the frame colours; `current()` is the run on screen; onOpen(layer, head) selects a head,
   * onOpenProbed(layer, head, model) opens one on the head probe's own input of `model` (Find heads).
   */
  constructor({ grid, current, onOpen, onOpenProbed }) {
    this.grid = grid;
    this.current = current;
    this.onOpen = onOpen;
    this.table = new StatsTable($("statsTable"), { onOpen });
    this.rollout = new RolloutView({
      plot: $("rollout"),
      slider: $("rolloutLayer"),
      sliderValue: $("rolloutLayerValue"),
      caption: $("rolloutCaption"),
      panel: $("rolloutPanel"),
      flowButton: $("flowRun"),
      flowMessage: $("flowMessage"),
      flowNormalized: $("flowNormalized"),
      flowPlot: $("flow"),
    }, { flowLimit: readInitialState().limits?.flow_max_tokens });
    this.compare = new CompareView(
      {
        panel: $("comparePanel"),
        summary: $("compareSummary"),
        ranking: $("compareRanking"),
        a: $("compareA"),
        b: $("compareB"),
        diff: $("compareDiff"),
        headCaption: $("compareHeadCaption"),
      },
      { onOpen },
    );
    this.effects = new EffectsView(
      {
        panel: $("effectsPanel"),
        button: $("effectsRun"),
        cancel: $("effectsCancel"),
        progress: $("effectsProgress"),
        message: $("effectsMessage"),
        outputField: $("effectsOutputField"),
        output: $("effectsOutput"),
        caption: $("effectsCaption"),
        map: $("effectsMap"),
        legend: $("effectsLegend"),
        top: $("effectsTop"),
        ranking: $("effectsRanking"),
      },
      { onOpen, onColumn: (column) => this.effectColumn(column) },
    );
    this.probe = new ProbeView(
      {
        panel: $("probePanel"),
        seed: $("probeSeed"),
        sequences: $("probeSequences"),
        button: $("probeRun"),
        cancel: $("probeCancel"),
        progress: $("probeProgress"),
        message: $("probeMessage"),
        xAxis: $("probeX"),
        yAxis: $("probeY"),
        plot: $("probePlot"),
        caption: $("probeCaption"),
        top: $("probeTop"),
        csv: $("probeCsv"),
        json: $("probeJson"),
      },
      { onOpen: onOpenProbed, stats: () => this.current()?.analysis?.stats, nameOf: statName },
    );
    $("colorBy").addEventListener("change", () => update({ color: $("colorBy").value }));
    $("showBadges").addEventListener("change", () => this.colorGrid());
    this.checkOverflow = watchOverflow($("tableScroll"), $("tableScrollCue"));
    subscribe((state, changed) => {
      if (changed.has("color")) this.colorGrid();
      if (changed.has("scale")) this.rollout.recolor();
    });
  }

  /** Load and draw the insight views of `run`. */
  async load(run) {
    const { query, signal, attention } = run;
    document.body.dataset.insight = "loading";
    $("analysis").hidden = false;
    $("statsWeighting").hidden = weightingOf(attention) !== "norm"; // the statistics read the run's maps
    const status = $("insightStatus");
    status.textContent = "Computing head statistics…";
    status.classList.add("busy");
    if (!run.queryB) this.compare.clear();
    this.effects.watch(run); // measured on request only: it costs about L·H/2 forwards
    this.probe.watch(run); // on request, or from a link (probe=heads): it depends on the model alone
    const problems = [];
    // B is the person's own input: a comparison that cannot be made (other shapes, blank) goes to the alert.
    const comparing = run.queryB
      ? this.compare.load(query, run.queryB, { signal, byteLevel: attention.byteLevel }).catch((error) => {
          if (!signal.aborted) showError(`Could not compare A and B: ${error.message}`);
          return null;
        })
      : null;
    const stats = Promise.all([fetchAnalysis(query, { signal }), comparing]).then(([analysis, comparison]) => {
      if (signal.aborted) return null;
      Object.assign(run, { analysis, comparison });
      const { color, layer, head } = getState();
      this.renderStats(run, comparison && !color ? CHANGE : color); // compare mode: colour by change
      this.showSelection(run, { withCompare: false });
      this.probe.watch(run); // the text's statistics join the probe's axes
      return comparison ? this.compare.show(layer, head, { delay: 0, causal: attention.causal }) : null;
    });
    // Below the statistics: fetched when its panel is on screen, so the first view moves only what it shows.
    // An encoder-decoder model's rollout chains its encoder: the other kinds say so instead.
    const { causal, boundary, byteLevel, n } = attention;
    const off = rolloutNote(query.kind);
    if (off) this.rollout.off(off);
    else this.rollout.watch(query, { causal, boundary, byteLevel, n }, { signal });
    await stats.catch((error) => {
      if (!signal.aborted) problems.push(`statistics: ${error.message}`);
    });
    if (signal.aborted) return;
    status.classList.remove("busy");
    status.textContent = problems.length ? `Unavailable: ${problems.join("; ")}` : "";
    performance.mark("headscope-insight"); // benchmarks/browser.py: click -> statistics (and compare) drawn
    document.body.dataset.insight = problems.length ? "error" : "ready";
  }

  /** Statistics table, colour-by select (offering `color`), legend and thumbnail frames of `run`. */
  renderStats(run, color) {
    const { analysis, comparison } = run;
    // Compare mode lists the heads that change most first, unless someone already picked a sort.
    if (comparison && !this.table.sorted) this.table.sort = { key: CHANGE, descending: true };
    this.table.render(analysis, comparison, run.attention);
    renderGlossary($("glossaryBody"), analysis, comparison, weightingOf(run.attention));
    this.checkOverflow();
    const offered = fillColorBy($("colorBy"), analysis, comparison, color);
    if (!update({ color: offered }).has("color")) this.colorGrid(); // a change is coloured by the subscriber
  }

  /** The grid's frames and the legend for the state's colour-by statistic of the run on screen. */
  colorGrid() {
    const { analysis, comparison } = this.current() ?? {};
    if (!analysis) return;
    const key = getState().color;
    const values = key ? statTable(analysis, comparison)[key] : null;
    const scale = values ? colorScaleFor(values) : null;
    this.grid.decorate({
      labels: analysis.labels,
      badges: $("showBadges").checked ? standoutBadges(analysis) : null,
      values,
      color: scale?.color,
      describe: (v) => formatStat(key, v),
      statName: key ? statName(key) : "",
    });
    renderLegend($("colorLegend"), analysis, comparison, key);
  }

  /** The head effects' column in the statistics table (null: none), the selected head's row kept. */
  effectColumn(column) {
    this.table.setExtra(column);
    const { layer, head } = getState();
    this.table.select(layer, head);
  }

  /** The views that follow the selected head: table row, head effects, similar heads, compare maps. */
  showSelection(run, { withCompare = true } = {}) {
    const { layer, head } = getState();
    this.effects.select(layer, head);
    if (!run.analysis) return;
    this.table.select(layer, head);
    renderSimilar($("similar"), run.analysis, layer, isAggregate(head) ? -1 : head, this.onOpen, run.attention);
    if (run.comparison && withCompare) this.compare.show(layer, head, { causal: run.attention.causal });
  }
}
