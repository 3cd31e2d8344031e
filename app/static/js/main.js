// Boots the page and runs it: form -> API -> decoded attention -> grid + detail, then the insight views.
// document.body.dataset.state goes "loading" -> "ready" (every thumbnail and the detail drawn) or
// "error"; tests and benchmarks/browser.py wait on it. After "ready" the insight views (statistics,
// compare) load into #analysis (insight-panel.js); the rollout loads when its panel comes on screen.
//
// The view state changes only through state.js update(); a run is {query, queryB, full, attention, signal,
// exact, analysis, comparison}, and a new run aborts the old one's signal: its fetches stop and nothing of it
// draws. `full` is the decoded answer; `attention` the part on screen: all of it, or for an encoder-decoder
// model the section of the state's `kind` (a kind switch makes a new view of the same answer, no new forward).
// An input longer than the model's max_tokens that it can trace is a long run (long-mode.js): {query, trace,
// attention (the pooled overview), signal, long: true}; Cancel aborts it while it traces.

import { $ } from "./dom.js";
import { isAggregate } from "./aggregates.js";
import { ApiError, fetchCompact, fetchModels } from "./api.js";
import { carriedState } from "./carried.js";
import { queryB } from "./compare.js";
import { bindTabs, Detail, showTabs } from "./detail.js";
import { firstExample, renderExamples } from "./examples.js";
import { exportAs } from "./export.js";
import { currentB, currentQuery, fillModels, initForm, learnEntries, learnModel, readInitialState, setBusy, showError } from "./form.js";
import { Grid } from "./grid.js";
import { InsightPanel } from "./insight-panel.js";
import { bindKindSwitch, showKindSwitch } from "./kind-switch.js";
import { runSummary } from "./labels.js";
import { LongMode, longSummary, measure, unavailable } from "./long-mode.js";
import { copyLink, showNotice, tokenLimit, truncationNotice } from "./notices.js";
import { loadPlotly } from "./plotly-ready.js";
import { probeQuery, showProbeInput } from "./probe-input.js";
import { initScaleMenu } from "./scale-menu.js";
import { enterSnapshot, inSnapshot } from "./snapshot-page.js";
import { isSeq2seq, sectionOf, seq2seqSummary, seq2seqTruncation } from "./seq2seq.js";
import { clampSelection, getState, ignoredParams, initState, moveSelection, readState, subscribe, update } from "./state.js";
import { Notices, ignoredNotice, markStale, modelBNotice, modelNotice, refreshModelB, selectionNotice } from "./truth.js";
import { bindScrollCue, reveal } from "./viewport.js";
import { weightingOf } from "./weighting.js";
import { WrittenView } from "./written.js";
import { watched } from "./work-progress.js";

// A first visit (no text in the URL) starts from an example, run like any other: the URL then holds it.
// A snapshot file opens on the run it carries, and writes no URL (a sandboxed srcdoc has none to write).
const carriedRun = carriedState();
initState(carriedRun ?? { ...readState(), ...firstExample(window.location.search) }, carriedRun ? { write: () => {} } : undefined);

let current = null; // the run on screen (its attention decoded), or null before the first
let controller = null; // aborts the latest run
let viewController = null; // aborts the latest view of it (another kind of attention replaces it)
let known = { models: new Map(), defaultModel: "" };
const notices = new Notices($("stateNotice")); // what a link asked for that the page shows otherwise
let ranOnce = false; // the first run is the link's: its notices stay until the next run

// A tap on a thumbnail also brings the detail into view when it lies off screen (a phone: it is below).
const grid = new Grid($("grid"), {
  onSelect: (layer, head) => {
    select(layer, head);
    reveal($("detailPanel"));
  },
  onOpen: (layer, head) => openHead(layer, head),
});
const written = new WrittenView({
  panel: $("written"),
  list: $("writtenTokens"),
  caption: $("writtenCaption"),
  prompt: $("writtenPrompt"),
  top: $("writtenTop"),
});
const detail = new Detail({ written });
const insights = new InsightPanel({
  grid,
  current: () => current,
  onOpen: (layer, head) => openHead(layer, head),
  onOpenProbed: (layer, head, model) => openProbed(layer, head, model),
});
const longMode = new LongMode({ grid, onCancel: cancel });

subscribe((state, changed) => {
  $("hideFirst").checked = state.hideFirst;
  if (changed.has("kind") && current && isSeq2seq(current.full)) {
    showKindSwitch(true, state.kind);
    show(viewOf(current, state.kind));
    return;
  }
  if (!["view", "hideFirst", "lines", "pairs", "scale"].some((key) => changed.has(key))) return;
  if (current && !current.long) detail.draw(current);
  else if (!current) showTabs(state.view);
});

