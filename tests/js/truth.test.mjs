// app/static/js/truth.js: what the page says when it shows something other than what was asked for.
// Run: node --test tests/js/

import assert from "node:assert/strict";
import { test } from "node:test";

import {
  compareProblem,
  flowButtonLabel,
  flowLimitNote,
  ignoredNotice,
  modelBNotice,
  modelNotice,
  selectionNotice,
  servable,
  staleMessage,
} from "../../app/static/js/truth.js";

const MODELS = new Map([
  ["all-MiniLM-L6-v2", { name: "all-MiniLM-L6-v2", layers: 6, heads: 12, error: null }],
  ["twin", { name: "twin", layers: 6, heads: 12, error: null }],
  ["tiny-gpt2", { name: "tiny-gpt2", layers: 2, heads: 4, error: null }],
  ["lazy", { name: "lazy", layers: null, heads: null, error: null }],
  ["broken", { name: "broken", layers: null, heads: null, error: "config.json is missing" }],
]);

test("a model a link names that is not served, or failed, is named with what is shown instead", () => {
  assert.equal(
    modelNotice("gpt-5", MODELS, "all-MiniLM-L6-v2"),
    "Model “gpt-5” is not served here; showing all-MiniLM-L6-v2.",
  );
  assert.equal(
    modelNotice("broken", MODELS, "all-MiniLM-L6-v2", "B"),
    "B model “broken” is unavailable here (config.json is missing); showing all-MiniLM-L6-v2.",
  );
  assert.equal(modelNotice("", MODELS, "all-MiniLM-L6-v2"), null); // the link named none
  assert.equal(modelNotice("tiny-gpt2", MODELS, "tiny-gpt2"), null);
  assert.equal(servable(MODELS, "broken"), false);
  assert.equal(servable(MODELS, "gpt-5"), false);
  assert.equal(servable(MODELS, "lazy"), true);
});

test("a clamped selection says what moved and where to", () => {
  const model = { layers: 6, heads: 12 };
  assert.equal(
    selectionNotice({ layer: 9, head: 3 }, { layer: 5, head: 3 }, model),
    "layer 9 is beyond this model's 6 layers (0–5); showing layer 5.",
  );
  assert.equal(
    selectionNotice({ layer: 9, head: 40 }, { layer: 5, head: 11 }, model),
    "layer 9 is beyond this model's 6 layers (0–5); showing layer 5; head 40 is beyond its 12 heads (0–11); showing head 11.",
  );
  assert.equal(selectionNotice({ layer: 2, head: "mean" }, { layer: 2, head: "mean" }, model), null);
});

test("ignored link values are listed, none gives no notice", () => {
  assert.equal(ignoredNotice([]), null);
  assert.equal(
    ignoredNotice([{ name: "view", value: "flow" }, { name: "layer", value: "x" }]),
    "Ignored in the link: view “flow”, layer “x”.",
  );
});

test("compare pairs models of the same layers and heads; an unloaded size is not guessed", () => {
  const a = MODELS.get("all-MiniLM-L6-v2");
  assert.equal(compareProblem(a, MODELS.get("twin")), "");
  assert.equal(compareProblem(a, a), "");
  assert.equal(compareProblem(a, MODELS.get("lazy")), "");
  assert.equal(
    compareProblem(a, MODELS.get("tiny-gpt2")),
    "2 layers × 4 heads; A (all-MiniLM-L6-v2) has 6 × 12, and compare pairs heads one to one",
  );
  assert.match(modelBNotice("tiny-gpt2", MODELS, "all-MiniLM-L6-v2"), /^B model “tiny-gpt2” cannot be compared .*; B uses all-MiniLM-L6-v2\.$/);
  assert.equal(modelBNotice(null, MODELS, "all-MiniLM-L6-v2"), null);
});

test("flow shows its limit and, above it, why it is off, never an API route", () => {
  assert.equal(flowButtonLabel(14, false), "Compute attention flow (up to 14 tokens)");
  assert.equal(flowButtonLabel(14, true), "Compute attention flow (up to 14 words)");
  assert.equal(flowButtonLabel(undefined, false), "Compute attention flow");
  assert.equal(flowLimitNote(14, 14, false), null); // the limit itself is allowed
  const note = flowLimitNote(29, 14, false);
  assert.match(note, /limited to 14 tokens.*this input has 29/);
  assert.doesNotMatch(note, /\/api\//);
  assert.equal(flowLimitNote(29, undefined, false), null); // no known limit: the server decides
});

test("the stale banner quotes the input on screen, cut and on one line", () => {
  assert.equal(
    staleMessage({ text: "The cat\nsat." }),
    "Showing the previous result, for “The cat sat.”: the last run failed (see the message above).",
  );
  const long = staleMessage({ text: "x".repeat(200) }, 10);
  assert.ok(long.includes(`“${"x".repeat(9)}…”`), long);
});
