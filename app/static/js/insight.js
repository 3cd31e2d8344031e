// Head statistics from POST /api/analysis: a sortable table of every head, the grid's colour-by select
// with its legend, and "heads like this one". Pure DOM over the API's answer; numbers and labels go in
// through textContent.

import { el } from "./dom.js";
import { STAT_GRADIENT, statColor } from "./colors.js";
import { isGrouped, kvGroup } from "./decoder.js";
import { shortHeadLabel } from "./labels.js";
import { statName, thresholdSentences } from "./names.js";

const KV_GROUP = "kv group"; // the table's column of a head's key/value group, with grouped-query heads
const INDEX_COLUMNS = ["layer", "head", KV_GROUP, "label"]; // sorted low-to-high first; the rest high-to-low

// Change score of compare mode, shown as one more statistic (docs/http-api.md: mean JS divergence, nats).
export const CHANGE = "change";
const CHANGE_DESCRIPTION = "Mean Jensen–Shannon divergence between A's and B's rows on the aligned tokens (nats, 0..ln 2).";

/** A statistic's value as the table and titles show it: tokens with 2 decimals, the rest with 3. */
export function formatStat(key, value) {
  if (!Number.isFinite(value)) return "–";
  return value.toFixed(key === "distance" ? 2 : 3);
}

/** {key: L x H} of the analysis' statistics, plus the change score when a comparison is loaded. */
export function statTable(analysis, compare) {
  const stats = { ...analysis.stats };
  if (compare) stats[CHANGE] = compare.score;
  return stats;
}

/** What a statistic measures: the API's one line (the change score's own for compare mode). */
export function describeStat(analysis, key) {
  if (key === CHANGE) return CHANGE_DESCRIPTION;
  return analysis.stat_descriptions?.[key] ?? key;
}

/** Min and max of an L x H table. */
function extent(values) {
  let lo = Infinity;
  let hi = -Infinity;
  for (const row of values) {
    for (const v of row) {
      if (!Number.isFinite(v)) continue;
      lo = Math.min(lo, v);
      hi = Math.max(hi, v);
    }
  }
  return lo <= hi ? [lo, hi] : [0, 0];
}

/** (value) -> CSS colour over the table's own range, so the frames use the whole scale. */
export function colorScaleFor(values) {
  const [lo, hi] = extent(values);
  return { lo, hi, color: (v) => statColor(hi > lo ? (v - lo) / (hi - lo) : 0.5) };
}

/** Fill the colour-by select with the statistics (keeps `chosen` when it is still offered). */
export function fillColorBy(select, analysis, compare, chosen) {
  const keys = Object.keys(statTable(analysis, compare));
  const options = [el("option", { text: "nothing", attrs: { value: "" } })];
  for (const key of keys) {
    options.push(el("option", { text: statName(key), attrs: { value: key, title: describeStat(analysis, key) } }));
  }
  select.replaceChildren(...options);
  select.value = keys.includes(chosen) ? chosen : "";
  return select.value;
}

/** Legend of the frame colours: min, the gradient, max, and what the statistic means. */
export function renderLegend(container, analysis, compare, key) {
  if (!key) {
    container.hidden = true;
    container.replaceChildren();
    return;
  }
  const { lo, hi } = colorScaleFor(statTable(analysis, compare)[key]);
  const bar = el("span", { className: "legend-bar", attrs: { "aria-hidden": "true" } });
  bar.style.backgroundImage = STAT_GRADIENT;
  container.replaceChildren(
    el("span", { className: "legend-name", text: statName(key) }),
    el("span", { className: "legend-min", text: formatStat(key, lo) }),
    bar,
    el("span", { className: "legend-max", text: formatStat(key, hi) }),
    el("span", { className: "legend-help", text: describeStat(analysis, key) }),
  );
  container.hidden = false;
}

/**
 * The sortable table: one row per head. `sort` = {key, descending}; clicking a column header sorts by
 * it (again: reverses), clicking a row (or Enter on it) calls onOpen(layer, head).
 */
export class StatsTable {
  constructor(table, { onOpen }) {
    this.table = table;
    this.onOpen = onOpen;
    this.sort = { key: "layer", descending: false };
    this.sorted = false; // true once a person picked a sort: later renders keep it
    this.rows = [];
    this.stats = {};
    // A column from outside the analysis ({key, name, help, values: L x H, format}: the head effects), kept
    // across renders until set to null; `drawn` holds render's arguments, so setting it draws again.
    this.extra = null;
    this.drawn = null;
    table.addEventListener("click", (event) => {
      const sortButton = event.target.closest("th button[data-key]");
      if (sortButton) return this.sortBy(sortButton.dataset.key);
      const row = event.target.closest("tbody tr");
      if (row) this.onOpen(Number(row.dataset.layer), Number(row.dataset.head));
    });
    table.addEventListener("keydown", (event) => {
      const row = event.target.closest?.("tbody tr");
      if (!row || (event.key !== "Enter" && event.key !== " ")) return;
      event.preventDefault();
      this.onOpen(Number(row.dataset.layer), Number(row.dataset.head));
    });
  }

