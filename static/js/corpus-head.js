// The Corpus view's head panel: the chosen statistic's per-text distribution for the selected head (or
// every head of its layer side by side) as a Plotly box or violin plot, the head's corpus summary, and
// its top and bottom texts, each a link to the normal view of that text with the head open.

import { el } from "./dom.js";
import { formatStat } from "./insight.js";
import { distributionFigure, headSummary, linkReason, roleShares, textLink } from "./corpus-model.js";
import { statName } from "./names.js";

const PLOT_CONFIG = { displaylogo: false, responsive: true, showTips: false };

export class HeadPanel {
  constructor({ title, summary, plot, top, bottom, note }) {
    Object.assign(this, { title, summary, plot, top, bottom, note });
  }

  /**
   * Draw `series` ([{layer, head, values, ids}], the selected head first or the layer's heads in order) and
   * the selected head's `answer` (its examples) for `run` (the run's list entry) and `row` (its per_head).
   */
  async show(run, { layer, head, stat, plot }, series, answer, row) {
    const layerWide = series.length > 1;
    this.title.textContent = layerWide
      ? `Layer ${layer}, every head · ${statName(stat)}`
      : `Layer ${layer}, head ${head} · ${statName(stat)}`;
    const roles = roleShares(row);
    this.summary.textContent = `L${layer} H${head}: ${headSummary(row, stat)}${roles ? `. Role: ${roles}` : ""}`;
    const { data, layout } = distributionFigure(series, { stat, plot });
    await window.Plotly.react(this.plot, data, layout, PLOT_CONFIG);
    Object.assign(this.plot.dataset, { layer, head, stat, plot, series: String(series.length) });
    const reason = linkReason(run);
    this.note.textContent = reason;
    this.note.hidden = !reason;
    this.fill(this.top, answer.top, run, { layer, head, stat, reason });
    this.fill(this.bottom, answer.bottom, run, { layer, head, stat, reason });
  }

  /** One list of examples: the value, then the text (and its pair) as a link, or as plain text with why. */
  fill(list, examples, run, { layer, head, stat, reason }) {
    if (!examples.length) {
      list.replaceChildren(el("li", { className: "empty", text: "No texts." }));
      return;
    }
    list.replaceChildren(
      ...examples.map((example) => {
        const words = example.text_pair ? `${example.text} ‖ ${example.text_pair}` : example.text;
        const attrs = reason
          ? { "aria-disabled": "true", title: reason }
          : { href: textLink(run, example, layer, head), title: `Open text ${example.id} with L${layer} H${head} in the normal view` };
        return el("li", { data: { id: example.id, line: example.line, value: String(example.value) } }, [
          el("span", { className: "example-value", text: formatStat(stat, example.value) }),
          el("a", { className: reason ? "example-text disabled" : "example-text", text: words, attrs }),
          el("span", { className: "example-id", text: `text ${example.id}` }),
        ]);
      }),
    );
  }

  clear(message = "") {
    this.title.textContent = "Head";
    this.summary.textContent = message;
    window.Plotly?.purge(this.plot);
    this.top.replaceChildren();
    this.bottom.replaceChildren();
    this.note.hidden = true;
  }
}
