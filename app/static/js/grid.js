// Model view: every layer x head (plus each layer's aggregates) as a small canvas thumbnail.
// Thumbnails are drawn from the decoded uint8 data through one colour LUT, never as Plotly figures:
// visible ones first (IntersectionObserver), the rest in short idle slices so the page stays responsive.

import { el } from "./dom.js";
import { LUT, MASK_BG, MASK_FG } from "./colors.js";
import { AGGREGATES, isAggregate } from "./aggregates.js";
import { isGrouped, kvGroups } from "./decoder.js";
import { selectionLabel } from "./labels.js";
import { gridKey } from "./keys.js";
import { shapeOf } from "./seq2seq.js";

const THUMB_PX = 64; // canvas backing size; CSS scales it, pixelated
const SLICE_MS = 12; // budget per background slice, well under a frame

/**
 * Paint `matrix` (n*cols, query rows; cols = n when square) into an S x S ImageData. When n > S each pixel
 * shows the max of its block (sparse peaks survive; a mean would wash them out); when n < S cells are
 * repeated. A rectangular head (cross-attention) is stretched to the square, rows down and keys across.
 * Blocks entirely above the diagonal of a causal model are hatched grey: masked, not zero.
 */
export function paintThumbnail(image, matrix, n, causal, cols = n) {
  const S = image.width;
  const data = image.data;
  for (let y = 0; y < S; y++) {
    const r0 = Math.floor((y * n) / S);
    const r1 = Math.max(r0 + 1, Math.floor(((y + 1) * n) / S));
    for (let x = 0; x < S; x++) {
      const c0 = Math.floor((x * cols) / S);
      const c1 = Math.max(c0 + 1, Math.floor(((x + 1) * cols) / S));
      const p = 4 * (y * S + x);
      if (causal && c0 > r1 - 1) {
        const c = (x + y) % 6 < 2 ? MASK_FG : MASK_BG;
        data[p] = c[0];
        data[p + 1] = c[1];
        data[p + 2] = c[2];
        data[p + 3] = 255;
        continue;
      }
      let m = 0;
      for (let r = r0; r < r1; r++) {
        const o = r * cols;
        for (let c = c0; c < c1; c++) {
          const v = matrix[o + c];
          if (v > m) m = v;
        }
      }
      const k = 4 * Math.min(255, Math.round(m * 255));
      data[p] = LUT[k];
      data[p + 1] = LUT[k + 1];
      data[p + 2] = LUT[k + 2];
      data[p + 3] = 255;
    }
  }
}

/** (layer, head) of a thumbnail (head: an index or an aggregate key). */
function cellOf(thumb) {
  const head = thumb.dataset.head;
  return { layer: Number(thumb.dataset.layer), head: isAggregate(head) ? head : Number(head) };
}

// The header rows' first cell, over the layer labels.
const corner = () => el("span", { className: "row-label", attrs: { role: "columnheader", "aria-label": "layer" } });
// Grouped-query heads: a narrow empty column between KV groups (the row's cells follow it).
const kvGap = () => el("span", { className: "kv-gap", attrs: { "aria-hidden": "true" } });
// Heads that open a KV group after the first: a gap goes before each.
const groupStarts = (groups) => new Set(groups.slice(1).map((g) => g.first));

/** "kv 0", "kv 1", ... each spanning the query heads that read that key/value head. */
function kvHeaderRow(groups) {
  const kvRow = el("div", { className: "grid-row grid-header kv-header", attrs: { role: "row" } }, [corner()]);
  for (const { group, first, count } of groups) {
    if (group > 0) kvRow.append(kvGap());
    const label = el("span", {
      className: "kv-label",
      text: `kv ${group}`,
      attrs: {
        title: `heads ${first}–${first + count - 1} share key/value head ${group}`,
        role: "columnheader",
        "aria-colspan": String(count),
      },
      data: { group },
    });
    label.style.gridColumn = `span ${count}`;
    kvRow.append(label);
  }
  return kvRow;
}

/** The column labels: H0, H1, ... then the aggregates'. */
function headerRow({ heads, aggregates, grouped, groups }) {
  const starts = groupStarts(groups);
  const header = el("div", { className: "grid-row grid-header", attrs: { role: "row" } }, [corner()]);
  const columnHeader = { role: "columnheader" };
  for (let h = 0; h < heads; h++) {
    if (grouped && starts.has(h)) header.append(kvGap());
    header.append(el("span", { className: "col-label", text: `H${h}`, attrs: columnHeader }));
  }
  for (const [, agg] of aggregates) {
    header.append(el("span", { className: "col-label agg", text: agg.label, attrs: columnHeader }));
  }
  return header;
}

