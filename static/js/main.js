// Boots the page and runs it: form -> API -> decoded attention -> grid + detail, then the insight views.
// document.body.dataset.state goes "loading" -> "ready" (every thumbnail and the detail drawn) or
// "error"; tests and benchmarks/browser.py wait on it. After "ready" the insight views (statistics,
// compare) load into #analysis (insight-panel.js); the rollout loads when its panel comes on screen.
//
// The view state changes only through state.js update(); a run is {query, queryB, attention, signal, exact,
// analysis, comparison}, and a new run aborts the old one's signal: its fetches stop and nothing of it draws.

import { $, $all } from "./dom.js";
import { ApiError, fetchCompact, fetchModels } from "./api.js";
import { queryB } from "./compare.js";
import { Detail, showTabs } from "./detail.js";
import { firstExample, renderExamples } from "./examples.js";
import { exportAs } from "./export.js";
import { currentB, currentQuery, fillModels, initForm, learnModel, readInitialState, setBusy, showError } from "./form.js";
import { Grid } from "./grid.js";
import { InsightPanel } from "./insight-panel.js";
import { runSummary } from "./labels.js";
import { clampSelection, getState, initState, moveSelection, readState, subscribe, update } from "./state.js";
import { bindScrollCue, reveal } from "./viewport.js";
import { WrittenView } from "./written.js";

// A first visit (no text in the URL) starts from an example, run like any other: the URL then holds it.
initState({ ...readState(), ...firstExample(window.location.search) });

let current = null; // the run on screen (its attention decoded), or null before the first
let controller = null; // aborts the latest run
let known = { models: new Map(), defaultModel: "" };

// A tap on a thumbnail also brings the detail into view when it lies off screen (a phone: it is below).
const grid = new Grid($("grid"), {
  onSelect: (layer, head) => {
    select(layer, head);
    reveal($("detailPanel"));
  },
});
const written = new WrittenView({
  panel: $("written"),
  list: $("writtenTokens"),
  caption: $("writtenCaption"),
  prompt: $("writtenPrompt"),
  top: $("writtenTop"),
});
const detail = new Detail({ written });
const insights = new InsightPanel({ grid, current: () => current, onOpen: (layer, head) => openHead(layer, head) });

subscribe((state, changed) => {
  $("hideFirst").checked = state.hideFirst;
  if (!changed.has("view") && !changed.has("hideFirst")) return;
  if (current) detail.draw(current);
  else showTabs(state.view);
});

async function run() {
  const query = currentQuery();
  if (!query.text.trim()) {
    showError("Type a sentence first: there is nothing to look at yet.");
    $("text").focus();
    return;
  }
  controller?.abort(); // the old run's fetches, thumbnails, exact head and insight views stop here
  detail.cancelExact();
  controller = new AbortController();
  const { signal } = controller;
  showError("");
  setBusy("Running the model…");
  document.body.dataset.state = "loading";
  document.body.dataset.insight = "idle"; // the insight views follow this run once it is drawn
  performance.mark("headscope-run");
  try {
    const attention = await fetchCompact(query, { signal });
    if (signal.aborted) return;
    // A model loaded by this run: its /api/models entry now says what the answer does not (chat template).
    const unloaded = known.models.get(attention.model)?.layers == null;
    const entries = unloaded ? (await fetchModels().catch(() => ({ models: [] }))).models : [];
    if (signal.aborted) return;
    learnModel(attention, entries);
    const { compare, btext, bmodel } = currentB();
    const b = compare ? queryB(query, { btext, bmodel }) : null;
    const run = { query, queryB: b, attention, signal, exact: new Map(), analysis: null, comparison: null };
    current = run;
    update({
      text: query.text,
      pair: query.pair,
      model: query.model,
      words: query.words,
      newTokens: query.newTokens,
      chat: query.chat,
      compare,
      btext: compare ? btext : "",
      bmodel: compare && bmodel !== query.model ? bmodel : "",
      ...clampSelection(getState(), attention),
    });
    setBusy("Drawing…");
    performance.mark("headscope-decoded");
    // Marks for benchmarks/browser.py: where the time between click and "ready" goes.
    const gridDone = grid.render(attention, { signal }).then((done) => (performance.mark("headscope-grid"), done));
    const { layer, head } = getState();
    grid.select(layer, head);
    const detailDone = detail.draw(run, { keepZoom: false }).then(() => performance.mark("headscope-detail"));
    const [complete] = await Promise.all([gridDone, detailDone]);
    if (signal.aborted || !complete) return;
    setBusy("");
    $("status").textContent = runSummary(attention, query.newTokens);
    performance.mark("headscope-ready");
    document.body.dataset.state = "ready";
    insights.load(run);
  } catch (error) {
    if (signal.aborted) return;
    setBusy("");
    document.body.dataset.state = "error";
    showError(error instanceof ApiError ? error.message : `Something went wrong in the page: ${error.message}`);
    if (!(error instanceof ApiError)) console.error(error);
  }
}

function select(layer, head) {
  if (!current) return;
  update(clampSelection({ layer, head }, current.attention));
  const state = getState();
  grid.select(state.layer, state.head);
  detail.draw(current);
  insights.showSelection(current);
}

/** Open a head from an insight view (table row, similar head, ranking): select it and show the detail. */
function openHead(layer, head) {
  select(layer, head);
  $("headDetail").scrollIntoView({ block: "nearest" });
}

// Arrow keys move the selection (state.js: moveSelection); not while typing.
function onArrow(event) {
  if (!current || event.altKey || event.ctrlKey || event.metaKey) return;
  if (event.target.closest("input, textarea, select")) return;
  const next = moveSelection(getState(), event.key, current.attention);
  if (!next) return;
  event.preventDefault();
  select(next.layer, next.head);
}

async function boot() {
  const initial = readInitialState();
  try {
    known = fillModels(initial.models?.length ? initial : await fetchModels());
  } catch (error) {
    showError(error instanceof ApiError ? error.message : "Could not load the model list.");
  }
  const state = getState();
  initForm(state, { ...known, limits: initial.limits }, { onRun: run });
  renderExamples($("examples"), ({ text, pair }) => {
    $("text").value = text;
    $("textPair").value = pair;
    if (pair) $("chat").checked = false; // a chat template takes one text: the pair example must still run
    run();
  });
  $("hideFirst").checked = state.hideFirst;
  $("hideFirst").addEventListener("change", () => update({ hideFirst: $("hideFirst").checked }));
  $("words").addEventListener("change", () => {
    update({ words: $("words").checked });
    if (current) run(); // every view switches: the same input again, merged to words
  });
  for (const tab of $all("tabs")) tab.addEventListener("click", () => update({ view: tab.dataset.view }));
  for (const [name, format] of [["exportPng", "png"], ["exportSvg", "svg"], ["exportJson", "json"]]) {
    $(name).addEventListener("click", () => exportAs(current, format));
  }
  document.addEventListener("keydown", onArrow);
  bindScrollCue($("gridBox"), $("gridScroll"));
  showTabs(state.view);
  if (state.text.trim()) run();
}

boot();
