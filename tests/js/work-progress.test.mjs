// A slow answer's progress (app/static/js/work-progress.js): what the bar says for each line of
// /api/attention/progress and when, and the load lines read from the stream (progress-stream.js).
// Run: node --test tests/js/

import assert from "node:assert/strict";
import { test } from "node:test";

import { streamProgress } from "../../app/static/js/progress-stream.js";
import { FORWARD_MS, LOAD_MS, layerView, progressView, watchDelay } from "../../app/static/js/work-progress.js";
import { fakeFetch } from "./fake-fetch.mjs";

const LOAD = { event: "load", model: "hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M", step: 42, steps: 100 };
const LAYER = { event: "progress", layer: 3, layers: 16, pass: 0 };

test("a load shows at once, as a share of its bar once it has one", () => {
  assert.deepEqual(progressView(LOAD, 0), {
    text: "Loading hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M: 42 %",
    value: 42,
    max: 100,
  });
  // Before its first step, no share: an indeterminate bar (no value), whatever the steps (none: no division)
  for (const steps of [0, 100]) {
    assert.deepEqual(progressView({ ...LOAD, step: 0, steps }, 0), {
      text: "Loading hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M…",
    });
  }
});

test("a forward's layers show only once the run has taken FORWARD_MS", () => {
  assert.equal(progressView(LAYER, FORWARD_MS - 1), null);
  assert.deepEqual(progressView(LAYER, FORWARD_MS), { text: "Layer 4 of 16", value: 3, max: 16 });
  assert.equal(layerView({ ...LAYER, pass: 2 }).text, "Layer 4 of 16 (pass 3)"); // a continuation's third
  assert.equal(layerView({ layer: 0, layers: 2 }).text, "Layer 1 of 2"); // the trace's lines have no pass
  assert.equal(progressView(null, FORWARD_MS), null);
  assert.equal(progressView({ event: "done" }, FORWARD_MS), null);
});

test("a loaded model is watched only from FORWARD_MS: it has no load to show", () => {
  assert.equal(watchDelay(true), FORWARD_MS);
  assert.equal(watchDelay(false), LOAD_MS);
  assert.equal(watchDelay(undefined), LOAD_MS);
  assert.ok(LOAD_MS < FORWARD_MS);
});

test("streamProgress hands load lines to onLoad and layers to onProgress, in order", async () => {
  const lines = [LOAD, { ...LOAD, step: 100 }, LAYER, { event: "done" }].map((e) => JSON.stringify(e)).join("\n");
  const calls = fakeFetch([lines.slice(0, 30), lines.slice(30)]);
  const seen = [];
  const done = await streamProgress("/api/attention/progress", { text: "x" }, {
    onLoad: (event) => seen.push(["load", event.step]),
    onProgress: (event) => seen.push(["layer", event.layer]),
    failed: "failed",
    ended: "ended",
  });
  assert.deepEqual(seen, [["load", 42], ["load", 100], ["layer", 3]]);
  assert.deepEqual(done, { event: "done" });
  assert.deepEqual(calls, [{ url: "/api/attention/progress", body: { text: "x" } }]);
});
