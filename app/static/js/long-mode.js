// Long inputs: above the model's max_tokens (HEADSCOPE_MAX_TOKENS) and within its trace_max_tokens, a run is
// a trace. Its layers stream as a progress bar with a Cancel button; then the grid draws the overview (every
// head pooled to 128 x 128 blocks, max), the detail shows the selected head (long-detail.js) and the text
// view one token's exact row (long-text.js). What needs every head's full matrix (statistics, rollout, flow,
// compare, words, weight × value norm, token lines, exports, continuing) says so and is disabled, with the reason on it.

import { $, $all, el } from "./dom.js";
import { isAggregate } from "./aggregates.js";
import { showTabs } from "./detail.js";
import { selectionLabel } from "./labels.js";
import { LongDetail } from "./long-detail.js";
import { LongText } from "./long-text.js";
import { fetchOverview, fetchTokens, streamTrace, utf8Length } from "./trace-api.js";
import { hideBar, layerView, showBar } from "./work-progress.js";

/** "4,003 tokens, every head pooled to 128 × 128 (max)"; an input of s tokens is drawn as it is. */
export function longSummary(n, s, reduce) {
  const count = `${n.toLocaleString("en-US")} tokens`;
  return s < n ? `${count}, every head pooled to ${s} × ${s} (${reduce})` : count;
}

/** "Head statistics need the full matrices: available up to 512 tokens." */
export function unavailable(what, limit, verb = "need") {
  return `${what} ${verb} the full matrices: available up to ${limit.toLocaleString("en-US")} tokens.`;
}

/**
 * The token count of `query` when it must be traced (more tokens than `max_tokens`, and the model traces
 * more than that), else null. Exact and cheap: every token spans at least one byte of the text (WordPiece,
 * byte-level BPE, SentencePiece with byte fallback), so an input of at most `limit` UTF-8 bytes fits unless
 * special or template tokens push it over, which the attention answer then says (`truncated`: call again
 * with `truncated`); a longer one is counted by the tokenizer alone (/api/trace/tokens), no forward.
 */
export async function measure(query, { limit, truncated = false, signal }) {
  const bytes = utf8Length(query.text) + utf8Length(query.pair);
  if (!truncated && Number.isFinite(limit) && bytes <= limit) return null;
  const count = await fetchTokens(query, { signal });
  return count.n > count.max_tokens && count.trace_max_tokens > count.max_tokens ? count : null;
}

/** The controls a long input cannot use, each with the reason it says (`limit`: the full-matrix limit). */
function reasons(limit) {
  const stats = unavailable("Head statistics", limit);
  const rollout = unavailable("Attention rollout and flow", limit);
  const exports = unavailable("Exports", limit, "hold");
  return [
    ["words", unavailable("Words mode", limit, "needs")],
    ["weightingSwitch", unavailable("Weight × value norm", limit, "needs")],
    ["compare", unavailable("Compare", limit, "needs")],
    ["newTokens", unavailable("Continuing the text", limit, "needs")],
    ["tabTokens", unavailable("Token lines", limit)],
    ["hideFirst", "Not in the long-input view: it draws the weights as the model gave them."],
    ["colorScale", "Not in the long-input view: it draws the weights on the 0–1 scale."],
    ["colorBy", stats],
    ["showBadges", stats],
    ["rolloutLayer", rollout],
    ["flowRun", rollout],
    ["flowNormalized", rollout],
    ["exportPng", exports],
    ["exportSvg", exports],
    ["exportJson", exports],
    ["exportJsonHead", exports],
    ["exportHtml", exports],
  ];
}

// Form controls a person may want for the next, shorter input: typing one gives them back.
const FORM_CONTROLS = new Set(["words", "weightingSwitch", "compare", "newTokens"]);

export class LongMode {
  /** `grid`: the page's Grid; `onCancel()`: the Cancel button was pressed. */
  constructor({ grid, onCancel }) {
    this.grid = grid;
    this.on = false;
    this.active = null; // the trace whose progress shows
    this.disabled = []; // [element, title it had]
    this.detail = new LongDetail($("longDetail"), { readout: $("longReadout") });
    this.text = new LongText();
    $("traceCancel").addEventListener("click", onCancel);
    const giveBack = () => this.restore(FORM_CONTROLS);
    for (const name of ["text", "textPair", "model"]) $(name).addEventListener("input", giveBack);
  }

