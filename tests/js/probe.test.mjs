// app/static/js/probe.js: the "Find heads" panel's pure parts: the body, the seed's bounds, the axes, the
// scatter's traces (a trace per layer, absent values left out), the chips' ranking (labelled heads only)
// and the CSV. Run: node --test tests/js/

import assert from "node:assert/strict";
import { test } from "node:test";

import {
  axesOf, chanceLevels, chanceText, hoverText, parseSeed, probeBody, probeCsv, probeFileName, rankHeads, scatterTraces,
} from "../../app/static/js/probe.js";
import { encodeState, ignoredParams, readState } from "../../app/static/js/state.js";

// Two layers of two heads: L1 H0 an induction head, L0 H1 a previous-token head, L0 H0 without a
// duplicate-token score (null: no row had a copy).
const result = {
  model: "org/tiny model",
  seed: 3,
  sequences: 2,
  length: 5,
  layers: 2,
  heads: 2,
  kind: "self",
  scores: {
    previous_token: [[0.1, 0.9], [0.05, 0.2]],
    duplicate_token: [[null, 0.02], [0.3, 0.1]],
    induction: [[0.01, 0.03], [0.8, 0.6]],
  },
  spread: {
    previous_token: [[0.01, 0.02], [0.01, 0.03]],
    duplicate_token: [[null, 0.01], [0.02, 0.01]],
    induction: [[0.001, 0.002], [0.05, 0.04]],
  },
  // L1 has a sliding window: its chance differs from L0's
  chance: {
    previous_token: [[0.2, 0.2], [0.25, 0.25]],
    duplicate_token: [[0.1, 0.1], [0.1, 0.1]],
    induction: [[0.1, 0.1], [0.1000000004, 0.1]],
  },
  labels: [[[], ["previous_token"]], [["induction"], ["induction", "previous_token"]]],
  threshold: 0.4,
  margin: 0.1,
};

test("the body names the model (null: the default), the seed and the sequences", () => {
  assert.deepEqual(probeBody({ model: "", seed: 0 }), { model: null, seed: 0, sequences: 8 });
  assert.deepEqual(probeBody({ model: "m", seed: 7, sequences: 2 }), { model: "m", seed: 7, sequences: 2 });
});

test("a seed is a whole number within 0..2^32 - 1", () => {
  assert.equal(parseSeed(" 42 "), 42);
  assert.equal(parseSeed(String(2 ** 32 - 1)), 2 ** 32 - 1);
  for (const bad of [String(2 ** 32), "-1", "1.5", "", "x", null]) assert.equal(parseSeed(bad), null, bad);
});

test("the axes are the three scores, then the statistics of the probe's shape", () => {
  const stats = { entropy: [[1, 2], [3, 4]], induction: [[0, 0], [0, 0]], odd: [[1]] };
  const axes = axesOf(result, stats, (key) => key.toUpperCase());
  assert.deepEqual(axes.map(({ key }) => key), ["previous_token", "duplicate_token", "induction", "entropy"]);
  assert.equal(axes[3].name, "ENTROPY (this text)");
});

test("one trace a layer; a head with an absent value on an axis is left out", () => {
  const [x, y] = [axesOf(result)[1], axesOf(result)[2]]; // duplicate against induction
  const traces = scatterTraces(result, x, y, (layer) => `c${layer}`);
  assert.deepEqual(traces.map((t) => t.name), ["L0", "L1"]);
  assert.deepEqual(traces[0].customdata, [[0, 1]]); // L0 H0 has no duplicate-token score
  assert.deepEqual(traces[1].x, [0.3, 0.1]);
  assert.deepEqual(traces[1].y, [0.8, 0.6]);
  assert.equal(traces[1].marker.color, "c1");
  assert.equal(hoverText(result, 0, 0), "L0 H0<br>previous-token score 0.100<br>duplicate-token score –<br>induction score 0.010");
});

test("the chips rank only the heads the probe labels, highest score first", () => {
  assert.deepEqual(rankHeads(result, "induction", 5), [[1, 0, 0.8], [1, 1, 0.6]]);
  assert.deepEqual(rankHeads(result, "previous_token", 1), [[0, 1, 0.9]]);
  assert.deepEqual(rankHeads(result, "duplicate_token", 5), []); // L1 H0's 0.3 is no label
});

