// Wires the page: form -> API -> decoded attention -> grid + detail, with the view state in the URL.
// document.body.dataset.state goes "loading" -> "ready" (every thumbnail and the detail drawn) or
// "error"; tests and benchmarks/browser.py wait on it. After "ready" the insight views (statistics,
// compare) load into #analysis; document.body.dataset.insight goes "loading" -> "ready". The rollout,
// further down, loads when its panel comes on screen (#rollout's data-state: idle -> loading -> ready).

import { $, $all, el } from "./dom.js";
import { ApiError, fetchAnalysis, fetchCompact, fetchFullBlob, fetchHead, fetchModels } from "./api.js";
import { AGGREGATES, isAggregate } from "./aggregates.js";
import { CompareView, queryB } from "./compare.js";
import { Grid } from "./grid.js";
import { exportImage, renderHeatmap } from "./heatmap.js";
import { CHANGE, StatsTable, colorScaleFor, fillColorBy, formatStat, renderLegend, renderSimilar, statTable } from "./insight.js";
import { RolloutView } from "./rollout.js";
import { renderTokenView } from "./tokens.js";
import { clampSelection as clampToModel, moveSelection, readState, writeState } from "./state.js";
import { exportName as exportFileName, modelLabel, selectionLabel } from "./labels.js";

const EXACT_DELAY_MS = 350; // wait for arrow-key bursts to settle before asking for exact values
// The exact head is binary float32, ~3.3 bytes a value after gzip: fetched by itself up to this n (~220 KB),
// on request above it (~0.85 MB at 512 tokens, for every head a person settles on).
const AUTO_EXACT_MAX_N = 256;

const page = {
  state: readState(),
  models: new Map(),
  defaultModel: "",
  attention: null, // decoded result of the last successful run
  query: null, // {text, pair, model, words} of that run
  queryB: null, // B's query in compare mode, else null
  analysis: null, // POST /api/analysis answer for the current run
  comparison: null, // POST /api/compare answer for the current run (compare mode)
  exact: new Map(), // "layer:head" -> Float32Array n*n, the model's values, for the current run
  controller: null,
  exactTimer: 0,
  exactController: null, // the exact head in flight; a newer selection aborts it
  runId: 0,
};

const grid = new Grid($("grid"), { onSelect: (layer, head) => select(layer, head) });
const statsTable = new StatsTable($("statsTable"), { onOpen: (layer, head) => openHead(layer, head) });
const rolloutView = new RolloutView({
  plot: $("rollout"),
  slider: $("rolloutLayer"),
  sliderValue: $("rolloutLayerValue"),
  caption: $("rolloutCaption"),
  panel: $("rolloutPanel"),
  flowButton: $("flowRun"),
  flowMessage: $("flowMessage"),
  flowNormalized: $("flowNormalized"),
  flowPlot: $("flow"),
});
const compareView = new CompareView(
  {
    panel: $("comparePanel"),
    summary: $("compareSummary"),
    ranking: $("compareRanking"),
    a: $("compareA"),
    b: $("compareB"),
    diff: $("compareDiff"),
    headCaption: $("compareHeadCaption"),
  },
  { onOpen: (layer, head) => openHead(layer, head) },
);

function readInitialState() {
  try {
    return JSON.parse($("initialState").textContent);
  } catch {
    return {};
  }
}

function setBusy(message) {
  const status = $("status");
  status.textContent = message;
  status.classList.toggle("busy", Boolean(message));
  $("form").setAttribute("aria-busy", message ? "true" : "false");
}

function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.hidden = !message;
}

// A run tells us the size of a model that was not loaded when the page was rendered.
function learnModel(attention) {
  const known = page.models.get(attention.model);
  if (!known || known.layers != null) return;
  Object.assign(known, { layers: attention.layers, heads: attention.heads, causal: attention.causal });
  const option = [...$("model").options].find((o) => o.value === attention.model);
  if (option) option.textContent = modelLabel(known);
}

function fillModels(info) {
  const select = $("model");
  page.models = new Map(info.models.map((m) => [m.name, m]));
  page.defaultModel = info.default ?? info.models[0]?.name ?? "";
  const options = info.models.map((m) => {
    const label = modelLabel(m);
    const option = el("option", { text: m.error ? `${label} (unavailable)` : label, attrs: { value: m.name } });
    if (m.error) {
      option.disabled = true;
      option.title = m.error;
    }
    return option;
  });
  select.replaceChildren(...options);
  $("modelB").replaceChildren(...options.map((option) => option.cloneNode(true)));
}

function currentQuery() {
  return { text: $("text").value, pair: $("textPair").value, model: $("model").value, words: $("words").checked };
}

