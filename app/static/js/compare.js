// Compare mode: B (another sentence, or the same one on another model) against A. POST /api/compare
// gives every head's change score (the grid is coloured by it, the ranking lists heads by it);
// POST /api/compare/head gives the chosen head's aligned A, B and A − B maps, drawn side by side by
// the head heatmap code (A − B on a diverging scale centred on 0). Every fetch carries the run's
// AbortSignal; a head's maps also stop when another head is asked for.

import { el } from "./dom.js";
import { fetchCompare, fetchCompareHead } from "./api.js";
import { DIVERGING } from "./colors.js";
import { clearHeatmap, renderHeatmap } from "./heatmap.js";

const RANKED = 10; // heads listed by change; the table's change column sorts all of them
const SIDE_MIN_PX = 220; // three figures side by side
const HEAD_DELAY_MS = 250; // let arrow-key bursts settle before fetching a head's three maps

/** B's input: its own sentence (no pair), or A's sentence and pair when B's text is blank. */
export function queryB(a, { btext, bmodel }) {
  const text = btext.trim() ? btext : a.text;
  const pair = btext.trim() ? "" : a.pair;
  return { text, pair, model: bmodel || a.model, words: a.words, newTokens: a.newTokens, chat: a.chat };
}

/** Heads ordered by change score, largest first, ties in model order, a missing score last: [{layer, head, score}]. */
export function rankHeads(score) {
  const heads = [];
  score.forEach((row, layer) => row.forEach((value, head) => heads.push({ layer, head, score: value })));
  const key = (v) => (Number.isFinite(v) ? v : -Infinity); // NaN would make the order undefined
  return heads.sort((x, y) => key(y.score) - key(x.score) || x.layer - y.layer || x.head - y.head);
}

export class CompareView {
  /** `els`: {panel, summary, ranking, a, b, diff, headCaption}; onOpen(layer, head) selects a head. */
  constructor(els, { onOpen }) {
    this.els = els;
    this.onOpen = onOpen;
    this.result = null;
    this.a = null;
    this.b = null;
    this.signal = null; // the loaded run's
    this.head = null; // AbortController of the head whose maps are on the way
    this.timer = 0;
  }

  clear() {
    clearTimeout(this.timer);
    this.head?.abort();
    this.result = null;
    const { panel, summary, ranking, a, b, diff, headCaption } = this.els;
    for (const gd of [a, b, diff]) clearHeatmap(gd);
    summary.textContent = "";
    headCaption.textContent = "";
    ranking.replaceChildren();
    panel.hidden = true;
    delete panel.dataset.layer;
    delete panel.dataset.head;
  }

  /**
   * Fetch the comparison of `a` and `b` for the run of `signal`; resolves to the API's answer. `byteLevel`:
   * A's tokens (the aligned labels) are a byte-level BPE's (decoder.js displayToken).
   */
  async load(a, b, { signal, byteLevel = true }) {
    this.clear();
    const result = await fetchCompare(a, b, a.words, { signal });
    Object.assign(this, { result, a, b, signal, byteLevel });
    const { panel, summary, ranking } = this.els;
    const sameText = a.text === b.text && (a.pair || "") === (b.pair || "");
    const what = sameText ? `the same input on ${result.a.model} (A) and ${result.b.model} (B)` : "two inputs";
    const m = result.tokens.length;
    summary.textContent =
      `Comparing ${what}: ${m} aligned tokens of ${result.a.tokens.length} (A) and ${result.b.tokens.length} (B). ` +
      "Change = mean Jensen–Shannon divergence of each head's rows on the aligned tokens (nats, 0 to ln 2 ≈ 0.693)." +
      (a.weighting === "norm" ? " Both sides as weight × value norm shares." : "");
    const items = rankHeads(result.score)
      .slice(0, RANKED)
      .map(({ layer, head, score }) => {
        const button = el("button", {
          className: "chip",
          text: `L${layer} H${head}: ${score.toFixed(3)}`,
          attrs: { type: "button", title: `layer ${layer}, head ${head}: change ${score.toFixed(4)} nats` },
          data: { layer, head, score },
        });
        button.addEventListener("click", () => this.onOpen(layer, head));
        return el("li", {}, [button]);
      });
    ranking.replaceChildren(...items);
    panel.hidden = false;
    return result;
  }

  /** Draw A, B and A − B for one head (after a short delay); aggregates get a note instead. */
  show(layer, head, { delay = HEAD_DELAY_MS, causal = false } = {}) {
    clearTimeout(this.timer);
    if (!this.result) return Promise.resolve(false);
    const { headCaption, panel } = this.els;
    if (typeof head !== "number") {
      headCaption.textContent = "Pick a single head (not a layer mean) to see A, B and A − B.";
      return Promise.resolve(false);
    }
    this.head?.abort();
    this.head = new AbortController();
    const signal = AbortSignal.any([this.signal, this.head.signal]);
    panel.dataset.state = "loading";
    return new Promise((resolve) => {
      this.timer = setTimeout(async () => {
        try {
          resolve(await this.draw(layer, head, causal, signal));
        } catch (error) {
          if (!signal.aborted) {
            headCaption.textContent = `Could not load this head's comparison: ${error.message}`;
            panel.dataset.state = "error";
          }
          resolve(false);
        }
      }, delay);
    });
  }

  async draw(layer, head, causal, signal) {
    const maps = await fetchCompareHead(this.a, this.b, this.a.words, layer, head, { signal });
    if (signal.aborted) return false;
    const { a, b, diff, headCaption, panel } = this.els;
    let peak = 0;
    for (const v of maps.diff) if (Number.isFinite(v)) peak = Math.max(peak, Math.abs(v));
    peak = Math.max(peak, 1e-3); // an unchanged head stays a white map, not amplified noise
    const score = this.result.score[layer][head];
    headCaption.textContent =
      `Layer ${layer}, head ${head}: change ${score.toFixed(4)} nats. Rows renormalised over the aligned tokens; ` +
      `A − B is red where A attends more, blue where B does (scale ±${peak.toFixed(3)}).`;
    const { byteLevel } = this;
    const common = { tokens: maps.tokens, causal, byteLevel, boundary: -1, exact: true, keepZoom: true, minPx: SIDE_MIN_PX };
    common.weighting = this.a.weighting; // A and B as shares of α·‖f(x)‖ (their colour bars and hovers say so)
    if (maps.key_tokens) common.keyTokens = maps.key_tokens; // cross-attention: the keys are the source's
    const title = (which) => `${which} · layer ${layer}, head ${head}`;
    await Promise.all([
      renderHeatmap(a, { ...common, values: maps.a, title: title(`A (${this.result.a.model})`), filename: `headscope-A-L${layer}-H${head}` }),
      renderHeatmap(b, { ...common, values: maps.b, title: title(`B (${this.result.b.model})`), filename: `headscope-B-L${layer}-H${head}` }),
      renderHeatmap(diff, {
        ...common,
        values: maps.diff,
        title: title("A − B"),
        filename: `headscope-diff-L${layer}-H${head}`,
        scale: { colorscale: DIVERGING, zmin: -peak, zmax: peak, title: "A − B", signed: true },
      }),
    ]);
    if (signal.aborted) return false; // another head (or run) took over while these were drawn
    panel.dataset.layer = String(layer);
    panel.dataset.head = String(head);
    panel.dataset.state = "ready";
    return true;
  }
}