/** Layer `l`'s row: its label, then a thumbnail button a head and aggregate, each added to `pending`. */
function layerRow(l, { heads: H, aggregates, grouped, groups }, model, pending) {
  const starts = groupStarts(groups);
  const rowLabel = el("span", { className: "row-label", text: `L${l}`, attrs: { role: "rowheader" } });
  const row = el("div", { className: "grid-row", attrs: { role: "row" } }, [rowLabel]);
  const heads = [...Array(H).keys()].map((h) => [h, selectionLabel(l, h, model)]);
  const aggs = aggregates.map(([key]) => [key, selectionLabel(l, key)]);
  for (const [head, label] of [...heads, ...aggs]) {
    if (grouped && starts.has(head)) row.append(kvGap());
    const canvas = el("canvas", { attrs: { width: THUMB_PX, height: THUMB_PX } });
    const thumb = el(
      "button",
      {
        className: typeof head === "number" ? "thumb" : "thumb thumb-agg",
        // A cell of the grid; a tab stop only while selected (select() moves it; the first until then).
        attrs: {
          type: "button",
          role: "gridcell",
          title: label,
          "aria-label": label,
          "aria-selected": "false",
          tabindex: pending.length === 0 ? "0" : "-1",
        },
        data: { layer: l, head, drawn: "false" },
      },
      [canvas],
    );
    row.append(thumb);
    pending.push(thumb);
  }
  return row;
}

/** Paint a thumbnail's head (or aggregate) of `attention` into its canvas, once. */
function drawThumbnail(thumb, attention, { n, cols, scratch }) {
  if (thumb.dataset.drawn === "true") return;
  const layer = Number(thumb.dataset.layer);
  const key = thumb.dataset.head;
  const matrix = isAggregate(key)
    ? AGGREGATES[key].compute(attention, layer, scratch)
    : attention.headInto(layer, Number(key), scratch);
  const canvas = thumb.firstElementChild;
  const ctx = canvas.getContext("2d");
  const image = ctx.createImageData(canvas.width, canvas.height);
  paintThumbnail(image, matrix, n, attention.causal, cols);
  ctx.putImageData(image, 0, 0);
  thumb.dataset.drawn = "true";
}

// The grid is one tab stop (WAI-ARIA grid pattern): only the selected cell has tabindex 0, and the keys
// move selection and focus together, so there is one ring and Enter opens the cell that has it.
export class Grid {
  /** `onSelect(layer, head)`: a click or a key chose a head; `onOpen(layer, head)`: Enter or Space on it. */
  constructor(container, { onSelect, onOpen = onSelect }) {
    this.container = container;
    this.onSelect = onSelect;
    this.onOpen = onOpen;
    this.observer = null;
    this.model = null; // {heads, kvHeads} of the run drawn: names the heads with their KV group
    this.layers = 0;
    this.container.addEventListener("click", (event) => {
      const thumb = event.target.closest(".thumb");
      if (!thumb || !this.container.contains(thumb)) return;
      const { layer, head } = cellOf(thumb);
      this.onSelect(layer, head);
      this.focusSelected(); // Safari does not focus a clicked button: the keys must go on from here
    });
    this.container.addEventListener("keydown", (event) => this.onKey(event));
  }

  onKey(event) {
    const thumb = event.target.closest(".thumb");
    if (!thumb || event.altKey || event.metaKey || !this.model) return;
    const { layer, head } = cellOf(thumb);
    if (event.key === "Enter" || event.key === " ") {
      event.preventDefault(); // not the button's own click as well
      this.onOpen(layer, head);
      return;
    }
    const next = gridKey({ layer, head }, event.key, event.ctrlKey, { layers: this.layers, heads: this.model.heads });
    if (!next) return;
    event.preventDefault(); // the keys move in the grid, never scroll the page
    this.onSelect(next.layer, next.head);
    this.focusSelected();
  }

  /** Focus the selected cell (the grid's one tab stop). */
  focusSelected() {
    this.container.querySelector('.thumb[tabindex="0"]')?.focus();
  }

  clear() {
    this.observer?.disconnect();
    this.container.replaceChildren();
  }

  /**
   * Build the grid for `attention`; resolves true once every thumbnail is drawn, false when `signal` (the
   * run's) aborted first: what is left undrawn stays so. `aggregates` false: the heads alone (a long
   * input's pooled overview, whose mean would average maxima).
   */
  render(attention, { signal, aggregates: withAggregates = true } = {}) {
    this.clear();
    const { layers: L, heads: H } = attention;
    this.model = { heads: H, kvHeads: attention.kvHeads };
    this.layers = L;
    const aggregates = withAggregates ? Object.entries(AGGREGATES) : [];
    const columns = { heads: H, aggregates, grouped: isGrouped(this.model), groups: kvGroups(this.model) };
    this.layOutColumns(columns);
    const rows = [];
    if (columns.grouped) rows.push(kvHeaderRow(columns.groups));
    rows.push(headerRow(columns));
    const pending = [];
    for (let l = 0; l < L; l++) rows.push(layerRow(l, columns, this.model, pending));
    this.container.replaceChildren(...rows);

    const { rows: n, cols } = shapeOf(attention);
    const scratch = new Float32Array(n * cols);
    return this.drawLazily(pending, (thumb) => drawThumbnail(thumb, attention, { n, cols, scratch }), signal);
  }