function clampSelection(attention) {
  Object.assign(page.state, clampToModel(page.state, attention));
}

async function run() {
  const query = currentQuery();
  if (!query.text.trim()) {
    showError("Type a sentence first: there is nothing to look at yet.");
    $("text").focus();
    return;
  }
  page.controller?.abort();
  cancelExact();
  const controller = new AbortController();
  page.controller = controller;
  const runId = ++page.runId;
  showError("");
  setBusy("Running the model…");
  document.body.dataset.state = "loading";
  document.body.dataset.insight = "idle"; // the insight views follow this run once it is drawn
  performance.mark("headscope-run");
  try {
    const attention = await fetchCompact(query, { signal: controller.signal });
    if (runId !== page.runId) return;
    page.attention = attention;
    learnModel(attention);
    page.query = query;
    page.exact = new Map();
    page.analysis = null;
    page.comparison = null;
    const compare = $("compare").checked;
    const b = { btext: $("textB").value, bmodel: $("modelB").value };
    page.queryB = compare ? queryB(query, b) : null;
    Object.assign(page.state, { text: query.text, pair: query.pair, model: query.model, words: query.words, compare });
    Object.assign(page.state, compare ? { ...b, bmodel: b.bmodel === query.model ? "" : b.bmodel } : { btext: "", bmodel: "" });
    clampSelection(attention);
    writeState(page.state);
    setBusy("Drawing…");
    performance.mark("headscope-decoded");
    // Marks for benchmarks/browser.py: where the time between click and "ready" goes.
    const gridDone = grid.render(attention).then((done) => (performance.mark("headscope-grid"), done));
    grid.select(page.state.layer, page.state.head);
    const detailDone = drawDetail({ keepZoom: false }).then(() => performance.mark("headscope-detail"));
    const [complete] = await Promise.all([gridDone, detailDone]);
    if (runId !== page.runId || !complete) return;
    setBusy("");
    $("status").textContent = `${attention.n} tokens · ${attention.layers} layers × ${attention.heads} heads`;
    performance.mark("headscope-ready");
    document.body.dataset.state = "ready";
    loadInsights(runId);
  } catch (error) {
    if (error.name === "AbortError" || runId !== page.runId) return;
    setBusy("");
    document.body.dataset.state = "error";
    showError(error instanceof ApiError ? error.message : `Something went wrong in the page: ${error.message}`);
    if (!(error instanceof ApiError)) console.error(error);
  }
}

function detailValues(layer, head) {
  const attention = page.attention;
  if (isAggregate(head)) return { values: AGGREGATES[head].compute(attention, layer), exact: false };
  const exact = page.exact.get(`${layer}:${head}`);
  if (exact) return { values: exact, exact: true };
  return { values: attention.headInto(layer, head), exact: false };
}

async function drawDetail({ keepZoom = true } = {}) {
  const attention = page.attention;
  if (!attention) return;
  const { layer, head, view } = page.state;
  const { values, exact } = detailValues(layer, head);
  const modelName = attention.model ?? page.query?.model ?? "";
  $("detailTitle").textContent = `Head detail: ${selectionLabel(layer, head)}`;
  const notes = [
    exact
      ? "Exact float32 values."
      : `8-bit values (within ±${attention.maxAbsError.toFixed(4)})${
          isAggregate(head) || attention.n > AUTO_EXACT_MAX_N ? "" : "; exact values on the way"
        }.`,
  ];
  if (attention.truncated) notes.push(`Input truncated to ${attention.n} tokens (the model's maximum).`);
  if (attention.causal) notes.push("Hatched cells are masked: a causal model cannot look ahead.");
  notes.push(view === "heatmap" ? "Drag to zoom, double-click to reset." : "Hover a token to isolate its lines.");
  $("detailCaption").textContent = notes.join(" ");

  const heatmapVisible = view === "heatmap";
  $("detailScroll").hidden = !heatmapVisible;
  $("tokenView").hidden = heatmapVisible;
  for (const tab of $all("tabs")) tab.setAttribute("aria-selected", String(tab.dataset.view === view));
  $("exportPng").disabled = !heatmapVisible;

  const spec = {
    tokens: attention.tokens,
    values,
    causal: attention.causal,
    boundary: attention.boundary,
    segments: attention.segments,
    special: attention.special,
    exact,
    title: `${modelName} · ${selectionLabel(layer, head)}`,
    filename: exportName(),
    keepZoom, // a new run starts unzoomed; another head of the same run keeps the zoomed region
  };
  if (heatmapVisible) {
    await renderHeatmap($("headDetail"), spec);
  } else {
    renderTokenView($("tokenView"), spec);
  }
  const wantsExact = !exact && !isAggregate(head);
  $("exact").hidden = !(wantsExact && attention.n > AUTO_EXACT_MAX_N);
  if (wantsExact && attention.n <= AUTO_EXACT_MAX_N) scheduleExact(layer, head);
  else if (!wantsExact) cancelExact();
}