  /** Progress: "Layer 12 of 30" and the bar, as layer 11 (0-based) starts; null: before the first. */
  showProgress(event) {
    showBar(event ? layerView(event) : { text: "Starting the trace…" }); // indeterminate until layer 0
  }

  hideProgress() {
    this.active = null;
    hideBar();
  }

  /** Trace `query` (its layers shown as they run), then read its overview: the long run, not yet drawn. */
  async trace(query, { signal }) {
    const mine = {};
    this.active = mine;
    this.showProgress(null);
    try {
      const onProgress = (event) => this.active === mine && this.showProgress(event);
      const trace = await streamTrace(query, { signal, onProgress });
      performance.mark("headscope-traced"); // benchmarks/long_page.py: the done line -> the grid drawn
      if (this.active === mine) this.hideProgress(); // past the forward: what is left is quick, and not cancelled
      const attention = await fetchOverview(query, { signal });
      performance.mark("headscope-overview");
      return { query, trace, attention, signal, long: true, exact: new Map(), analysis: null, comparison: null };
    } finally {
      if (this.active === mine) this.hideProgress();
    }
  }

  /** The selection a long run can show: a head (the overview has no aggregate column). */
  static selection({ layer, head }) {
    return { layer, head: isAggregate(head) ? 0 : head };
  }

  /** Enter long mode for `run` and draw it; resolves true once the grid is drawn (false: aborted). */
  async draw(run, { layer, head }, limit) {
    this.enter(limit);
    const gridDone = this.grid.render(run.attention, { signal: run.signal, aggregates: false });
    this.text.show(run, { layer, head });
    this.select(run, layer, head);
    return gridDone;
  }

  /** Show (layer, head) of the long run in the grid, the detail and the text view. */
  select(run, layer, head) {
    if (isAggregate(head)) return;
    this.grid.select(layer, head);
    const { trace, query, signal } = run;
    const label = selectionLabel(layer, head, { heads: trace.heads, kvHeads: trace.kv_heads });
    $("detailTitle").textContent = `Head detail: ${label} · long input`;
    this.detail.show({ query, trace, layer, head, signal }).catch((error) => {
      if (!signal.aborted) $("longReadout").textContent = `The heatmap could not be drawn: ${error.message}`;
    });
    this.text.select(layer, head);
  }

  enter(limit) {
    this.restore(); // the reasons name this run's limit
    this.on = true;
    const normal = ["detailScroll", "tokenView", "written", "exact", "similarGroup", "analysisBody", "colorLegend"];
    for (const name of normal) $(name).hidden = true;
    $("cellReadout").textContent = "";
    $("workspace").classList.remove("stacked"); // the pooled detail fits beside the grid
    showTabs("heatmap"); // whatever the link's view: token lines are off
    $("longView").hidden = false;
    $("detailCaption").textContent =
      "Each cell of the heatmap is a block of tokens (its axes say how many, and how pooled); " +
      "the text view below gives one token's exact weights.";
    $("analysis").hidden = false;
    $("longInsight").hidden = false;
    const said = [
      unavailable("Head statistics", limit),
      unavailable("Attention rollout and flow", limit),
      unavailable("Compare", limit, "needs"),
    ];
    $("longInsight").replaceChildren(...said.map((text) => el("p", { className: "hint", text })));
    $("insightStatus").textContent = "";
    document.body.dataset.insight = "unavailable";
    for (const [name, reason] of reasons(limit)) {
      const element = $(name);
      this.disabled.push([name, element, element.getAttribute("title")]);
      element.disabled = true;
      element.title = reason;
      if (element.getAttribute("role") === "tab") element.setAttribute("aria-disabled", "true");
    }
  }

  /** Give back the disabled controls (only those named in `names`, when given), their titles as they were. */
  restore(names = null) {
    this.disabled = this.disabled.filter(([name, element, title]) => {
      if (names && !names.has(name)) return true;
      element.disabled = false;
      element.removeAttribute("aria-disabled");
      if (title === null) element.removeAttribute("title");
      else element.title = title;
      return false;
    });
  }

  /** Back to the normal page (a short run is drawn next). */
  leave() {
    this.hideProgress();
    if (!this.on) return;
    this.on = false;
    this.restore();
    this.detail.clear();
    this.text.clear();
    $("longView").hidden = true;
    $("longInsight").hidden = true;
    for (const name of ["similarGroup", "analysisBody"]) $(name).hidden = false;
    for (const tab of $all("tabs")) tab.removeAttribute("aria-disabled");
  }
}
