// The head detail for long inputs: one head of a trace (POST /api/trace) as a Plotly heatmap that never
// holds more than ~512 x 512 cells. The first view is the whole head pooled to the plot's size in CSS
// pixels; a zoom or pan asks POST /api/trace/window for the visible tokens at that resolution and redraws,
// keeping the zoom, down to one cell a token, where the hover gives the exact weights again.
// Figures are built by long-figure.js; this module owns the fetches: one window at a time (a new one aborts
// the last), and an answer that is no longer the latest never draws.

import { postJson } from "./api.js";
import { selectionLabel } from "./labels.js";
import { MARGIN, MAX_CELLS, badgeText, buildLongFigure, describeWindow, visibleSpan } from "./long-figure.js";
import { traceBody } from "./trace-api.js";

const SETTLE_MS = 150; // a zoom or pan fetches once the view has been still this long
const MIN_PLOT_PX = 240;
const MAX_PLOT_PX = 640;
const REDUCES = Object.freeze({ max: "max (a lone spike stays visible)", mean: "mean (keeps the mass)" });

/** POST /api/trace/window: one head's weights over rows x cols of a traced input (TraceWindowResponse). */
export function fetchTraceWindow(query, request, { signal } = {}) {
  // The trace routes' body (the input alone): a run's words or continuation asked for are not theirs.
  return postJson("/api/trace/window", { ...traceBody(query), ...request }, signal);
}

/** Which input a view shows: another head of the same one keeps the zoom. */
function inputKey({ query, trace }) {
  return JSON.stringify([query.text, query.pair || null, trace.model, Boolean(query.chat), trace.n]);
}

/** An AbortController that also aborts when `outer` (the caller's signal) does, and its release. */
function linkedController(outer) {
  const controller = new AbortController();
  const abort = () => controller.abort();
  if (outer?.aborted) controller.abort();
  else outer?.addEventListener("abort", abort, { once: true });
  return { controller, release: () => outer?.removeEventListener("abort", abort) };
}

export class LongDetail {
  /** `gd`: the element Plotly draws in; `readout`: a live region (aria-live) told what each draw shows. */
  constructor(gd, { readout }) {
    this.gd = gd;
    this.readout = readout;
    this.view = null; // {query, trace, layer, head, signal} of the head asked for
    this.shown = null; // the view drawn last (its figure is on screen)
    this.reduce = "max";
    this.size = 0; // the plot's side in px, fixed per head so the cells never jump
    this.seq = 0; // numbers each window fetch: only the latest may draw
    this.controller = null;
    this.timer = null;
    this.bound = false; // Plotly listeners on gd (Plotly.purge drops them)
    this.bar = this.buildBar();
    gd.before(this.bar);
  }

  /** The badge ("pooled ×8 × 8 (max)" or exact) and the pooling switch, above the plot. */
  buildBar() {
    const bar = document.createElement("div");
    bar.className = "long-detail-bar caption";
    bar.hidden = true;
    this.badge = document.createElement("span");
    this.badge.className = "long-detail-badge";
    const label = document.createElement("label");
    label.className = "long-detail-reduce";
    label.append("Pooling ");
    this.reduceMenu = document.createElement("select");
    for (const [value, text] of Object.entries(REDUCES)) this.reduceMenu.append(new Option(text, value));
    this.reduceMenu.addEventListener("change", () => this.setReduce(this.reduceMenu.value));
    label.append(this.reduceMenu);
    const hint = document.createElement("span");
    hint.className = "hint";
    hint.textContent = "Drag to zoom in to exact cells; double-click for the whole head.";
    bar.append(this.badge, " · ", label, " ", hint);
    return bar;
  }

  /**
   * Show one head of a traced input, whole, pooled to the plot's size; another head of the input shown
   * keeps the zoom (heads compare region by region, as in the normal detail). `query` is the trace's
   * content key {text, pair, model, chat}; `trace` /api/trace's "done" event; `signal` aborts every fetch
   * of this head. Resolves true once drawn, false when nothing was (aborted, superseded, or failed: the
   * error is in the badge and the readout).
   */
  show({ query, trace, layer, head, signal = null }) {
    const view = { query, trace, layer, head, signal };
    const zoomed = this.shown && this.gd.data && inputKey(this.shown) === inputKey(view);
    const [rows, cols] = zoomed ? this.visible() : [null, null];
    const whole = rows?.[0] === 0 && rows[1] === trace.n && cols[0] === 0 && cols[1] === trace.n;
    this.stop();
    this.view = view;
    if (!zoomed) {
      const room = this.gd.parentElement?.clientWidth || 900;
      this.size = Math.round(Math.min(MAX_PLOT_PX, Math.max(MIN_PLOT_PX, room - MARGIN.l - MARGIN.r)));
    }
    this.bar.hidden = false;
    this.badge.textContent = "loading…";
    return whole ? this.load(null, null) : this.load(rows, cols);
  }

  /** Take the figure away and forget the head (a new run, or a short input). */
  clear() {
    this.stop();
    this.view = null;
    this.purge();
    this.bar.hidden = true;
    this.badge.textContent = "";
    this.readout.textContent = "";
  }

