// Head detail: the selected head (or aggregate) of a run as a heatmap or token lines, first from the quantized
// grid data, then, for a head a person settles on, from its exact float32 values (fetched by itself up to
// AUTO_EXACT_MAX_N tokens, on request above it).

import { $, $all } from "./dom.js";
import { fetchHead } from "./api.js";
import { carried } from "./carried.js";
import { AGGREGATES, isAggregate } from "./aggregates.js";
import { CellCursor } from "./cursor.js";
import { displayToken, markWritten, withoutFirstToken } from "./decoder.js";
import { renderHeatmap } from "./heatmap.js";
import { DEFAULT_SCALE, SCALES } from "./scale.js";
import { tabKey } from "./keys.js";
import { exportName, selectionLabel } from "./labels.js";
import { LinesView } from "./lines-view.js";
import { KIND_LABELS, axesOf, axisNames, fileModel, isRectangular, isSeq2seq, shapeOf } from "./seq2seq.js";
import { showExportAvailability } from "./notices.js";
import { getState } from "./state.js";
import { NORM_NOTE, cellSizes, weightingOf } from "./weighting.js";

const EXACT_DELAY_MS = 350; // wait for arrow-key bursts to settle before asking for exact values
// The exact head is binary float32, ~3.3 bytes a value after gzip: fetched by itself up to this n (~220 KB),
// on request above it (~0.85 MB at 512 tokens, for every head a person settles on).
export const AUTO_EXACT_MAX_N = 256;

/** Mark the tab of `view` selected: the one tab stop of the tab list (roving tabindex). */
export function showTabs(view) {
  for (const tab of $all("tabs")) {
    const selected = tab.dataset.view === view;
    tab.setAttribute("aria-selected", String(selected));
    tab.tabIndex = selected ? 0 : -1;
  }
}

/** Tabs pattern: a click, or Left/Right/Home/End on the focused tab, calls `onChoose(view)` (which redraws). */
export function bindTabs(onChoose) {
  const tabs = $all("tabs");
  tabs.forEach((tab, index) => {
    tab.addEventListener("click", () => onChoose(tab.dataset.view));
    tab.addEventListener("keydown", (event) => {
      const next = event.altKey || event.ctrlKey || event.metaKey ? null : tabKey(index, event.key, tabs.length);
      if (next === null) return;
      event.preventDefault();
      tabs[next].focus();
      onChoose(tabs[next].dataset.view); // automatic activation: a view switch is quick
    });
  });
}

/**
 * rows*cols values of (layer, head) in `run`'s attention on screen: the head's own answer when it arrived
 * (`settled`: exact, with its rows' norm totals under weight × value norm; or, in a snapshot that does not
 * carry it exactly, the grid's values and a `note` saying so), else the quantized grid data. The caller
 * renormalises without the first token when the state asks for it.
 */
function detailValues(run, layer, head) {
  const { attention } = run;
  const grid = { exact: false, rowNorms: null, settled: false, note: "" };
  if (isAggregate(head)) return { ...grid, values: AGGREGATES[head].compute(attention, layer) };
  const fetched = run.exact.get(`${layer}:${head}`);
  if (fetched) return { ...grid, ...fetched, settled: true };
  return { ...grid, values: attention.headInto(layer, head) };
}

/**
 * What the detail shows, in words: the selection, the attention of an encoder-decoder run, and whether words
 * mode or weight × value norm changes what every row and column is. `shown`: the selection and view state
 * with what draw() found (exact, norm, seq2seq, ...).
 */
function detailLabel(run, { layer, head, view, lines, norm, seq2seq }) {
  const { attention } = run;
  const overlay = view === "tokens" && lines === "layer"; // token lines of every head of the layer
  return `${seq2seq ? `${KIND_LABELS[attention.kind] ?? attention.kind}, ` : ""}${
    overlay ? `layer ${layer}, all heads` : selectionLabel(layer, head, attention)
  }${run.query.words ? " · words" : ""}${norm ? " · weight × norm" : ""}`;
}