function cancelExact() {
  clearTimeout(page.exactTimer);
  page.exactController?.abort();
  page.exactController = null;
}

// Full precision for the head a person settled on (POST /api/attention/head/compact, binary float32), then
// redraw. A newer selection cancels the wait and the fetch.
function scheduleExact(layer, head, delay = EXACT_DELAY_MS) {
  cancelExact();
  const runId = page.runId;
  const query = page.query;
  const controller = new AbortController();
  page.exactController = controller;
  page.exactTimer = setTimeout(async () => {
    try {
      const exact = await fetchHead(query, layer, head, { signal: controller.signal });
      if (runId !== page.runId) return;
      page.exact.set(`${layer}:${head}`, exact.headInto(0, 0));
      if (page.state.layer === layer && page.state.head === head) await drawDetail();
    } catch (error) {
      if (error.name === "AbortError") return;
      // The quantized view stays usable; say why exact values are missing.
      if (runId === page.runId) $("detailCaption").textContent += ` Exact values unavailable: ${error.message}`;
    }
  }, delay);
}

function select(layer, head) {
  const attention = page.attention;
  if (!attention) return;
  page.state.layer = layer;
  page.state.head = head;
  clampSelection(attention);
  grid.select(page.state.layer, page.state.head);
  writeState(page.state);
  drawDetail();
  showInsightSelection();
}

/** Open a head from an insight view (table row, similar head, ranking): select it and show the detail. */
function openHead(layer, head) {
  select(layer, head);
  $("headDetail").scrollIntoView({ block: "nearest" });
}

// The insight views of the current run: statistics + similar heads, rollout, and compare when asked for.
// They load after the grid and detail are drawn, so they never delay the first picture.
async function loadInsights(runId) {
  const query = page.query;
  const body = document.body;
  body.dataset.insight = "loading";
  $("analysis").hidden = false;
  const status = $("insightStatus");
  status.textContent = "Computing head statistics…";
  status.classList.add("busy");
  if (!page.queryB) compareView.clear();
  const problems = [];
  const note = (what) => (error) => {
    if (runId === page.runId) problems.push(`${what}: ${error.message}`);
  };
  // B is the person's own input: a comparison that cannot be made (other shapes, blank) goes to the alert.
  const comparing = page.queryB
    ? compareView.load(query, page.queryB).catch((error) => {
        if (runId === page.runId) showError(`Could not compare A and B: ${error.message}`);
        return null;
      })
    : null;
  const stats = Promise.all([fetchAnalysis(query), comparing]).then(([analysis, comparison]) => {
    if (runId !== page.runId) return null;
    page.analysis = analysis;
    page.comparison = comparison;
    if (comparison && !page.state.color) page.state.color = CHANGE; // compare mode: colour by change
    renderStats();
    showInsightSelection({ withCompare: false });
    return comparison ? compareView.show(page.state.layer, page.state.head, { delay: 0, causal: page.attention.causal }) : null;
  });
  // Below the statistics: fetched when its panel is on screen, so the first view moves only what it shows.
  rolloutView.watch(query, { causal: page.attention.causal, boundary: page.attention.boundary });
  await stats.catch(note("statistics"));
  if (runId !== page.runId) return;
  status.classList.remove("busy");
  status.textContent = problems.length ? `Unavailable: ${problems.join("; ")}` : "";
  performance.mark("headscope-insight"); // benchmarks/browser.py: click -> statistics (and compare) drawn
  body.dataset.insight = problems.length ? "error" : "ready";
}

/** Statistics table, colour-by select, legend and thumbnail frames for the loaded analysis. */
function renderStats() {
  const { analysis, comparison } = page;
  if (!analysis) return;
  // Compare mode lists the heads that change most first, unless someone already picked a sort.
  if (comparison && !statsTable.sorted) statsTable.sort = { key: CHANGE, descending: true };
  statsTable.render(analysis, comparison);
  page.state.color = fillColorBy($("colorBy"), analysis, comparison, page.state.color);
  writeState(page.state);
  colorGrid();
}

function colorGrid() {
  const { analysis, comparison } = page;
  if (!analysis) return;
  const key = page.state.color;
  const values = key ? statTable(analysis, comparison)[key] : null;
  const scale = values ? colorScaleFor(values) : null;
  grid.decorate({
    labels: analysis.labels,
    values,
    color: scale?.color,
    describe: (v) => formatStat(key, v),
    statName: key,
  });
  renderLegend($("colorLegend"), analysis, comparison, key);
}