/**
 * Run the form's text, or with `input` "probe" the head probe's first sequence for the state's seed (its
 * query carries `probe`; the form keeps the text). The form's Run and the examples run the text.
 */
async function run({ input = getState().input } = {}) {
  const typed = currentQuery();
  const query = input === "probe" ? probeQuery(typed, getState()) : typed;
  if (!query.probe && !query.text.trim()) {
    showError("Type a sentence first: there is nothing to look at yet.");
    $("text").focus();
    return;
  }
  showProbeInput(query, () => run({ input: "" }));
  if (ranOnce) notices.clear();
  ranOnce = true;
  controller?.abort(); // the old run's fetches, thumbnails, exact head and insight views stop here
  detail.cancelExact();
  controller = new AbortController();
  const { signal } = controller;
  showError("");
  showNotice(""); // the notices speak of the run on screen: the next one brings its own
  setBusy("Running the model…");
  document.body.dataset.state = "loading";
  document.body.dataset.insight = "idle"; // the insight views follow this run once it is drawn
  performance.mark("headscope-run");
  try {
    const { limits = {} } = readInitialState();
    const limit = tokenLimit(known.models.get(query.model), limits) ?? limits.max_tokens;
    // A slow answer shows its model's load, then its layers and Cancel, while it is awaited; so does a long
    // input's token count, which waits for the model's load.
    const loaded = known.models.get(query.model || known.defaultModel)?.loaded;
    // The probe's input fits the model by its bound (2·length + 1 tokens): never a long run.
    let long = query.probe ? null : await watched(query, loaded, () => measure(query, { limit, signal }));
    const full = long ? null : await watched(query, loaded, () => fetchCompact(query, { signal }));
    if (signal.aborted) return;
    // Template tokens took it over the limit (an encoder-decoder's cut is flagged, never traced).
    if (full?.truncated && !isSeq2seq(full)) long = await measure(query, { truncated: true, signal });
    if (signal.aborted) return;
    if (long) return await runLong(query, long, signal);
    longMode.leave();
    await learn(full);
    if (signal.aborted) return;
    const { compare, btext, bmodel } = query.probe ? { compare: false, btext: "", bmodel: "" } : currentB();
    const seq2seq = isSeq2seq(full);
    const { kind } = getState();
    // The head and insight routes read the kind; the target goes with every request of the run.
    const asked = seq2seq ? { ...query, kind } : query;
    const b = compare ? queryB(asked, { btext, bmodel }) : null;
    const attention = sectionOf(full, kind);
    const run = { query: asked, queryB: b, full, attention, signal, exact: new Map(), analysis: null, comparison: null };
    const cut = tokenLimit(known.models.get(full.model), limits);
    showNotice(seq2seq ? seq2seqTruncation(full) : truncationNotice(full, { words: query.words, limit: cut }));
    markStale(null); // the old result goes now
    // The URL keeps the typed text and its options: "Back to your text" (and a reload's form) has them.
    record(query.probe ? { ...typed, input: "probe" } : typed, attention, clampSelection(getState(), attention), currentB());
    showKindSwitch(seq2seq, kind);
    await show(viewOf(run, kind), { newRun: true });
  } catch (error) {
    if (signal.aborted) return;
    setBusy("");
    document.body.dataset.state = "error";
    // The last good result stays, marked; it is an older run's when its signal was aborted by this run's start.
    if (current?.signal.aborted) markStale(current.query);
    showError(error instanceof ApiError ? error.message : `Something went wrong in the page: ${error.message}`);
    if (!(error instanceof ApiError)) console.error(error);
  }
}

/** A model loaded by this run: its /api/models entry now says what the answer does not (chat template). */
async function learn(attention) {
  const unloaded = known.models.get(attention.model)?.layers == null;
  const entries = unloaded ? (await fetchModels().catch(() => ({ models: [] }))).models : [];
  learnModel(attention, entries);
  refreshB();
}

/** The run's input and selection into the view state (and so the URL); a clamped selection is said. */
function record(query, attention, shown, { compare, btext, bmodel }) {
  notices.set("selection", selectionNotice(getState(), shown, attention));
  update({
    text: query.text,
    pair: query.pair,
    model: query.model,
    words: query.words,
    weighting: query.weighting,
    newTokens: query.newTokens,
    chat: query.chat,
    target: query.target ?? "",
    input: query.input ?? "",
    compare,
    btext: compare ? btext : "",
    bmodel: compare && bmodel !== query.model ? bmodel : "",
    ...shown,
  });
}

/**
 * The view of `run` for `kind`: `run` itself for a model without kinds; else the section of that kind, with
 * its own signal (a later switch aborts its fetches, a new run all of them) and exact values.
 */