/** The caption's notes: the values' precision, what the marks and colours mean, how to read the view. */
function captionNotes(attention, { head, view, lines, hideFirst, scale, exact, settled, note, norm, sizes, written, automatic }) {
  const coming = isAggregate(head) || !automatic ? "" : "; exact values on the way";
  const notes = [
    exact
      ? "Exact float32 values."
      : `${attention.bits}-bit values (within ±${attention.maxAbsError.toFixed(4)})${settled ? (note && `: ${note}`) : coming}.`,
  ];
  // The selected head's precision: the lines note says that of every head.
  if (view === "tokens" && lines === "layer") notes.shift();
  if (norm) {
    notes.push(NORM_NOTE);
    if (view === "heatmap" && !isAggregate(head)) {
      let size = "Each cell's size ‖α f‖ comes with the exact values.";
      if (sizes) size = "The hover adds each cell's size ‖α f‖ (share × its row's total).";
      else if (exact) size = "Sizes ‖α f‖ are given per token, not per word."; // words: no row_norms
      notes.push(size);
    }
  }
  if (attention.causal) notes.push("Hatched cells are masked: a causal model cannot look ahead.");
  if (hideFirst) notes.push("First token hidden (grey): each row renormalised over the rest.");
  if (scale !== DEFAULT_SCALE && view === "heatmap") {
    notes.push(`Colour scale: ${SCALES[scale].label}; the hover shows the true ${norm ? "share" : "weight"}.`);
    // Quantized values stop a decade or two above the log floor: say where, and what shows the rest.
    if (scale === "log" && !exact) {
      const under = attention.maxAbsError.toFixed(4);
      notes.push(`${attention.bits}-bit weights under ${under} read as 0, drawn at the floor; exact values show the lower decades.`);
    }
  }
  if (written > 0) {
    notes.push(`✎ marks the ${written} token(s) the model wrote (orange bands); click one's row to see what it looked at.`);
  }
  if (attention.kind === "cross") notes.push("Rows: the target's tokens; columns: the source's.");
  notes.push(
    view === "heatmap"
      ? "Drag to zoom, double-click to reset."
      : "Hover or tap a token to isolate its lines (Escape or a second tap clears); " +
        "hover or tap a line for its value.",
  );
  return notes;
}

/** What heatmap.js and tokens.js draw of the selection: its tokens, values, marks, title and export name. */
function figureSpec(run, { layer, head, scale, hideFirst, values, exact, weighting, sizes, seq2seq, written, label }) {
  const { attention } = run;
  const modelName = attention.model ?? run.query.model ?? "";
  const axes = axesOf(attention);
  return {
    tokens: markWritten(axes.queryTokens, written),
    ...(isRectangular(attention) ? { keyTokens: axes.keyTokens, keySpecial: axes.keySpecial } : {}),
    ...(seq2seq ? { axisNames: axisNames(attention.kind) } : {}),
    values,
    causal: attention.causal,
    boundary: seq2seq ? -1 : attention.boundary,
    segments: attention.segments,
    special: axes.querySpecial,
    exact,
    bits: attention.bits,
    title: `${modelName} · ${label}`,
    written,
    byteLevel: attention.byteLevel,
    renormalised: hideFirst,
    colorScale: scale, // scale.js: the colours only; the hover reads `values`
    weighting,
    sizes,
    filename: exportName(fileModel(attention), layer, head, { weighting }),
  };
}

export class Detail {
  /** `written`: the WrittenView that follows the selected head (written.js). */
  constructor({ written }) {
    this.written = written;
    this.run = null; // the run last drawn
    this.timer = 0;
    this.controller = null; // the exact head in flight; a newer selection aborts it
    this.lines = new LinesView();
    this.cursor = new CellCursor($("headDetail"), $("cellReadout"));
    $("exact").addEventListener("click", () => {
      if (!this.run) return;
      const { layer, head } = getState();
      $("exact").hidden = true;
      $("detailCaption").textContent = "Loading exact values…";
      this.scheduleExact(this.run, layer, head, 0);
    });
  }

  /**
   * The heatmap, and where it goes: a new run whose figure is wider than its place beside the grid (every
   * label of up to 64 tokens at a legible size) puts the detail under the grid at full width, rather than
   * leave its colour bar a sideways scroll away; the next new run starts beside the grid again.
   */
  async renderFitting(spec, { newRun }) {
    const gd = $("headDetail");
    const workspace = $("workspace");
    if (newRun) workspace.classList.remove("stacked");
    await renderHeatmap(gd, spec);
    const overflows = gd._fullLayout.width > gd.parentElement.clientWidth + 1;
    if (newRun && overflows && getComputedStyle(workspace).gridTemplateColumns.split(" ").length > 1) {
      workspace.classList.add("stacked");
      await renderHeatmap(gd, spec);
    }
  }

