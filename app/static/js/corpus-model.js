// The Corpus view's pure parts: its URL state, the grid's means and keys, the distribution figure, and the
// link from an example to the normal view of that text. No DOM, so Node's test runner imports it as the
// page does (tests/js/corpus.test.mjs).

import { formatStat } from "./insight.js";
import { ROLES, statName } from "./names.js";
import { DEFAULT_STATE, encodeState } from "./state.js";

export const PLOTS = ["box", "violin"];
export const DEFAULT_CORPUS = Object.freeze({ run: "", stat: "entropy", layer: 0, head: 0, plot: "box", all: false });
// Every point drawn beside the box up to this many texts; above, the outliers only (a box of 20,000
// jittered points is a grey smear and slow to draw). Either way a point opens its text, fetched on demand.
export const ALL_POINTS_MAX = 2000;
const SNIPPET_CHARS = 140;

const STAT = /^[a-z_]{1,32}$/;

function index(value, fallback) {
  return value !== null && /^\d{1,4}$/.test(value) ? Number(value) : fallback;
}

/** The view from a query string (`run`, `stat`, `layer`, `head`, `plot`, `all=1`); bad values fall back. */
export function readCorpusState(search) {
  const params = new URLSearchParams(search);
  return {
    run: params.get("run") ?? DEFAULT_CORPUS.run,
    stat: STAT.test(params.get("stat") ?? "") ? params.get("stat") : DEFAULT_CORPUS.stat,
    layer: index(params.get("layer"), DEFAULT_CORPUS.layer),
    head: index(params.get("head"), DEFAULT_CORPUS.head),
    plot: PLOTS.includes(params.get("plot")) ? params.get("plot") : DEFAULT_CORPUS.plot,
    all: params.get("all") === "1",
  };
}

/** The query string of a view; the defaults of plot and all are left out. */
export function encodeCorpusState(state) {
  const params = new URLSearchParams();
  if (state.run) params.set("run", state.run);
  params.set("stat", state.stat);
  params.set("layer", String(state.layer));
  params.set("head", String(state.head));
  if (state.plot !== DEFAULT_CORPUS.plot) params.set("plot", state.plot);
  if (state.all) params.set("all", "1");
  return params.toString();
}

/** The selection inside a run of `layers` x `heads`, and a statistic it measured (else its first). */
export function clampCorpus(state, { layers, heads, stats }) {
  return {
    ...state,
    layer: Math.min(Math.max(0, state.layer), layers - 1),
    head: Math.min(Math.max(0, state.head), heads - 1),
    stat: stats.includes(state.stat) ? state.stat : stats[0],
  };
}

/** L x H corpus means of `stat` from per_head's columns (null where a head has no value). */
export function meanGrid(perHead, stat, layers, heads) {
  const grid = Array.from({ length: layers }, () => Array(heads).fill(null));
  const means = perHead[`${stat}_mean`] ?? [];
  perHead.layer.forEach((layer, i) => {
    const head = perHead.head[i];
    if (layer < layers && head < heads) grid[layer][head] = means[i] ?? null;
  });
  return grid;
}

/** One row of per_head, as {column: value}, for (layer, head); null when the table lacks it. */
export function headRow(perHead, layer, head) {
  const i = perHead.layer.findIndex((l, k) => l === layer && perHead.head[k] === head);
  return i < 0 ? null : Object.fromEntries(Object.entries(perHead).map(([key, column]) => [key, column[i]]));
}

/**
 * A head's summary line: "mean 0.412 · std 0.103 · 5th–95th percentile 0.21–0.60 · 2,000 texts". A detection
 * score counts only the texts that have it (per_head's <score>_count: "1,620 of 2,000 texts").
 */
export function headSummary(row, stat) {
  if (!row) return "";
  const f = (v) => formatStat(stat, v);
  const all = Number(row.count).toLocaleString("en-US");
  const present = row[`${stat}_count`];
  const count = present === undefined ? all : `${Number(present).toLocaleString("en-US")} of ${all}`;
  return `mean ${f(row[`${stat}_mean`])} · std ${f(row[`${stat}_std`])} · median ${f(row[`${stat}_p50`])} · ` +
    `5th–95th percentile ${f(row[`${stat}_p05`])}–${f(row[`${stat}_p95`])} · ${count} texts`;
}

/**
 * A head's roles across the texts, from per_head's label_<label> counts: "previous-token 62% · mixed 30% ·
 * broad 8%", most frequent first, roles no text took left out.
 */
export function roleShares(row) {
  if (!row || !(row.count > 0)) return "";
  const names = Object.fromEntries(Object.keys(ROLES).map((role) => [`label_${role.replace(/-/g, "_")}`, role]));
  return Object.entries(row)
    .filter(([key, count]) => key.startsWith("label_") && count > 0)
    .map(([key, count]) => [names[key] ?? key.slice("label_".length).replace(/_/g, "-"), count])
    .sort((a, b) => b[1] - a[1])
    .map(([role, count]) => `${role} ${Math.round((100 * count) / row.count)}%`)
    .join(" · ");
}

/**
 * The corpus grid's selection after `key` (Ctrl held: `ctrl`), or null for a key it leaves alone: arrows
 * step and stop at the edges, Home/End the row's first/last head (with Ctrl: the first/last cell),
 * PageUp/PageDown the first/last layer. The normal grid's keys (keys.js) without its aggregate columns.
 */
