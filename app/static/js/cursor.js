// Keyboard cell reading in the head detail: while the heatmap has focus, arrow keys move a cell cursor (an
// outline over the figure, not a Plotly shape, so image exports never carry it) and a live region reads
// the cell out in the hover's words. Escape takes the cursor away; focus leaving the figure does too.

import { cellKey, cellText } from "./keys.js";

export class CellCursor {
  /** `gd`: the heatmap element; `readout`: its live region (aria-live). The outline goes in gd's parent. */
  constructor(gd, readout) {
    this.gd = gd;
    this.readout = readout;
    this.info = null; // {tokens, keyTokens, values, causal, renormalised, norm, sizes, onRow} of the figure drawn
    this.at = { i: 0, j: 0 };
    this.shown = false;
    this.outline = document.createElement("div");
    this.outline.className = "cell-cursor";
    this.outline.hidden = true;
    this.outline.setAttribute("aria-hidden", "true");
    gd.parentElement.append(this.outline);
    this.place = () => this.shown && this.show(false); // zoom or pan: the outline follows its cell
    gd.addEventListener("keydown", (event) => this.onKey(event));
    // A keyboard arrival shows the cursor where it was; a mouse click on the figure does not.
    gd.addEventListener("focus", () => gd.matches(":focus-visible") && this.show());
    gd.addEventListener("blur", () => this.hide());
  }

  /**
   * After each draw of the heatmap: the figure's tokens (display text; `keyTokens` too when the keys are
   * another sentence), how its cells read, and `onRow(i)`
   * (what a click on row i does; Enter on the cursor does the same).
   */
  follow(info) {
    const key = (f) => [...f.tokens, "\u0001", ...(f.keyTokens ?? [])].join("\u0000");
    const other = !this.info || key(this.info) !== key(info);
    this.info = info;
    if (other) this.at = { i: 0, j: 0 }; // another input: start at its first cell
    this.gd.removeListener?.("plotly_relayout", this.place); // a redraw may have kept it (same figure)
    this.gd.on?.("plotly_relayout", this.place);
    if (this.shown) this.show(false);
  }

  onKey(event) {
    if (!this.info || event.altKey || event.metaKey) return;
    if (event.key === "Escape") {
      if (this.shown) event.preventDefault();
      this.hide();
      return;
    }
    if (event.key === "Enter" && this.shown) {
      this.info.onRow?.(this.at.i);
      return;
    }
    const { tokens, keyTokens = tokens } = this.info;
    const next = cellKey(this.at, event.key, event.ctrlKey, tokens.length, keyTokens.length);
    if (!next) return;
    event.preventDefault(); // the keys read cells: no scrolling, and never the grid's selection
    this.at = next;
    this.show();
  }

  /**
   * The value at the cursor: the figure's own `values` (n*cols) where follow() was given them, which a colour
   * scale leaves as they are, else the heatmap trace's z (null where nothing is drawn).
   */
  value() {
    const trace = this.gd.data?.find((t) => t.type === "heatmap");
    const drawn = trace?.z?.[this.at.i]?.[this.at.j] ?? null;
    const { values, tokens, keyTokens = tokens } = this.info;
    return values && drawn !== null ? values[this.at.i * keyTokens.length + this.at.j] : drawn;
  }

  /** Outline the cursor's cell and read it out (`announce` false: only move the outline). */
  show(announce = true) {
    const xa = this.gd._fullLayout?.xaxis;
    const ya = this.gd._fullLayout?.yaxis;
    if (!this.info || !xa || !ya) return;
    this.shown = true;
    const { i, j } = this.at;
    // Cell edges in px within the plot area, clipped to it (a zoomed figure shows part of the cells).
    const edges = (axis, k) => {
      const [a, b] = [axis.l2p(k - 0.5), axis.l2p(k + 0.5)].sort((p, q) => p - q);
      return [Math.max(a, 0), Math.min(b, axis._length)];
    };
    const [x0, x1] = edges(xa, j);
    const [y0, y1] = edges(ya, i);
    const box = this.outline.style;
    box.left = `${this.gd.offsetLeft + xa._offset + x0}px`;
    box.top = `${this.gd.offsetTop + ya._offset + y0}px`;
    box.width = `${Math.max(0, x1 - x0)}px`;
    box.height = `${Math.max(0, y1 - y0)}px`;
    this.outline.hidden = x1 <= x0 || y1 <= y0; // zoomed away from the cell: the readout still reads it
    if (!this.outline.hidden) this.outline.scrollIntoView({ block: "nearest", inline: "nearest" });
    const cols = (this.info.keyTokens ?? this.info.tokens).length;
    const size = this.info.sizes?.[i * cols + j] ?? null; // weight × value norm: the exact head's ‖α f‖
    const text = cellText({ ...this.info, i, j, value: this.value(), size });
    if (announce || this.readout.textContent) this.readout.textContent = text;
  }

  hide() {
    this.shown = false;
    this.outline.hidden = true;
    this.readout.textContent = "";
  }
}