test("chance levels: each distinct one (within float32's rounding), said as one value or a range", () => {
  assert.deepEqual(chanceLevels(result, "previous_token"), [0.2, 0.25]);
  assert.deepEqual(chanceLevels(result, "induction"), [0.1]);
  assert.equal(chanceText(result, "previous_token"), "0.200 to 0.250");
  assert.equal(chanceText(result, "duplicate_token"), "0.100");
});

test("the CSV has a row a head, absent values empty, and a file name safe for any model", () => {
  const lines = probeCsv(result).trimEnd().split("\n");
  assert.match(lines[0], /^# org\/tiny model, seed 3, 2 sequences/);
  const header = "layer,head,previous_token,previous_token_spread,previous_token_chance,duplicate_token,duplicate_token_spread,duplicate_token_chance,induction,induction_spread,induction_chance,labels";
  assert.equal(lines[1], header);
  assert.equal(lines[2], "0,0,0.1,0.01,0.2,,,0.1,0.01,0.001,0.1,");
  assert.equal(lines[5], "1,1,0.2,0.03,0.25,0.1,0.01,0.1,0.6,0.04,0.1,induction previous_token");
  assert.equal(lines.length, 2 + result.layers * result.heads);
  assert.equal(probeFileName(result, "csv"), "probe-org_tiny_model-seed3-2x5.csv");
});

test("the probe is in the URL: probe=heads&seed=0, read back; bad values are ignored and said", () => {
  const state = { ...readState(""), probe: "heads", seed: 0 };
  const search = encodeState(state);
  assert.match(search, /probe=heads&seed=0$/);
  assert.deepEqual([readState(search).probe, readState(search).seed, readState(search).sequences], ["heads", 0, 8]);
  const again = readState(encodeState({ ...state, seed: 12, sequences: 3 }));
  assert.deepEqual([again.seed, again.sequences], [12, 3]);
  assert.equal(encodeState(readState("")).includes("probe"), false); // closed: not in the link
  const bad = "?probe=x&seed=-1&sequences=33";
  assert.deepEqual([readState(bad).probe, readState(bad).seed, readState(bad).sequences], ["", 0, 8]);
  assert.deepEqual(ignoredParams(bad).map(({ name }) => name), ["probe", "seed", "sequences"]);
});

test("the probe's input: its query runs the probe's first sequence, its body is that alone, the URL keeps it", async () => {
  const { probeInputText, probeQuery } = await import("../../app/static/js/probe-input.js");
  const { body, kindBody } = await import("../../app/static/js/api.js");
  const typed = { text: "My text.", pair: "Its pair.", model: "m", words: true, weighting: "norm", newTokens: 3, chat: true };
  const query = probeQuery(typed, { seed: 7 });
  assert.deepEqual(query.probe, { seed: 7, length: 50 });
  // Every text option off: the API refuses them beside a probe.
  assert.deepEqual(body(query), { model: "m", probe: { seed: 7, length: 50 } });
  assert.deepEqual(kindBody({ ...query, kind: "decoder" }), { model: "m", probe: { seed: 7, length: 50 }, kind: "decoder" });
  assert.deepEqual(body(probeQuery({ ...typed, model: "" }, { seed: 0 })), { model: null, probe: { seed: 0, length: 50 } });
  assert.match(probeInputText(query.probe), /50 random tokens \(seed 7\)/);

  // input=probe with its seed, read back; a bad value is the text's (and said as ignored).
  const state = { ...readState(""), text: "My text.", input: "probe", seed: 7 };
  const search = encodeState(state);
  assert.match(search, /input=probe/);
  assert.match(search, /seed=7/);
  assert.equal(readState(`?${search}`).input, "probe");
  assert.equal(readState(`?${search}`).seed, 7);
  assert.equal(readState(`?${search}`).text, "My text.");
  assert.equal(readState("?input=texts").input, "");
  assert.deepEqual(ignoredParams("?input=texts"), [{ name: "input", value: "texts" }]);
  assert.doesNotMatch(encodeState(readState("?text=a")), /input=/);
});
