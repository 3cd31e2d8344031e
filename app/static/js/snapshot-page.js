// The page in a snapshot file (app/snapshot/, docs/snapshots.md): the run's input shown read-only, and
// every control that needs a server hidden or turned off, with a line that says how to get it (the file's
// banner says it once for the whole page: `rerun`). What the file carries (carried.js) still works as on the
// page: the grid, the detail, token lines, statistics, rollout, the kinds of an encoder-decoder, the keys.

import { $, el } from "./dom.js";
import { carried } from "./carried.js";

// Controls that run the model again or talk to a server: hidden. Each name is dom.js's; `label` hides the
// control's label with it (a checkbox), `group` its container.
const HIDDEN = [
  ["examples", "group"],
  ["run", ""],
  ["words", "label"],
  ["compare", "label"],
  ["compareInputs", ""],
  ["exportJson", ""],
  ["exportJsonHead", ""],
  ["exportHtml", ""], // this file is the saved one: it cannot build another (that needs the run's model)
  ["copyLink", ""],
  ["effectsRun", ""],
  ["probePanel", ""], // the probe runs the model on its own input: nothing of it is carried
];
// Fields that show the run's input: read only (text) or off (choices).
const READ_ONLY = ["text", "textPair", "target", "newTokens"];
const OFF = ["model", "chat", "weightingSwitch"];

/** True in a snapshot file. */
export function inSnapshot() {
  return carried() !== null;
}

/** Turn the page into the snapshot's: the input read-only, what needs a server hidden and said once. */
export function enterSnapshot() {
  const snapshot = carried();
  if (!snapshot) return;
  document.body.dataset.snapshot = "true";
  // Shown inside another page (a notebook's output iframe, whose opaque origin still lets it compare the
  // windows): the framed layout of headscope.css, the grid and the detail where the frame opens.
  if (window.self !== window.top) document.body.dataset.framed = "true";
  for (const [name, part] of HIDDEN) {
    const element = $(name);
    const hidden = part === "label" ? element.closest("label") : part === "group" ? element.parentElement : element;
    hidden.hidden = true;
  }
  for (const name of READ_ONLY) $(name).readOnly = true;
  for (const name of OFF) {
    $(name).disabled = true;
    $(name).title = `This snapshot shows one run. ${snapshot.rerun}`;
  }
  // The one control of the insight views that runs the model: its place says how to measure it.
  const needs = "Measuring which heads matter runs the model about L·H/2 times, so it needs a headscope server.";
  $("effectsRun").after(el("p", { className: "hint snapshot-needs", text: `${needs} ${snapshot.rerun}` }));
}