  /** The grid's columns: one a head and aggregate; grouped-query heads get a narrow gap between KV groups. */
  layOutColumns({ heads, aggregates, grouped, groups }) {
    this.container.style.setProperty("--cols", String(heads + aggregates.length));
    this.container.classList.toggle("grouped", grouped);
    if (grouped) {
      const cells = groups.map((g) => `repeat(${g.count}, var(--thumb))`).join(" var(--kv-gap) ");
      const aggs = aggregates.length ? ` repeat(${aggregates.length}, var(--thumb))` : ""; // repeat(0) is invalid CSS
      this.container.style.setProperty("--grid-template", `30px ${cells}${aggs}`);
    } else this.container.style.removeProperty("--grid-template");
  }

  /**
   * Draw each of `pending` with `draw`: what is on screen first, then the rest in short slices. Resolves true
   * once all are drawn, false when `signal` aborted first.
   */
  drawLazily(pending, draw, signal) {
    return new Promise((resolve) => {
      let remaining = pending.length;
      const drawAndCount = (thumb) => {
        if (thumb.dataset.drawn === "true") return;
        draw(thumb);
        remaining--;
        if (remaining === 0) {
          observer.disconnect(); // declared below; thumbnails are drawn only after it exists
          resolve(true);
        }
      };
      if (remaining === 0) return resolve(true);
      // What is on screen first...
      const observer = new IntersectionObserver((entries) => {
        if (signal?.aborted) return;
        for (const entry of entries) if (entry.isIntersecting) drawAndCount(entry.target);
      });
      this.observer = observer;
      signal?.addEventListener("abort", () => observer.disconnect(), { once: true });
      for (const thumb of pending) observer.observe(thumb);
      // ...then everything else in slices that leave the main thread free for input.
      let next = 0;
      const slice = () => {
        if (signal?.aborted) return resolve(false);
        const start = performance.now();
        while (next < pending.length && performance.now() - start < SLICE_MS) drawAndCount(pending[next++]);
        if (next < pending.length) setTimeout(slice, 0);
      };
      setTimeout(slice, 0);
    });
  }

  /**
   * Label and colour the head thumbnails (not the aggregates): `labels` L x H strings shown in the title;
   * `badges` L x H short texts ("" for none: names.js decides which heads carry one); `values` L x H
   * numbers coloured by `color(value)` on the frame, with `describe(value)` in the title. Any may be null
   * (clears it). Survives until the next render.
   */
  decorate({ labels = null, badges = null, values = null, color = null, describe = String, statName = "" } = {}) {
    for (const thumb of this.container.querySelectorAll(".thumb:not(.thumb-agg)")) {
      const layer = Number(thumb.dataset.layer);
      const head = Number(thumb.dataset.head);
      const label = labels?.[layer]?.[head] ?? "";
      const value = values?.[layer]?.[head];
      const parts = [selectionLabel(layer, head, this.model)];
      if (label) parts.push(label);
      if (values && value !== undefined) parts.push(`${statName} ${describe(value)}`);
      const title = parts.join(" · ");
      thumb.setAttribute("title", title);
      thumb.setAttribute("aria-label", title);
      thumb.dataset.label = label;
      let badge = thumb.querySelector(".badge");
      const short = badges?.[layer]?.[head] ?? "";
      if (short) {
        badge ??= thumb.appendChild(el("span", { className: "badge", attrs: { "aria-hidden": "true" } }));
        badge.textContent = short;
      } else badge?.remove();
      if (values && Number.isFinite(value) && color) { // an absent statistic (null) leaves the frame plain
        thumb.style.setProperty("--frame", color(value));
        thumb.classList.add("colored");
        thumb.dataset.stat = String(value);
      } else {
        thumb.style.removeProperty("--frame");
        thumb.classList.remove("colored");
        delete thumb.dataset.stat;
      }
    }
  }

  /** Highlight the selected thumbnail (head is an index or an aggregate key) and make it the tab stop. */
  select(layer, head) {
    const thumb = this.container.querySelector(`.thumb[data-layer="${layer}"][data-head="${head}"]`);
    if (!thumb) return; // the old cell keeps the tab stop: the grid never loses its one
    for (const old of this.container.querySelectorAll('.thumb.selected, .thumb[tabindex="0"]')) {
      old.classList.remove("selected");
      old.setAttribute("aria-selected", "false");
      old.tabIndex = -1;
    }
    for (const label of this.container.querySelectorAll(".current")) label.classList.remove("current");
    // Its layer and head labels in bold too: the marker reads without colour.
    thumb.closest(".grid-row")?.querySelector(".row-label")?.classList.add("current");
    const column = isAggregate(head) ? this.model.heads + Object.keys(AGGREGATES).indexOf(head) : head;
    this.container.querySelectorAll(".grid-header:not(.kv-header) .col-label")[column]?.classList.add("current");
    thumb.classList.add("selected");
    thumb.setAttribute("aria-selected", "true");
    thumb.tabIndex = 0;
    thumb.scrollIntoView({ block: "nearest", inline: "nearest" });
  }
}
