// "What the model looked at while writing": for a run continued by a causal model (the header's
// `generated`), the written tokens as a list of buttons; choosing one (or clicking its row in the heatmap)
// shows the attention of the step that wrote it over the prompt, for the selected head, as the prompt's
// text shaded by weight, with the top tokens and their weights listed as numbers.
//
// Token i was chosen from the logits at position i - 1, so the row that wrote it is row i - 1: its query
// saw the prompt and the tokens written before i, never i itself.

import { el } from "./dom.js";
import { LUT } from "./colors.js";
import { displayToken, topK } from "./decoder.js";
import { weightingOf } from "./weighting.js";

export const TOP_K = 5;

/** "“␣sat”": a token as the page spells it (already respelled), in quotes. */
export function quoted(token) {
  return `“${token}”`;
}

/** The run's tokens as the page spells them (decoder.js displayToken). */
function spelled(attention) {
  return attention.tokens.map((token) => displayToken(token, attention.byteLevel));
}

function ordinal(k) {
  const tens = k % 100;
  const suffix = tens >= 11 && tens <= 13 ? "th" : ["th", "st", "nd", "rd"][k % 10] ?? "th";
  return `${k}${suffix}`;
}

/** Background colour of a weight shaded as `t` in [0, 1] of the attention scale (colors.js LUT). */
export function shade(t) {
  const k = 4 * Math.min(255, Math.max(0, Math.round(t * 255)));
  return { background: `rgb(${LUT[k]}, ${LUT[k + 1]}, ${LUT[k + 2]})`, dark: t > 0.45 };
}

/** One top-k entry's parts: “token”, where it sits, its weight (3 decimals). `tokens` already spelled. */
export function topParts(tokens, index, weight, digits = 3) {
  return [
    el("span", { className: "written-top-token", text: quoted(tokens[index]) }),
    el("span", { className: "written-top-where", text: ` token ${index}` }),
    el("span", { className: "num", text: weight.toFixed(digits) }),
  ];
}

export class WrittenView {
  /** `els`: {panel, list, caption, prompt, top}. */
  constructor(els) {
    this.els = els;
    this.chosen = -1; // index of the written token shown, -1 before a continued run
    this.last = null; // what show() was given, so choose() can redraw
    els.list.addEventListener("click", (event) => {
      const button = event.target.closest("button[data-i]");
      if (button) this.choose(Number(button.dataset.i));
    });
  }

  /** Nothing to show (a run without written tokens, or before a run). */
  clear() {
    this.chosen = -1;
    this.last = null;
    this.els.panel.hidden = true;
  }

  /**
   * Show `run`'s written tokens for the detail's `values` (n*n, as drawn: exact or quantized, maybe
   * renormalised without the first token); `head` names the selection ("L0 H1 · kv 0").
   */
  show(run, values, { head, renormalised }) {
    const { n, generated, prompt } = run.attention;
    if (!(generated > 0)) return this.clear();
    const tokens = spelled(run.attention);
    if (this.last?.run !== run) this.chosen = prompt; // a new run starts at its first written token
    this.last = { run, values, head, renormalised };
    const buttons = [];
    for (let i = prompt; i < n; i++) {
      buttons.push(
        el("button", {
          className: "chip written-token",
          text: `✎ ${tokens[i]}`,
          attrs: { type: "button", "aria-pressed": String(i === this.chosen), title: `token ${i}, the ${ordinal(i - prompt + 1)} written` },
          data: { i },
        }),
      );
    }
    this.els.list.replaceChildren(...buttons);
    this.els.panel.hidden = false;
    this.draw();
  }

  /** Show written token `i` (an index into the run's tokens); other indices are ignored. */
  choose(i) {
    const attention = this.last?.run.attention;
    if (!attention || i < attention.prompt || i >= attention.n) return;
    this.chosen = i;
    for (const button of this.els.list.querySelectorAll("button[data-i]")) {
      button.setAttribute("aria-pressed", String(Number(button.dataset.i) === i));
    }
    this.draw();
    this.els.panel.scrollIntoView({ block: "nearest" });
  }

  draw() {
    const { run, values, head, renormalised } = this.last;
    const { n, prompt } = run.attention;
    const tokens = spelled(run.attention);
    const i = this.chosen;
    const row = i - 1; // the step that wrote token i
    const top = topK(values, n, row, TOP_K, { to: prompt });
    let peak = 0;
    let before = 0; // weight on the tokens written before i
    for (let j = 0; j < prompt; j++) if (Number.isFinite(values[row * n + j])) peak = Math.max(peak, values[row * n + j]);
    for (let j = prompt; j < i; j++) before += values[row * n + j];

    const { panel, caption, prompt: text, top: list } = this.els;
    // Under weight × value norm each value is the row's share of what the head moves, not a weight.
    const norm = weightingOf(run.attention) === "norm";
    const what = norm ? "share" : "weight";
    const parts = [
      `${quoted(tokens[i])} (token ${i}, the ${ordinal(i - prompt + 1)} written) was chosen at ${quoted(tokens[row])}` +
        ` (token ${row}): that step's ${norm ? "weight × value norm (each token's share of α·‖f(x)‖)" : "attention"}` +
        ` in ${head} over the ${prompt} prompt tokens${renormalised ? ", renormalised without the first token" : ""}.`,
      `Shade: ${what} ÷ the largest (${peak.toFixed(3)}).`,
    ];
    if (i > prompt) parts.push(`${norm ? "Share" : "Weight"} on the ${i - prompt} token(s) it wrote before: ${before.toFixed(3)}.`);
    caption.textContent = parts.join(" ");

    const spans = [];
    for (let j = 0; j < prompt; j++) {
      const weight = values[row * n + j];
      const span = el("span", { className: "written-prompt-token", text: tokens[j], data: { j } });
      if (Number.isFinite(weight)) {
        const { background, dark } = shade(peak > 0 ? weight / peak : 0);
        span.style.backgroundColor = background;
        span.classList.toggle("dark", dark);
        span.title = `${tokens[j]}: ${weight.toFixed(3)}`;
      } else {
        span.classList.add("hidden-token");
        span.title = `${tokens[j]}: hidden (the first token)`;
      }
      span.setAttribute("aria-label", span.title);
      spans.push(span);
    }
    text.replaceChildren(...spans);

    const items = top.map(({ index, weight }) => el("li", { data: { index, weight } }, topParts(tokens, index, weight)));
    list.replaceChildren(...items);
    panel.dataset.chosen = String(i);
  }
}