function viewOf(run, kind) {
  if (!isSeq2seq(run.full)) return run;
  viewController?.abort();
  viewController = new AbortController();
  const signal = AbortSignal.any([controller.signal, viewController.signal]);
  const query = { ...run.query, kind };
  const queryB = run.queryB ? { ...run.queryB, kind } : null;
  return { ...run, query, queryB, attention: sectionOf(run.full, kind), signal, exact: new Map(), analysis: null, comparison: null };
}

/** Draw `run`'s view: the grid, the detail, the status, then the insight views (`newRun`: a fresh answer). */
async function show(run, { newRun = false } = {}) {
  const { attention, signal } = run;
  current = run;
  if (!newRun) {
    detail.cancelExact();
    update(clampSelection(getState(), attention)); // another kind may have fewer layers
    document.body.dataset.state = "loading";
    document.body.dataset.insight = "idle";
  }
  setBusy("Drawing…");
  performance.mark("headscope-decoded");
  $("gridWeighting").hidden = weightingOf(attention) !== "norm"; // the answer's, not the switch's
  // Marks for benchmarks/browser.py: where the time between click and "ready" goes.
  // A snapshot's plotly.js runs once the grid is drawn and painted (plotly-ready.js): the detail waits for it.
  const gridDone = grid.render(attention, { signal }).then((done) => (performance.mark("headscope-grid"), done));
  gridDone.finally(loadPlotly).catch(() => {}); // its failure is show()'s, below
  const { layer, head } = getState();
  grid.select(layer, head);
  const detailDone = detail.draw(run, { keepZoom: false }).then(() => performance.mark("headscope-detail"));
  const [complete] = await Promise.all([gridDone, detailDone]);
  if (signal.aborted || !complete) return;
  setBusy("");
  $("status").textContent = isSeq2seq(run.full) ? seq2seqSummary(run.full) : runSummary(attention, run.query.newTokens);
  performance.mark("headscope-ready");
  document.body.dataset.state = "ready";
  insights.load(run).then(() => (run.queryB ? learnSizes(signal) : null));
}

/** A long input (`count`: /api/trace/tokens): trace it with progress, then the overview, detail and text. */
async function runLong(query, count, signal) {
  setBusy("Tracing the model…");
  const run = await longMode.trace(query, { signal });
  if (signal.aborted) return;
  const { trace, attention } = run;
  await learn(attention);
  if (signal.aborted) return;
  current = run;
  $("gridWeighting").hidden = true; // the trace reads the weights
  // What was asked for and cannot be done here is said, not silently dropped.
  const asked = [
    query.words && "Words mode",
    query.weighting === "norm" && "Weight × value norm",
    currentB().compare && "Compare",
    query.newTokens > 0 && "Continuing",
  ];
  const left = asked.filter(Boolean).map((name, i) => (i ? name.toLowerCase() : name));
  const what = left.length > 1 ? `${left.slice(0, -1).join(", ")} and ${left.at(-1)}` : left[0];
  const note = left.length ? ` ${unavailable(what, count.max_tokens, left.length > 1 ? "need" : "needs")}` : "";
  showNotice(
    `${trace.n.toLocaleString("en-US")} tokens: above the ${count.max_tokens} for which every head is shown in ` +
      `full, so the model was traced: the grid and the heatmap pool blocks of tokens, and the text view gives ` +
      `one token's exact weights.${note}`,
  );
  markStale(null);
  record(query, attention, clampSelection(LongMode.selection(getState()), attention), currentB());
  setBusy("Drawing…");
  const { layer, head } = getState();
  const complete = await longMode.draw(run, { layer, head }, count.max_tokens);
  if (signal.aborted || !complete) return;
  performance.mark("headscope-ready");
  setBusy("");
  $("status").textContent = longSummary(trace.n, attention.n, attention.header.reduce);
  document.body.dataset.state = "ready";
}

/**
 * Cancel: the run's requests are closed (a trace's stream, or the answer a slow forward computes: the server
 * stops before its next layer); what was shown stays.
 */
function cancel() {
  if (!controller || controller.signal.aborted) return;
  controller.abort();
  longMode.hideProgress();
  setBusy("");
  $("status").textContent = "Cancelled";
  document.body.dataset.state = "idle";
  if (current) markStale(current.query); // the form holds the cancelled text; the screen still the last run
  learnSizes(); // a load the cancelled run waited for may have ended: its menu entry says its size
}

/** Compare's B menu after A's model or a size changed: models of another shape off, with the reason. */
function refreshB() {
  const was = refreshModelB(known.models, $("model").value);
  if (was && $("compare").checked) notices.set("bmodel", modelBNotice(was, known.models, $("model").value));
}

/**
 * Learn the sizes of models loaded since the menus were labelled: after a comparison (B's model), a cancel
 * (a load that went on without a run to answer), and when a menu is about to be read (another tab's load).
 */
async function learnSizes(signal = null) {
  const entries = (await fetchModels().catch(() => ({ models: [] }))).models;
  if (!signal?.aborted && learnEntries(entries)) refreshB();
}