  purge() {
    this.shown = null;
    if (this.gd.data) window.Plotly.purge(this.gd);
    this.bound = false; // purge dropped the Plotly listeners
    this.gd.replaceChildren();
    delete this.gd.dataset.cols;
    delete this.gd.dataset.rows;
    delete this.gd.dataset.state;
  }

  /** Pooling by "max" or "mean": the view shown is fetched again. */
  setReduce(reduce) {
    if (!Object.hasOwn(REDUCES, reduce)) return Promise.resolve(false);
    this.reduce = reduce;
    this.reduceMenu.value = reduce;
    return this.view && this.gd.data ? this.load(...this.visible()) : Promise.resolve(false);
  }

  stop() {
    clearTimeout(this.timer);
    this.controller?.abort();
    this.controller = null;
    this.seq++; // whatever is still on its way is stale now
  }

  /** The visible token spans [lo, hi) of rows and cols, from the figure's current axis ranges. */
  visible() {
    const n = (this.view ?? this.shown).trace.n;
    return [visibleSpan(this.gd.layout.yaxis.range, n), visibleSpan(this.gd.layout.xaxis.range, n)];
  }

  /** Fetch rows x cols (null: all) at the plot's resolution and draw it; true when it drew. */
  async load(rows, cols) {
    clearTimeout(this.timer);
    this.controller?.abort();
    const view = this.view;
    const { controller, release } = linkedController(view.signal);
    this.controller = controller;
    const seq = ++this.seq;
    const request = { layer: view.layer, head: view.head, rows, cols, reduce: this.reduce };
    request.max_cells = Math.min(MAX_CELLS, this.size);
    this.gd.setAttribute("aria-busy", "true");
    this.gd.dataset.state = "loading"; // "ready" once this window is drawn, "error" if it failed (tests wait on it)
    try {
      const win = await fetchTraceWindow(view.query, request, { signal: controller.signal });
      if (seq !== this.seq) return false; // a newer window was asked for meanwhile
      await this.draw(win, rows === null && cols === null);
      return true;
    } catch (error) {
      if (error.name === "AbortError" || seq !== this.seq) return false;
      // A head that cannot be shown leaves no other head's figure behind to be read as its own.
      if (this.shown !== view) this.purge();
      this.badge.textContent = error.message;
      this.readout.textContent = `The window could not be loaded: ${error.message}`;
      this.gd.dataset.state = "error";
      return false;
    } finally {
      release();
      if (seq === this.seq) this.gd.removeAttribute("aria-busy");
    }
  }

  async draw(win, whole) {
    const { trace, layer, head } = this.view;
    const where = selectionLabel(layer, head, { heads: trace.heads, kvHeads: trace.kv_heads });
    // The view a person has now (they may have zoomed on while this window was on its way).
    const range = whole || !this.gd.data ? null : { x: [...this.gd.layout.xaxis.range], y: [...this.gd.layout.yaxis.range] };
    const title = `${where} · ${trace.n.toLocaleString("en-US")} tokens`;
    const spec = { tokens: trace.tokens, byteLevel: trace.byte_level, causal: trace.causal, size: this.size, title, range };
    const { data, layout } = buildLongFigure(win, spec);
    const config = {
      displaylogo: false,
      showSendToCloud: false, // no upload to Plotly Cloud (heatmap.js)
      showTips: false,
      displayModeBar: "hover",
      responsive: false,
      scrollZoom: false,
      doubleClick: false, // our own reset: the whole head, fetched again (Plotly's would zoom out the window)
      modeBarButtonsToRemove: ["select2d", "lasso2d", "autoScale2d", "resetScale2d"],
      toImageButtonOptions: { filename: `headscope-long-L${layer}-H${head}` },
    };
    await window.Plotly.react(this.gd, data, layout, config);
    this.shown = this.view;
    this.bind();
    const { gd } = this;
    gd.dataset.rows = `${win.row_edges[0]},${win.row_edges[win.row_edges.length - 1]}`;
    gd.dataset.cols = `${win.col_edges[0]},${win.col_edges[win.col_edges.length - 1]}`;
    gd.dataset.exact = String(win.exact);
    gd.dataset.reduce = win.reduce;
    gd.dataset.state = "ready";
    this.badge.textContent = badgeText(win);
    this.readout.textContent = describeWindow(win, where);
  }

  bind() {
    if (this.bound) return;
    this.bound = true;
    this.gd.on("plotly_relayout", (event) => {
      const keys = Object.keys(event ?? {});
      if (!this.view || !keys.some((k) => /^[xy]axis\.(range|autorange)/.test(k))) return;
      this.stop(); // an answer on its way was for the view before: drawn now, it would undo this zoom
      this.timer = setTimeout(() => this.load(...this.visible()), SETTLE_MS);
    });
    this.gd.on("plotly_doubleclick", () => this.reset());
  }

  /** Back to the whole head (a double click): the full ranges, fetched again. */
  reset() {
    if (!this.view) return Promise.resolve(false);
    const n = this.view.trace.n;
    return window.Plotly.relayout(this.gd, { "xaxis.range": [0, n], "yaxis.range": [n, 0] });
  }
}
