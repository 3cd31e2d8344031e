// The Token lines tab: one head, or every head of its layer in its own colour (bertviz's head view), with
// a swatch per head to hide or show it (double-click or "only" shows that head alone), a sentence-pair
// filter, and a readout of the line or token last hovered, tapped or reached by keyboard. The mode and the
// filter are view state (the URL: lines=layer, pairs=ab); hidden heads and the pinned token belong to
// this tab and last while the model's shape does.

import { $, el } from "./dom.js";
import { withoutFirstToken } from "./decoder.js";
import { DISTINCT_STYLES, PAIR_FILTERS, headStyle, pairFilter, swatchGroups, toggleHead } from "./lines.js";
import { isSeq2seq, shapeOf } from "./seq2seq.js";
import { getState, update } from "./state.js";
import { renderTokenView } from "./tokens.js";
import { WEIGHTINGS, weightingOf } from "./weighting.js";

// All heads of a layer draw at most this many lines (the strongest): 12 heads x 64 tokens can pass 10,000.
export const LINE_BUDGET = 4000;

export class LinesView {
  constructor() {
    this.hidden = new Set(); // heads whose lines are off
    this.shape = ""; // "heads:kvHeads" the hidden set belongs to
    this.pin = null; // the isolated token, {side, index}
    this.last = null; // what draw() was given, for a redraw after a swatch press
    for (const radio of $("linesMode").querySelectorAll("input")) {
      radio.addEventListener("change", () => update({ lines: radio.value }));
    }
    const pairs = $("linesPairs");
    pairs.replaceChildren(
      ...Object.entries(PAIR_FILTERS).map(([value, { label }]) => el("option", { text: label, attrs: { value } })),
    );
    pairs.addEventListener("change", () => update({ pairs: pairs.value }));
  }

  /**
   * Draw `spec` (detail.js: tokens, segments, causal, values of the selected head, exact, ...) of `run` at
   * the state's selection: that head alone, or every head of the layer from the decoded answer.
   */
  draw(run, spec) {
    this.last = { run, spec };
    const { attention } = run;
    const { layer, head, lines: mode, pairs, hideFirst } = getState();
    const shape = `${attention.heads}:${attention.kvHeads}`;
    if (shape !== this.shape) Object.assign(this, { shape, hidden: new Set(), pin: null });
    const { rows, cols } = shapeOf(attention);
    if (this.pin && this.pin.index >= (this.pin.side === "left" ? rows : cols)) this.pin = null;
    const all = mode === "layer";
    const segmented = !isSeq2seq(run.full) && attention.boundary > 0; // a pair's two segments, not seq2seq's
    this.showControls(attention, { layer, head, all, pairs, segmented });

    const heads = [];
    if (all) {
      const slot = (h) => (attention.heads > 1 ? h / (attention.heads - 1) - 0.5 : 0);
      for (let h = 0; h < attention.heads; h++) {
        if (this.hidden.has(h)) continue;
        const raw = attention.headInto(layer, h);
        const values = hideFirst ? withoutFirstToken(raw, rows, cols) : raw;
        heads.push({ h, values, ...headStyle(h), slot: slot(h) });
      }
    }
    const box = $("tokenLines");
    const { drawn, threshold, cut } = renderTokenView(box, {
      ...spec,
      layer,
      head,
      heads: all ? heads : undefined,
      // Cross-attention: the target's tokens on the left, the source's on the right, lines the alignment.
      ...(attention.kind === "cross" ? { sides: { left: "Target (queries)", right: "Source (keys)" } } : {}),
      exact: all ? attention.exact : spec.exact,
      keep: segmented ? pairFilter(pairs, attention.segments) : undefined,
      budget: all ? LINE_BUDGET : Infinity,
      pinned: this.pin,
      onPin: (pin) => {
        this.pin = pin;
      },
      onRead: (text) => {
        $("linesReadout").textContent = text;
      },
    });
    const view = $("tokenView");
    Object.assign(view.dataset, { lines: String(drawn), threshold: String(threshold), exact: String(spec.exact) });
    view.dataset.mode = all ? "layer" : "head";
    $("linesNote").textContent = this.note(attention, { all, drawn, threshold, cut, shown: heads.length });
  }

