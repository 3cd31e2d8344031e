// Boots the Corpus view (/corpus): finished corpus runs of the server's HEADSCOPE_RUNS_DIR -> pick a run
// -> the head grid coloured by a statistic's corpus mean -> a head's per-text distribution and examples,
// each example one click from the normal view of its text with that head open.
// The view lives in the URL (?run=&stat=&layer=&head=[&plot=violin][&all=1], corpus-model.js), written
// with history.replaceState. document.body.dataset.state goes "loading" -> "ready" (grid and head drawn),
// "empty" (no runs folder, or no runs in it) or "error"; the tests wait on it.

import { $, el } from "./dom.js";
import { ApiError, request } from "./api.js";
import { CorpusGrid } from "./corpus-grid.js";
import { HeadPanel } from "./corpus-head.js";
import { clampCorpus, encodeCorpusState, headRow, meanGrid, readCorpusState, runLabel } from "./corpus-model.js";
import { showError } from "./form.js";
import { statName } from "./names.js";
import { reveal } from "./viewport.js";

let state = readCorpusState(window.location.search);
let runs = []; // the list's entries
let run = null; // {entry, detail} of the run on screen
let controller = null; // aborts the latest head's fetches: a quicker key press wins
let opening = 0; // the latest run asked for: an earlier one answering late is dropped

// A head chosen while its panel lies off screen (a phone: it is under the grid) brings the panel into view.
const grid = new CorpusGrid($("corpusGrid"), $("corpusLegend"), {
  onSelect: (layer, head) => {
    select(layer, head);
    reveal($("corpusHeadPanel"));
  },
});
const panel = new HeadPanel({
  title: $("corpusHeadTitle"),
  summary: $("corpusHeadSummary"),
  plot: $("corpusPlot"),
  point: $("corpusPoint"),
  top: $("corpusTop"),
  bottom: $("corpusBottom"),
  note: $("corpusLinkNote"),
  fetchText: (entry, line) => getJson(api(entry.name, "texts", line)),
});

function update(patch) {
  state = { ...state, ...patch };
  window.history.replaceState(null, "", `${window.location.pathname}?${encodeCorpusState(state)}`);
}

async function getJson(path, signal) {
  return (await request(path, { signal, headers: { Accept: "application/json" } })).json();
}

/** Relative to /corpus, so the view works under a proxy's prefix too. */
function api(...parts) {
  return `api/corpus/runs${parts.map((part) => `/${encodeURIComponent(part)}`).join("")}`;
}

function fail(error) {
  if (error?.name === "AbortError") return;
  document.body.dataset.state = "error";
  showError(error instanceof ApiError ? error.message : `Something went wrong in the page: ${error.message}`);
  if (!(error instanceof ApiError)) console.error(error);
}

function empty(message) {
  $("corpusEmpty").textContent = message;
  $("corpusEmpty").hidden = false;
  $("corpusWorkspace").hidden = true;
  for (const name of ["corpusRun", "corpusStat", "corpusPlotKind", "corpusAll"]) $(name).disabled = true;
  document.body.dataset.state = "empty";
}

async function boot() {
  document.body.dataset.state = "loading";
  const list = await getJson(api());
  if (!list.configured) return empty(`No corpus runs are served here: ${list.hint}.`);
  runs = list.runs;
  if (!runs.length) {
    return empty(
      "The runs folder holds no finished run yet. Make one with `headscope corpus texts.jsonl --model " +
        "all-MiniLM-L6-v2 --out <runs folder>/<name>`; it shows here once it is complete (reload the page).",
    );
  }
  $("corpusRun").replaceChildren(...runs.map((entry) => el("option", { text: runLabel(entry), attrs: { value: entry.name } })));
  const asked = state.run;
  const entry = runs.find((r) => r.name === asked) ?? runs[0];
  const notes = asked && entry.name !== asked ? [`There is no finished run “${asked}” here; showing “${entry.name}”.`] : [];
  await openRun(entry.name, notes);
}