/** The insight views that follow the selected head: table row, similar heads, compare maps. */
function showInsightSelection({ withCompare = true } = {}) {
  const { layer, head } = page.state;
  if (!page.analysis) return;
  statsTable.select(layer, head);
  renderSimilar($("similar"), page.analysis, layer, isAggregate(head) ? -1 : head, openHead);
  if (page.comparison && withCompare) compareView.show(layer, head, { causal: page.attention.causal });
}

function setView(view) {
  page.state.view = view;
  writeState(page.state);
  if (page.attention) drawDetail();
  else for (const tab of $all("tabs")) tab.setAttribute("aria-selected", String(tab.dataset.view === view));
}

// Arrow keys move the selection (state.js: moveSelection); not while typing.
function onArrow(event) {
  const attention = page.attention;
  if (!attention || event.altKey || event.ctrlKey || event.metaKey) return;
  if (event.target.closest("input, textarea, select")) return;
  const next = moveSelection(page.state, event.key, attention);
  if (!next) return;
  event.preventDefault();
  select(next.layer, next.head);
}

function exportName() {
  const { layer, head } = page.state;
  return exportFileName(page.attention?.model, layer, head);
}

function download(blob, filename) {
  const url = URL.createObjectURL(blob);
  const a = el("a", { attrs: { href: url, download: filename } });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

async function exportAs(format) {
  if (!page.attention) {
    showError("Run a sentence first, then export it.");
    return;
  }
  showError("");
  try {
    if (format === "json") {
      setBusy("Preparing JSON…");
      download(await fetchFullBlob(page.query), `${exportName()}.json`);
      setBusy("");
    } else if (page.state.view === "tokens" && format === "svg") {
      const source = new XMLSerializer().serializeToString($("tokenView").querySelector("svg"));
      download(new Blob([source], { type: "image/svg+xml" }), `${exportName()}-tokens.svg`);
    } else {
      await exportImage($("headDetail"), format, exportName());
    }
  } catch (error) {
    setBusy("");
    showError(error instanceof ApiError ? error.message : `Export failed: ${error.message}`);
  }
}

async function init() {
  const initial = readInitialState();
  try {
    fillModels(initial.models?.length ? initial : await fetchModels());
  } catch (error) {
    showError(error instanceof ApiError ? error.message : "Could not load the model list.");
  }
  const s = page.state;
  $("text").value = s.text;
  $("textPair").value = s.pair;
  $("model").value = page.models.has(s.model) ? s.model : page.defaultModel;
  $("words").checked = s.words;
  $("compare").checked = s.compare;
  $("compareInputs").hidden = !s.compare;
  $("textB").value = s.btext;
  $("modelB").value = page.models.has(s.bmodel) ? s.bmodel : $("model").value;

  $("form").addEventListener("submit", (event) => {
    event.preventDefault();
    run();
  });
  $("words").addEventListener("change", () => {
    page.state.words = $("words").checked;
    writeState(page.state);
    if (page.attention) run(); // every view switches: the same input again, merged to words
  });
  $("compare").addEventListener("change", () => {
    $("compareInputs").hidden = !$("compare").checked;
    if ($("compare").checked) $("textB").focus();
  });
  // B follows A's model until someone picks one for B.
  let modelBChosen = Boolean(s.bmodel);
  $("modelB").addEventListener("change", () => {
    modelBChosen = true;
  });
  $("model").addEventListener("change", () => {
    if (!modelBChosen) $("modelB").value = $("model").value;
  });
  $("colorBy").addEventListener("change", () => {
    page.state.color = $("colorBy").value;
    writeState(page.state);
    colorGrid();
  });
  for (const name of ["text", "textPair", "textB"]) {
    $(name).addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        run();
      }
    });
  }
  for (const tab of $all("tabs")) tab.addEventListener("click", () => setView(tab.dataset.view));
  $("exportPng").addEventListener("click", () => exportAs("png"));
  $("exportSvg").addEventListener("click", () => exportAs("svg"));
  $("exportJson").addEventListener("click", () => exportAs("json"));
  $("exact").addEventListener("click", () => {
    $("exact").hidden = true;
    $("detailCaption").textContent = "Loading exact values…";
    scheduleExact(page.state.layer, page.state.head, 0);
  });
  document.addEventListener("keydown", onArrow);
  for (const tab of $all("tabs")) tab.setAttribute("aria-selected", String(tab.dataset.view === s.view));

  if (s.text.trim()) run();
}

init();