  /** Draw the state's selection of `run`; `keepZoom` false for a new run, which starts unzoomed. */
  async draw(run, { keepZoom = true } = {}) {
    this.run = run;
    const { attention } = run;
    const { layer, head, view, lines, scale, hideFirst } = getState();
    const { values: drawn, exact, rowNorms, settled, note } = detailValues(run, layer, head);
    const { rows, cols } = shapeOf(attention);
    const values = hideFirst ? withoutFirstToken(drawn, rows, cols) : drawn;
    // Weight × value norm: the shares, and once the exact head came each cell's size (of the shares as the
    // model gave them: hiding the first token renormalises the share, not what the head moves).
    const weighting = weightingOf(attention);
    const norm = weighting === "norm";
    const sizes = norm ? cellSizes(drawn, rowNorms, rows, cols) : null;
    // An encoder-decoder run: which attention, and no "written" marks (its target is its own sentence).
    const seq2seq = isSeq2seq(run.full);
    const written = seq2seq ? 0 : attention.generated;
    // A head of up to AUTO_EXACT_MAX_N² values comes by itself (a rectangle counts its cells, as the bytes do);
    // so does any head of a snapshot: its exact values are in the file, or its 8-bit ones all there is.
    const automatic = rows * cols <= AUTO_EXACT_MAX_N ** 2 || carried() !== null;
    const shown = { layer, head, view, lines, scale, hideFirst, exact, settled, note, norm, sizes, seq2seq, written, automatic };
    const label = detailLabel(run, shown);
    $("detailTitle").textContent = `Head detail: ${label}`;
    $("detailCaption").textContent = captionNotes(attention, shown).join(" ");

    const heatmapVisible = view === "heatmap";
    $("detailScroll").hidden = !heatmapVisible;
    $("tokenView").hidden = heatmapVisible;
    showTabs(view);
    showExportAvailability(view);

    const spec = {
      ...figureSpec(run, { ...shown, values, weighting, label }),
      onRow: (i) => this.written.choose(i),
      keepZoom, // a new run starts unzoomed; another head of the same run keeps the zoomed region
    };
    if (heatmapVisible) {
      await this.renderFitting(spec, { newRun: !keepZoom });
      const spell = (list) => list?.map((token) => displayToken(token, attention.byteLevel));
      const [tokens, keyTokens] = [spell(spec.tokens), spell(spec.keyTokens) ?? undefined];
      const read = { values, norm, sizes, causal: attention.causal, renormalised: hideFirst, onRow: spec.onRow };
      this.cursor.follow({ tokens, keyTokens, ...read });
    } else {
      this.cursor.hide();
      this.lines.draw(run, spec);
    }
    if (written > 0) this.written.show(run, values, { head: label, renormalised: hideFirst });
    else this.written.clear();
    const wantsExact = !settled && !isAggregate(head);
    $("exact").hidden = !(wantsExact && !automatic);
    if (wantsExact && automatic) this.scheduleExact(run, layer, head);
    else if (!wantsExact) this.cancelExact();
  }

  cancelExact() {
    clearTimeout(this.timer);
    this.controller?.abort();
    this.controller = null;
  }

  // Full precision for the head a person settled on (POST /api/attention/head/compact, binary float32), then
  // redraw. A newer selection cancels the wait and the fetch; a new run aborts the fetch with its own.
  scheduleExact(run, layer, head, delay = EXACT_DELAY_MS) {
    this.cancelExact();
    const controller = new AbortController();
    this.controller = controller;
    const signal = AbortSignal.any([run.signal, controller.signal]);
    this.timer = setTimeout(async () => {
      try {
        const exact = await fetchHead(run.query, layer, head, { signal });
        if (run.signal.aborted) return; // arrived for a newer selection: kept, in case it comes back
        // Weight × value norm: the header's row_norms, each query row's total (a cell's size = share × it).
        // A snapshot's head it does not carry exactly comes as its grid's values: `exact` false, and why.
        const { exact: isExact = true, note = "" } = exact;
        const rowNorms = exact.header.row_norms ?? null;
        run.exact.set(`${layer}:${head}`, { values: exact.headInto(0, 0), rowNorms, exact: isExact, note });
        const state = getState();
        if (state.layer === layer && state.head === head) await this.draw(run);
      } catch (error) {
        if (signal.aborted) return;
        // The quantized view stays usable; say why exact values are missing.
        $("detailCaption").textContent += ` Exact values unavailable: ${error.message}`;
      }
    }, delay);
  }
}
