// The Corpus view's head grid: one cell per layer x head, filled with the colour of its corpus mean of the
// chosen statistic (the normal grid's frame colours: insight.js colorScaleFor over the grid's own range),
// the value written in it. One tab stop, as the normal grid (WAI-ARIA grid pattern): arrows, Home/End,
// PageUp/PageDown move selection and focus together; Enter, Space or a click opens the head.

import { el } from "./dom.js";
import { STAT_GRADIENT } from "./colors.js";
import { colorScaleFor, formatStat } from "./insight.js";
import { corpusKey } from "./corpus-model.js";
import { statName } from "./names.js";

/** Black or white ink, whichever reads on `rgb(r, g, b)` (WCAG relative luminance, cut at 0.4). */
function inkOn(css) {
  const [r, g, b] = (css.match(/\d+/g) ?? [255, 255, 255]).map((v) => (Number(v) / 255) ** 2.2);
  return 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.4 ? "#000" : "#fff";
}

export class CorpusGrid {
  /** `onSelect(layer, head)`: a click, Enter or a key chose a head. */
  constructor(container, legend, { onSelect }) {
    this.container = container;
    this.legend = legend;
    this.onSelect = onSelect;
    this.size = { layers: 0, heads: 0 };
    container.addEventListener("click", (event) => {
      const cell = event.target.closest(".corpus-cell");
      if (cell) this.onSelect(Number(cell.dataset.layer), Number(cell.dataset.head));
    });
    container.addEventListener("keydown", (event) => {
      const cell = event.target.closest(".corpus-cell");
      if (!cell || event.altKey || event.metaKey) return;
      const at = { layer: Number(cell.dataset.layer), head: Number(cell.dataset.head) };
      const next = event.key === "Enter" || event.key === " " ? at : corpusKey(at, event.key, event.ctrlKey, this.size);
      if (!next) return;
      event.preventDefault(); // the keys move in the grid, never scroll the page
      this.onSelect(next.layer, next.head);
      this.focusSelected();
    });
  }

  /** Draw `means` (L x H) of `stat`, with the legend: name, min, the gradient, max, and its meaning. */
  render(means, stat, description = "") {
    const layers = means.length;
    const heads = means[0]?.length ?? 0;
    this.size = { layers, heads };
    const { lo, hi, color } = colorScaleFor(means);
    const name = statName(stat);
    const corner = el("span", { className: "row-label", attrs: { role: "columnheader", "aria-label": "layer" } });
    const header = el("div", { className: "grid-row grid-header", attrs: { role: "row" } }, [corner]);
    for (let h = 0; h < heads; h++) header.append(el("span", { className: "col-label", text: `H${h}`, attrs: { role: "columnheader" } }));
    const rows = [header];
    for (let l = 0; l < layers; l++) {
      const row = el("div", { className: "grid-row", attrs: { role: "row" } }, [
        el("span", { className: "row-label", text: `L${l}`, attrs: { role: "rowheader" } }),
      ]);
      for (let h = 0; h < heads; h++) {
        const value = means[l][h];
        const shown = Number.isFinite(value) ? formatStat(stat, value) : "–";
        const label = `L${l} H${h} · ${name}: corpus mean ${shown}`;
        const cell = el(
          "button",
          {
            className: "corpus-cell",
            text: shown,
            attrs: { type: "button", role: "gridcell", title: label, "aria-label": label, "aria-selected": "false", tabindex: "-1" },
            data: { layer: l, head: h, mean: Number.isFinite(value) ? String(value) : "" },
          },
        );
        if (Number.isFinite(value)) {
          const fill = color(value);
          cell.style.background = fill;
          cell.style.color = inkOn(fill);
        } else cell.classList.add("empty");
        row.append(cell);
      }
      rows.push(row);
    }
    this.container.style.setProperty("--cols", String(heads));
    this.container.replaceChildren(...rows);
    const bar = el("span", { className: "legend-bar", attrs: { "aria-hidden": "true" } });
    bar.style.backgroundImage = STAT_GRADIENT;
    this.legend.replaceChildren(
      el("span", { className: "legend-name", text: `Cell colour: ${name}, corpus mean` }),
      el("span", { className: "legend-min", text: formatStat(stat, lo) }),
      bar,
      el("span", { className: "legend-max", text: formatStat(stat, hi) }),
      el("span", { className: "legend-help", text: description }),
    );
    this.legend.hidden = false;
  }

  /** Mark (layer, head) and make it the grid's one tab stop. */
  select(layer, head) {
    const cell = this.container.querySelector(`.corpus-cell[data-layer="${layer}"][data-head="${head}"]`);
    if (!cell) return;
    for (const old of this.container.querySelectorAll(".corpus-cell.selected, .corpus-cell[tabindex='0']")) {
      old.classList.remove("selected");
      old.setAttribute("aria-selected", "false");
      old.tabIndex = -1;
    }
    cell.classList.add("selected");
    cell.setAttribute("aria-selected", "true");
    cell.tabIndex = 0;
  }

  focusSelected() {
    this.container.querySelector(".corpus-cell[tabindex='0']")?.focus();
  }
}