function select(layer, head) {
  if (!current || (current.long && isAggregate(head))) return;
  update(clampSelection({ layer, head }, current.attention));
  const state = getState();
  if (current.long) return longMode.select(current, state.layer, state.head);
  grid.select(state.layer, state.head);
  detail.draw(current);
  insights.showSelection(current);
}

/**
 * Open a head on the head probe's own input of the probed `model` (Find heads: a point or a chip), in the
 * normal detail: selected where that input is already on screen, else run (the model menu follows it).
 */
async function openProbed(layer, head, model) {
  const onScreen = current?.query.probe?.seed === getState().seed && (current.query.model || "") === model;
  if (onScreen) return openHead(layer, head);
  if (model && model !== $("model").value) {
    $("model").value = model;
    $("model").dispatchEvent(new Event("change")); // the form's own fields for that model
  }
  update({ layer, head });
  await run({ input: "probe" });
  if (current?.query.probe) $("headDetail").scrollIntoView({ block: "nearest" });
}

/** Open a head from an insight view (table row, similar head, ranking): select it and show the detail. */
function openHead(layer, head) {
  select(layer, head);
  $("headDetail").scrollIntoView({ block: "nearest" });
}

// With nothing focused, arrow keys move the selection (state.js: moveSelection) and take focus into the grid,
// whose own keys go on from there (grid.js). Focus anywhere else keeps its keys: the text boxes, the
// heatmap's cell cursor, the tabs.
function onArrow(event) {
  if (!current || event.altKey || event.ctrlKey || event.metaKey || event.target !== document.body) return;
  const next = moveSelection(getState(), event.key, current.attention);
  if (!next) return;
  event.preventDefault();
  select(next.layer, next.head);
  grid.focusSelected();
}

/** The example chips: each fills the form (and the model's own fields) and runs it. */
function showExamples() {
  renderExamples(
    $("examples"),
    ({ text, pair, model, chat = false, newTokens = 0 }) => {
      $("text").value = text;
      $("textPair").value = pair;
      if (pair) $("chat").checked = false; // a chat template takes one text: the pair example must still run
      if (model) {
        // The LLM example sets what it needs, and the model's change event shows those fields.
        $("chat").checked = chat;
        $("newTokens").value = String(newTokens);
        $("model").value = model;
        $("model").dispatchEvent(new Event("change"));
      }
      run({ input: "" });
    },
    known.models,
  );
}

async function boot() {
  const initial = readInitialState();
  try {
    known = fillModels(initial.models?.length ? initial : await fetchModels());
  } catch (error) {
    showError(error instanceof ApiError ? error.message : "Could not load the model list.");
  }
  const state = getState();
  initForm(state, { ...known, limits: initial.limits }, { onRun: () => run({ input: "" }) });
  enterSnapshot(); // a snapshot file: the input read-only, what needs a server hidden (snapshot-page.js)
  if (known.models.size) {
    notices.set("model", modelNotice(state.model, known.models, $("model").value));
    if (state.compare) notices.set("bmodel", modelNotice(state.bmodel, known.models, $("modelB").value, "B"));
  }
  if (!inSnapshot()) notices.set("link", ignoredNotice(ignoredParams()));
  refreshB();
  $("model").addEventListener("change", refreshB);
  for (const menu of [$("model"), $("modelB")]) menu.addEventListener("focus", () => learnSizes());
  if (!inSnapshot()) showExamples(); // a snapshot runs nothing else
  $("hideFirst").checked = state.hideFirst;
  initScaleMenu();
  $("hideFirst").addEventListener("change", () => update({ hideFirst: $("hideFirst").checked }));
  $("words").addEventListener("change", () => {
    update({ words: $("words").checked });
    if (current) run(); // every view switches: the same input again, merged to words
  });
  for (const radio of $("weightingSwitch").querySelectorAll("input[name=weighting]")) {
    radio.addEventListener("change", () => {
      if (!radio.checked) return;
      update({ weighting: radio.value });
      if (current) run(); // every view switches: the same input again, its maps weighted by norm (or not)
    });
  }
  bindTabs((view) => (current?.long ? null : update({ view }))); // token lines need the full matrices
  bindKindSwitch((kind) => update({ kind }));
  const exports = [["exportPng", "png"], ["exportSvg", "svg"], ["exportJson", "json"], ["exportJsonHead", "json-head"], ["exportHtml", "html"]];
  for (const [name, format] of exports) $(name).addEventListener("click", () => exportAs(current, format));
  $("copyLink").addEventListener("click", copyLink);
  document.addEventListener("keydown", onArrow);
  bindScrollCue($("gridBox"), $("gridScroll"));
  showTabs(state.view);
  if (state.text.trim() || state.input) run();
}

boot();