export function corpusKey({ layer, head }, key, ctrl, { layers, heads }) {
  const moves = {
    ArrowLeft: [layer, head - 1],
    ArrowRight: [layer, head + 1],
    ArrowUp: [layer - 1, head],
    ArrowDown: [layer + 1, head],
    Home: ctrl ? [0, 0] : [layer, 0],
    End: ctrl ? [layers - 1, heads - 1] : [layer, heads - 1],
    PageUp: [0, head],
    PageDown: [layers - 1, head],
  };
  if (!Object.hasOwn(moves, key) || (ctrl && key !== "Home" && key !== "End")) return null;
  const [l, h] = moves[key];
  return { layer: Math.min(Math.max(0, l), layers - 1), head: Math.min(Math.max(0, h), heads - 1) };
}

/**
 * The Plotly figure of per-text values: `series` = [{layer, head, values, ids}] (one head, or every head of
 * a layer side by side), as box or violin plots. Values go in unchanged (the test reads them back).
 */
export function distributionFigure(series, { stat, plot = "box" }) {
  const many = series.length > 1;
  const data = series.map(({ layer, head, values, ids, lines }) => {
    const points = values.length <= ALL_POINTS_MAX ? "all" : "outliers";
    const trace = {
      type: plot,
      name: `L${layer} H${head}`,
      y: values,
      text: ids.map((id) => `text ${id}`),
      customdata: lines,
      hovertemplate: `%{text} (line %{customdata}): %{y:.4f}<extra>L${layer} H${head}</extra>`,
      marker: { color: "#08519c", size: 3, opacity: 0.6 },
      line: { color: "#08519c" },
      fillcolor: "rgba(66, 146, 198, 0.25)",
    };
    if (plot === "box") Object.assign(trace, { boxpoints: points, jitter: 0.4, pointpos: 0, boxmean: true });
    else Object.assign(trace, { points, jitter: 0.4, pointpos: 0, box: { visible: true }, meanline: { visible: true } });
    return trace;
  });
  const layout = {
    margin: { l: 64, r: 16, t: 8, b: many ? 40 : 24 },
    height: 320,
    showlegend: false,
    yaxis: { title: { text: statName(stat) }, zeroline: false },
    xaxis: { showticklabels: many, fixedrange: true },
    paper_bgcolor: "rgba(0,0,0,0)",
  };
  return { data, layout };
}

/**
 * The text under a hovered or clicked point of `distributionFigure(series)` (a Plotly event's point):
 * {layer, head, line, id, value}, or null where the pointer is on a box or a violin rather than a point.
 */
export function pointText(series, point) {
  const i = point?.pointNumber;
  const s = series[point?.curveNumber];
  if (!s || point.hoverOnBox || !Number.isInteger(i) || !Number.isInteger(s.lines?.[i])) return null;
  if (point.y !== undefined && point.y !== s.values[i]) return null; // a box's or violin's own statistic
  return { layer: s.layer, head: s.head, line: s.lines[i], id: s.ids[i], value: s.values[i] };
}

/** What the points under the plot do: every text a point, or only the outliers, and what a click does. */
export function pointsHint(series, reason) {
  const count = series.reduce((n, s) => n + s.values.length, 0);
  const drawn = series.every((s) => s.values.length <= ALL_POINTS_MAX)
    ? "Each point is a text"
    : `Points are the outliers of ${count.toLocaleString("en-US")} texts (every text is drawn up to ` +
      `${ALL_POINTS_MAX.toLocaleString("en-US")} a head)`;
  return `${drawn}: hover one to read it${reason ? "." : ", click it to open it in the normal view with its head."}`;
}

/** A hovered point's line: "text t7 (line 7) · L2 H3 · 0.412 · “the cat sat on…”". */
export function pointLine(found, stat, record) {
  const head = `text ${found.id} (line ${found.line}) · L${found.layer} H${found.head} · ${formatStat(stat, found.value)}`;
  if (!record) return head;
  const words = record.text_pair ? `${record.text} ‖ ${record.text_pair}` : record.text;
  const cut = words.length > SNIPPET_CHARS ? `${words.slice(0, SNIPPET_CHARS - 1).trimEnd()}…` : words;
  return `${head} · “${cut}”`;
}

/**
 * An example's words in the list: its snippet (and its pair's, after "‖"), with "…" where the run's
 * examples file cut them short (`cut`; the whole text comes by its line from the texts route).
 */
export function exampleWords(example) {
  const words = example.snippet_pair ? `${example.snippet} ‖ ${example.snippet_pair}` : example.snippet;
  return example.cut ? `${words}…` : words;
}

/**
 * The normal view of one example's text with (layer, head) open: the page's own URL state (state.js), with
 * words mode when the run took words, its weighting (weight × value norm for a --weighting norm run) and
 * the encoder's attention for an encoder-decoder's run.
 */
export function textLink(run, example, layer, head) {
  const state = {
    ...DEFAULT_STATE,
    text: example.text,
    pair: example.text_pair ?? "",
    model: run.model,
    layer,
    head,
    words: run.words,
    weighting: run.weighting === "norm" ? "norm" : DEFAULT_STATE.weighting,
    kind: run.kind === "encoder" ? "encoder" : DEFAULT_STATE.kind,
  };
  return `./?${encodeState(state)}`; // the normal view lies beside /corpus
}

/** Why an example cannot be opened here, or "" when it can. */
export function linkReason(run) {
  if (run.served) return "";
  return `The run's model “${run.model}” is not served here, so its texts cannot be opened in the normal ` +
    `view: register it (HEADSCOPE_MODELS or HEADSCOPE_MODELS_DIR) and restart the server.`;
}

/** The run menu's line: "minilm-wiki · all-MiniLM-L6-v2 · 2,000 texts". */
export function runLabel(run) {
  const texts = Number(run.counts?.texts ?? 0).toLocaleString("en-US");
  return `${run.name} · ${run.model} · ${texts} texts${run.served ? "" : " (model not served here)"}`;
}