/** Open run `name`; `notes`: what the link asked for that is shown otherwise (the first open says more). */
async function openRun(name, notes = []) {
  document.body.dataset.state = "loading";
  controller?.abort();
  const asking = ++opening;
  const entry = runs.find((r) => r.name === name);
  $("corpusRun").value = name;
  const detail = await getJson(api(name));
  if (asking !== opening) return;
  run = { entry, detail };
  const stats = detail.stats;
  $("corpusStat").replaceChildren(
    ...stats.map((stat) => el("option", { text: statName(stat), attrs: { value: stat, title: detail.stat_descriptions?.[stat] ?? "" } })),
  );
  const asked = state;
  update({ ...clampCorpus(state, { layers: detail.layers, heads: detail.heads, stats }), run: name });
  if (asked.layer !== state.layer || asked.head !== state.head) {
    notes.push(`L${asked.layer} H${asked.head} is beyond this run's ${detail.layers} layers × ${detail.heads} heads; showing L${state.layer} H${state.head}.`);
  }
  if (asked.stat !== state.stat) notes.push(`This run has no statistic “${asked.stat}”; showing ${statName(state.stat)}.`);
  $("corpusNotice").textContent = notes.join(" ");
  $("corpusNotice").hidden = !notes.length;
  $("corpusStat").value = state.stat;
  const counts = detail.counts ?? {};
  const parts = [
    `${detail.model}${detail.kind === "encoder" ? " (encoder)" : ""}`,
    `${detail.layers} layers × ${detail.heads} heads`,
    `${Number(counts.texts ?? 0).toLocaleString("en-US")} texts`,
    counts.errors ? `${counts.errors} bad records skipped` : "",
    counts.truncated ? `${counts.truncated} truncated` : "",
    detail.words ? "words mode" : "",
    detail.weighting === "norm" ? "weight × value norm" : "",
    detail.finished ? `finished ${detail.finished}` : "",
  ];
  $("corpusSummary").textContent = parts.filter(Boolean).join(" · ");
  drawGrid();
  await showHead();
}

function drawGrid() {
  const { detail } = run;
  grid.render(meanGrid(detail.per_head, state.stat, detail.layers, detail.heads), state.stat, detail.stat_descriptions?.[state.stat] ?? "");
  grid.select(state.layer, state.head);
}

/** The selected head's distribution (or its layer's) and examples. */
async function showHead() {
  controller?.abort();
  controller = new AbortController();
  const { signal } = controller;
  const { layer, head, stat, all } = state;
  const { name, heads } = run.detail;
  document.body.dataset.state = "loading";
  grid.select(layer, head);
  try {
    const fetchHead = (h) => getJson(`${api(name, "heads", layer, h)}?stat=${encodeURIComponent(stat)}`, signal);
    const answers = all ? await Promise.all([...Array(heads).keys()].map(fetchHead)) : [await fetchHead(head)];
    if (signal.aborted) return;
    const answer = all ? answers[head] : answers[0];
    const series = answers.map((a) => ({ layer: a.layer, head: a.head, values: a.values, ids: a.ids, lines: a.lines }));
    await panel.show(run.entry, state, series, answer, headRow(run.detail.per_head, layer, head));
    if (signal.aborted) return;
    showError("");
    document.body.dataset.state = "ready";
  } catch (error) {
    if (!signal.aborted) fail(error);
  }
}

function select(layer, head) {
  if (!run) return;
  update({ layer, head });
  showHead();
}

$("corpusRun").addEventListener("change", (event) => openRun(event.target.value).catch(fail));
$("corpusStat").addEventListener("change", (event) => {
  update({ stat: event.target.value });
  drawGrid();
  showHead();
});
$("corpusPlotKind").value = state.plot;
$("corpusPlotKind").addEventListener("change", (event) => {
  update({ plot: event.target.value });
  showHead();
});
$("corpusAll").checked = state.all;
$("corpusAll").addEventListener("change", (event) => {
  update({ all: event.target.checked });
  showHead();
});

boot().catch(fail);