  /**
   * Build the table for an analysis (and a comparison, which adds the change column); `model` =
   * {heads, kvHeads} adds the kv group column when query heads share key/value heads.
   */
  render(analysis, compare, model = null) {
    this.drawn = [analysis, compare, model];
    const extra = this.extra?.values.length === analysis.layers ? this.extra : null; // of this model's shape
    // The outside column first among the statistics: in view without scrolling the table sideways.
    this.stats = { ...(extra ? { [extra.key]: extra.values } : {}), ...statTable(analysis, compare) };
    const keys = Object.keys(this.stats);
    const grouped = Boolean(model) && isGrouped(model);
    const columns = [
      ["layer", "Layer index (0 = nearest the input)."],
      ["head", "Head index within the layer."],
      ...(grouped ? [[KV_GROUP, "The key/value head this query head reads (grouped-query attention)."]] : []),
      ["label", ["What the head mostly does.", ...thresholdSentences(analysis.thresholds)].join(" ")],
      ...keys.map((key) => [key, key === extra?.key ? extra.help : describeStat(analysis, key)]),
    ];
    const header = el(
      "tr",
      {},
      columns.map(([key, help]) =>
        el("th", { attrs: { scope: "col", "aria-sort": "none" }, data: { key } }, [
          el("button", { className: "sort", text: key === extra?.key ? extra.name : statName(key), attrs: { type: "button", title: help }, data: { key } }),
        ]),
      ),
    );
    this.table.tHead.replaceChildren(header);
    this.rows = [];
    for (let l = 0; l < analysis.layers; l++) {
      for (let h = 0; h < analysis.heads; h++) {
        const label = analysis.labels?.[l]?.[h] ?? "";
        const group = grouped ? kvGroup(h, model.heads, model.kvHeads) : null;
        const cells = [el("td", { text: String(l) }), el("td", { text: String(h) })];
        if (grouped) cells.push(el("td", { className: "num", text: String(group) }));
        cells.push(el("td", { text: label }));
        for (const key of keys) {
          const format = key === extra?.key ? extra.format : (v) => formatStat(key, v);
          cells.push(el("td", { className: "num", text: format(this.stats[key][l][h]) }));
        }
        const row = el(
          "tr",
          { attrs: { tabindex: "0", title: `Open layer ${l}, head ${h}` }, data: { layer: l, head: h, label } },
          cells,
        );
        this.rows.push({ row, layer: l, head: h, group, label });
      }
    }
    const sortable = [...INDEX_COLUMNS.filter((key) => key !== KV_GROUP || grouped), ...keys];
    if (!sortable.includes(this.sort.key)) this.sort = { key: "layer", descending: false };
    this.apply();
  }

  /** Add (or with null remove) the outside column, and draw the table again with it. */
  setExtra(extra) {
    this.extra = extra;
    if (this.drawn) this.render(...this.drawn);
  }

  value(entry, key) {
    if (key === "layer") return entry.layer;
    if (key === "head") return entry.head;
    if (key === KV_GROUP) return entry.group;
    if (key === "label") return entry.label;
    return this.stats[key][entry.layer][entry.head];
  }

  /** Sort by `key`; the same key again reverses. Statistics start high-to-low (the notable heads first). */
  sortBy(key) {
    this.sorted = true;
    if (this.sort.key === key) this.sort = { key, descending: !this.sort.descending };
    else this.sort = { key, descending: !INDEX_COLUMNS.includes(key) };
    this.apply();
  }

  apply() {
    const { key, descending } = this.sort;
    const sign = descending ? -1 : 1;
    const sorted = [...this.rows].sort((a, b) => {
      const va = this.value(a, key);
      const vb = this.value(b, key);
      const order = typeof va === "string" ? va.localeCompare(vb) : va - vb;
      // Ties keep model order, so a sort is stable and readable.
      return order * sign || a.layer - b.layer || a.head - b.head;
    });
    this.table.tBodies[0].replaceChildren(...sorted.map((entry) => entry.row));
    for (const th of this.table.tHead.querySelectorAll("th")) {
      const active = th.dataset.key === key;
      th.setAttribute("aria-sort", active ? (descending ? "descending" : "ascending") : "none");
    }
  }

  /** Mark the head shown in the detail view. */
  select(layer, head) {
    for (const { row, layer: l, head: h } of this.rows) {
      const on = l === layer && h === head;
      row.classList.toggle("selected", on);
      row.setAttribute("aria-selected", String(on));
    }
  }
}

/**
 * "Heads like this one": the API's nearest heads for (layer, head), as buttons that open them, named with
 * their key/value group when `model` ({heads, kvHeads}) groups its heads.
 */
export function renderSimilar(container, analysis, layer, head, onOpen, model = null) {
  const similar = analysis?.similar?.[layer]?.[head];
  if (!similar) {
    container.replaceChildren(el("span", { className: "hint", text: "Pick a single head to see its neighbours." }));
    return;
  }
  const buttons = similar.map(([l, h, distance]) => {
    const label = analysis.labels?.[l]?.[h] ?? "";
    const button = el("button", {
      className: "chip",
      text: `${shortHeadLabel(l, h, model)}${label ? ` ${label}` : ""}`,
      attrs: { type: "button", title: `layer ${l}, head ${h}: distance ${distance.toFixed(2)} in statistic space` },
      data: { layer: l, head: h },
    });
    button.addEventListener("click", () => onOpen(l, h));
    return button;
  });
  container.replaceChildren(...buttons);
}
