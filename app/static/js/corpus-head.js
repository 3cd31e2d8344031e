// The Corpus view's head panel: the chosen statistic's per-text distribution for the selected head (or
// every head of its layer side by side) as a Plotly box or violin plot, the head's corpus summary, and
// its top and bottom texts (their snippets), each a link to the normal view of that text with the head
// open (a snippet cut short: its whole text fetched by line for the link). A point of the plot is a text
// too: hovered, its line and a snippet (fetched on demand) show under the plot; clicked, it opens as an
// example's link does (or says why it cannot, as the links do).

import { el } from "./dom.js";
import { formatStat } from "./insight.js";
import {
  distributionFigure,
  exampleWords,
  headSummary,
  linkReason,
  pointLine,
  pointsHint,
  pointText,
  roleShares,
  textLink,
} from "./corpus-model.js";
import { statName } from "./names.js";

// No "Share chart..." button: it uploads the figure to Plotly Cloud (heatmap.js).
const PLOT_CONFIG = { displaylogo: false, showSendToCloud: false, responsive: true, showTips: false };
const HOVER_WAIT_MS = 120; // a pointer sweeping across points fetches only the one it rests on
const TEXTS_KEPT = 256;

export class HeadPanel {
  /** `fetchText(run, line)` -> the run's text at `line` ({id, line, text, text_pair}). */
  constructor({ title, summary, plot, point, top, bottom, note, fetchText }) {
    Object.assign(this, { title, summary, plot, point, top, bottom, note, fetchText });
    this.texts = new Map(); // "run\nline" -> the text's promise, the latest TEXTS_KEPT
    this.context = null; // what the plot on screen shows: {run, stat, series, reason}
    this.hovered = null;
    this.timer = 0;
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
    this.context = { run, stat, series, reason };
    this.bindPoints();
    this.hint();
    this.note.textContent = reason;
    this.note.hidden = !reason;
    const options = { layer, head, stat, reason };
    await Promise.all([this.fill(this.top, answer.top, run, options), this.fill(this.bottom, answer.bottom, run, options)]);
  }

  /**
   * One list of examples: the value, then the snippet (and its pair) as a link, or as plain text with why.
   * A link needs the whole text: a snippet that is the whole has it; one cut short fetches it by its line
   * (resolved before the panel says it is ready; one that fails says why on its link).
   */
  async fill(list, examples, run, { layer, head, stat, reason }) {
    if (!examples.length) {
      list.replaceChildren(el("li", { className: "empty", text: "No texts." }));
      return;
    }
    const links = examples.map((example) =>
      el("a", {
        className: reason ? "example-text disabled" : "example-text",
        text: exampleWords(example),
        attrs: reason ? { "aria-disabled": "true", title: reason } : {},
      }),
    );
    list.replaceChildren(
      ...examples.map((example, k) =>
        el("li", { data: { id: example.id, line: example.line, value: String(example.value), cut: String(example.cut) } }, [
          el("span", { className: "example-value", text: formatStat(stat, example.value) }),
          links[k],
          el("span", { className: "example-id", text: `text ${example.id}` }),
        ]),
      ),
    );
    if (reason) return;
    await Promise.all(
      examples.map(async (example, k) => {
        const link = links[k];
        try {
          const whole = example.cut ? await this.text(run, example.line) : { text: example.snippet, text_pair: example.snippet_pair };
          link.href = textLink(run, whole, layer, head);
          link.title = `Open text ${example.id} with L${layer} H${head} in the normal view`;
        } catch (error) {
          link.classList.add("disabled");
          link.setAttribute("aria-disabled", "true");
          link.title = `Text ${example.id} cannot be opened: ${error.message}`;
        }
      }),
    );
  }

  bindPoints() {
    for (const name of ["plotly_hover", "plotly_unhover", "plotly_click"]) this.plot.removeAllListeners?.(name);
    this.plot.on("plotly_hover", (event) => {
      clearTimeout(this.timer);
      this.timer = setTimeout(() => this.hover(event.points?.[0]), HOVER_WAIT_MS);
    });
    this.plot.on("plotly_unhover", () => clearTimeout(this.timer));
    this.plot.on("plotly_click", (event) => this.open(event.points?.[0]));
  }

  hint() {
    this.hovered = null;
    this.point.textContent = pointsHint(this.context.series, this.context.reason);
    delete this.point.dataset.line;
  }

  /** The run's text at `line`, fetched once. */
  text(run, line) {
    const key = `${run.name}\n${line}`;
    if (!this.texts.has(key)) {
      const asked = this.fetchText(run, line);
      asked.catch(() => this.texts.delete(key)); // a failure is asked again next time
      this.texts.set(key, asked);
      if (this.texts.size > TEXTS_KEPT) this.texts.delete(this.texts.keys().next().value);
    }
    return this.texts.get(key);
  }

  async hover(point) {
    const { run, stat, series, reason } = this.context ?? {};
    const found = run && pointText(series, point);
    if (!found) return;
    const asked = (this.hovered = found);
    this.point.dataset.line = String(found.line);
    this.point.textContent = pointLine(found, stat, null);
    try {
      const record = await this.text(run, found.line);
      if (this.hovered !== asked) return;
      this.point.textContent = pointLine(found, stat, record) + (reason ? "" : " · click to open it");
    } catch (error) {
      if (this.hovered === asked) this.point.textContent = `${pointLine(found, stat, null)} · ${error.message}`;
    }
  }

  /** A clicked point opens its text in the normal view with its head, as an example's link does. */
  async open(point) {
    const { run, stat, series, reason } = this.context ?? {};
    const found = run && pointText(series, point);
    if (!found) return;
    clearTimeout(this.timer);
    this.hovered = found;
    this.point.dataset.line = String(found.line);
    if (reason) {
      this.point.textContent = `${pointLine(found, stat, null)}. ${reason}`;
      return;
    }
    this.point.textContent = `${pointLine(found, stat, null)} · opening…`;
    try {
      const record = await this.text(run, found.line);
      window.location.assign(textLink(run, record, found.layer, found.head));
    } catch (error) {
      this.point.textContent = `${pointLine(found, stat, null)} cannot be opened: ${error.message}`;
    }
  }

  clear(message = "") {
    this.title.textContent = "Head";
    this.summary.textContent = message;
    window.Plotly?.purge(this.plot);
    this.context = null;
    this.point.textContent = "";
    this.top.replaceChildren();
    this.bottom.replaceChildren();
    this.note.hidden = true;
  }
}