  /** Redraw after a swatch press, with what draw() was last given. */
  redraw() {
    if (this.last) this.draw(this.last.run, this.last.spec);
  }

  note(attention, { all, drawn, threshold, cut, shown }) {
    const weighting = weightingOf(attention);
    const value = WEIGHTINGS[weighting].value; // "weight", or a norm-weighted "share"
    const parts = [`${drawn.toLocaleString("en")} line(s) of ${value} ≥ ${threshold}`];
    if (cut !== null) parts[0] = `The strongest ${drawn.toLocaleString("en")} lines (${value} ≥ ${cut.toFixed(3)})`;
    if (weighting === "norm") parts.push("weight × value norm: each line is its row's share of α·‖f(x)‖");
    if (all) {
      parts.push(`${shown} of ${attention.heads} heads shown`);
      if (!attention.exact) parts.push(`${attention.bits}-bit values (within ±${attention.maxAbsError.toFixed(4)})`);
      if (attention.heads > DISTINCT_STYLES) parts.push(`heads past ${DISTINCT_STYLES} repeat a colour and dash`);
      else if (attention.heads > 16) parts.push("heads past 16 repeat a colour with a dashed line");
    }
    return `${parts.join(" · ")}.`;
  }

  showControls(attention, { layer, head, all, pairs, segmented }) {
    $("linesOneLabel").textContent = typeof head === "number" ? `One head (L${layer} H${head})` : "The selected head";
    $("linesAllLabel").textContent = `All heads of layer ${layer}`;
    const mode = all ? "layer" : "head";
    for (const radio of $("linesMode").querySelectorAll("input")) radio.checked = radio.value === mode;
    $("linesPairsField").hidden = !segmented;
    $("linesPairs").value = pairs;
    const swatches = $("linesSwatches");
    swatches.hidden = !all;
    if (all && swatches.dataset.shape !== this.shape) this.buildSwatches(swatches, attention);
    for (const swatch of swatches.querySelectorAll(".swatch")) {
      swatch.setAttribute("aria-pressed", String(!this.hidden.has(Number(swatch.dataset.h))));
    }
    const showAll = swatches.querySelector(".swatch-all");
    if (showAll) showAll.disabled = this.hidden.size === 0;
  }

  // Built once per model shape; a press only flips aria-pressed and redraws the lines, so a double-click
  // lands on the same button twice.
  buildSwatches(swatches, attention) {
    swatches.dataset.shape = this.shape;
    const press = (h, only) => {
      this.hidden = toggleHead(this.hidden, h, attention.heads, { only });
      this.redraw();
    };
    const groups = swatchGroups(attention).map(({ label, heads }) => {
      const buttons = heads.flatMap((h) => {
        const { color, dash } = headStyle(h);
        const chip = el("span", { className: `swatch-chip${dash ? " dashed" : ""}`, attrs: { "aria-hidden": "true" } });
        chip.style.setProperty("--swatch", color);
        const swatch = el(
          "button",
          {
            className: "swatch",
            attrs: { type: "button", title: `H${h}: click to hide or show its lines; double-click to show it alone` },
            data: { h },
          },
          [chip, document.createTextNode(`H${h}`)],
        );
        swatch.addEventListener("click", () => press(h, false));
        swatch.addEventListener("dblclick", () => press(h, true));
        const only = el("button", {
          className: "swatch-only",
          text: "only",
          attrs: { type: "button", "aria-label": `Show only H${h} (again: all heads)` },
          data: { h },
        });
        only.addEventListener("click", () => press(h, true));
        return [swatch, only];
      });
      const title = label ? [el("span", { className: "swatch-group-label", text: `${label}:` })] : [];
      return el("span", { className: "swatch-group", attrs: { role: "group", "aria-label": label || "heads" } }, [
        ...title,
        ...buttons,
      ]);
    });
    const showAll = el("button", { className: "swatch-all", text: "All heads", attrs: { type: "button" } });
    showAll.addEventListener("click", () => {
      this.hidden = new Set();
      this.redraw();
    });
    swatches.replaceChildren(...groups, showAll);
  }
}
