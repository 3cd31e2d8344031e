// The Corpus view's pure parts (app/static/js/corpus-model.js): URL state, means, keys, the distribution
// figure and the link to the normal view. Run: node --test tests/js/

import assert from "node:assert/strict";
import { test } from "node:test";

import {
  ALL_POINTS_MAX,
  DEFAULT_CORPUS,
  clampCorpus,
  corpusKey,
  distributionFigure,
  encodeCorpusState,
  exampleWords,
  headRow,
  headSummary,
  linkReason,
  meanGrid,
  pointLine,
  pointsHint,
  pointText,
  readCorpusState,
  roleShares,
  runLabel,
  textLink,
} from "../../app/static/js/corpus-model.js";
import { readState } from "../../app/static/js/state.js";

// per_head.parquet of 2 layers x 2 heads as the API gives it: columns, ordered by layer then head.
const PER_HEAD = {
  layer: [0, 0, 1, 1],
  head: [0, 1, 0, 1],
  count: [10, 10, 10, 10],
  entropy_mean: [0.5, 1.25, 2.0, 0.75],
  entropy_std: [0.1, 0.2, 0.3, 0.4],
  entropy_p05: [0.2, 0.9, 1.5, 0.1],
  entropy_p50: [0.5, 1.2, 2.0, 0.7],
  entropy_p95: [0.8, 1.6, 2.5, 1.4],
};
const RUN = { name: "wiki", model: "all-MiniLM-L6-v2", kind: "self", words: false, served: true, counts: { texts: 2000 } };

test("the view's URL round-trips, and bad values fall back to the defaults", () => {
  const state = { run: "mini wiki/2", stat: "entropy_norm", layer: 2, head: 11, plot: "violin", all: true };
  assert.deepEqual(readCorpusState(`?${encodeCorpusState(state)}`), state);
  assert.equal(encodeCorpusState({ ...DEFAULT_CORPUS, run: "a" }), "run=a&stat=entropy&layer=0&head=0");
  const bad = readCorpusState("?stat=DROP%20TABLE&layer=-1&head=x&plot=pie&all=yes");
  assert.deepEqual(bad, { ...DEFAULT_CORPUS });
});

test("a selection is clamped to the run's model, and an unmeasured statistic becomes its first", () => {
  const stats = ["entropy", "max"];
  const state = { ...DEFAULT_CORPUS, layer: 9, head: 30, stat: "nope" };
  assert.deepEqual(clampCorpus(state, { layers: 6, heads: 12, stats }), { ...state, layer: 5, head: 11, stat: "entropy" });
  assert.equal(clampCorpus({ ...state, stat: "max" }, { layers: 6, heads: 12, stats }).stat, "max");
});

test("the grid's means come from per_head's <stat>_mean, by layer and head whatever the row order", () => {
  assert.deepEqual(meanGrid(PER_HEAD, "entropy", 2, 2), [[0.5, 1.25], [2.0, 0.75]]);
  const shuffled = Object.fromEntries(Object.entries(PER_HEAD).map(([k, v]) => [k, [...v].reverse()]));
  assert.deepEqual(meanGrid(shuffled, "entropy", 2, 2), [[0.5, 1.25], [2.0, 0.75]]);
  assert.deepEqual(meanGrid(PER_HEAD, "max", 2, 2), [[null, null], [null, null]]);
});

test("a head's summary reads its mean, spread and percentiles from its per_head row", () => {
  const row = headRow(PER_HEAD, 1, 0);
  assert.equal(row.entropy_mean, 2.0);
  assert.equal(headRow(PER_HEAD, 3, 0), null);
  assert.equal(headSummary(row, "entropy"), "mean 2.000 · std 0.300 · median 2.000 · 5th–95th percentile 1.500–2.500 · 10 texts");
});

test("a detection score's summary counts the texts that have it, beside all of them", () => {
  const row = { count: 2000, induction_mean: 0.5, induction_std: 0.1, induction_p05: 0.3, induction_p50: 0.5, induction_p95: 0.7, induction_count: 1620 };
  assert.match(headSummary(row, "induction"), / · 1,620 of 2,000 texts$/);
});

test("grid keys step, jump and stop at the edges, with no aggregate columns", () => {
  const size = { layers: 3, heads: 4 };
  const at = { layer: 1, head: 1 };
  assert.deepEqual(corpusKey(at, "ArrowRight", false, size), { layer: 1, head: 2 });
  assert.deepEqual(corpusKey({ layer: 0, head: 0 }, "ArrowUp", false, size), { layer: 0, head: 0 });
  assert.deepEqual(corpusKey({ layer: 2, head: 3 }, "ArrowRight", false, size), { layer: 2, head: 3 });
  assert.deepEqual(corpusKey(at, "End", false, size), { layer: 1, head: 3 });
  assert.deepEqual(corpusKey(at, "End", true, size), { layer: 2, head: 3 });
  assert.deepEqual(corpusKey(at, "Home", true, size), { layer: 0, head: 0 });
  assert.deepEqual(corpusKey(at, "PageDown", false, size), { layer: 2, head: 1 });
  assert.equal(corpusKey(at, "ArrowLeft", true, size), null);
  assert.equal(corpusKey(at, "a", false, size), null);
});

test("the distribution holds the values unchanged, every point up to ALL_POINTS_MAX texts", () => {
  const values = [0.1, 0.7, 0.3];
  const { data, layout } = distributionFigure(
    [{ layer: 2, head: 3, values, ids: ["a", "b", "c"], lines: [1, 4, 5] }],
    { stat: "previous" },
  );
  assert.equal(data.length, 1);
  assert.equal(data[0].type, "box");
  assert.equal(data[0].y, values);
  assert.equal(data[0].boxpoints, "all");
  assert.deepEqual(data[0].text, ["text a", "text b", "text c"]);
  assert.deepEqual(data[0].customdata, [1, 4, 5]); // each point's line: what a click opens
  assert.equal(layout.yaxis.title.text, "Attention to previous token (share)");
  const many = Array(ALL_POINTS_MAX + 1).fill(0.5);
  const ids = many.map((_, i) => String(i));
  const violins = distributionFigure(
    [{ layer: 0, head: 0, values: many, ids }, { layer: 0, head: 1, values: many, ids }],
    { stat: "entropy", plot: "violin" },
  );
  assert.deepEqual(violins.data.map((t) => [t.type, t.name, t.points]), [["violin", "L0 H0", "outliers"], ["violin", "L0 H1", "outliers"]]);
  assert.equal(violins.layout.xaxis.showticklabels, true);
});

test("a point is its text: found by trace and index, never the box's or violin's own statistics", () => {
  const series = [
    { layer: 1, head: 0, values: [0.25, 0.5], ids: ["a", "b"], lines: [3, 9] },
    { layer: 1, head: 1, values: [0.75, null], ids: ["a", "b"], lines: [3, 9] },
  ];
  assert.deepEqual(pointText(series, { curveNumber: 1, pointNumber: 0, y: 0.75 }), {
    layer: 1, head: 1, line: 3, id: "a", value: 0.75,
  });
  assert.equal(pointText(series, { curveNumber: 0, pointNumber: 1, y: 0.375, hoverOnBox: true }), null);
  assert.equal(pointText(series, { curveNumber: 0, pointNumber: 1, y: 0.375 }), null); // a violin's kde
  assert.equal(pointText(series, { curveNumber: 2, pointNumber: 0, y: 0.25 }), null);
  assert.equal(pointText(series, { curveNumber: 0 }), null);
  assert.equal(pointText(series, undefined), null);

  const found = pointText(series, { curveNumber: 0, pointNumber: 1, y: 0.5 });
  assert.equal(pointLine(found, "previous", null), "text b (line 9) · L1 H0 · 0.500");
  const long = { text: "word ".repeat(60), text_pair: null };
  const line = pointLine(found, "previous", long);
  assert.ok(line.startsWith("text b (line 9) · L1 H0 · 0.500 · “word word") && line.endsWith("…”"));
  assert.ok(line.length < 200);
  assert.ok(pointLine(found, "previous", { text: "a", text_pair: "b" }).endsWith("“a ‖ b”"));

  assert.match(pointsHint(series, ""), /^Each point is a text: .*click it to open it/);
  assert.doesNotMatch(pointsHint(series, "not served"), /click/);
  const big = [{ ...series[0], values: Array(ALL_POINTS_MAX + 1).fill(0) }];
  assert.match(pointsHint(big, ""), /^Points are the outliers of 2,001 texts/);
});

test("an example opens the normal view of its text and pair with the head open, in the page's own URL form", () => {
  const example = { text: "The cat sat.", text_pair: "It was tired.", id: "t3", line: 3, value: 0.9 };
  const link = textLink(RUN, example, 2, 7);
  assert.ok(link.startsWith("./?"));
  const state = readState(link.slice(2));
  assert.deepEqual(
    [state.text, state.pair, state.model, state.layer, state.head, state.words, state.kind],
    ["The cat sat.", "It was tired.", "all-MiniLM-L6-v2", 2, 7, false, "cross"],
  );
  // A words run opens in words mode; an encoder-decoder's run on its encoder's attention.
  const words = readState(textLink({ ...RUN, words: true, kind: "encoder" }, { ...example, text_pair: null }, 0, 0).slice(2));
  assert.deepEqual([words.words, words.kind, words.pair], [true, "encoder", ""]);
  // A --weighting norm run opens under weight × value norm; a run of weights (or from before) under weights.
  assert.equal(readState(textLink({ ...RUN, weighting: "norm" }, example, 0, 0).slice(2)).weighting, "norm");
  assert.equal(state.weighting, "weight");
  assert.ok(!textLink(RUN, example, 2, 7).includes("weighting"));
});

test("an example shows its snippet and its pair's, with an ellipsis where the run cut them short", () => {
  const example = { snippet: "The cat sat.", snippet_pair: null, cut: false, id: "t3", line: 3, value: 0.9 };
  assert.equal(exampleWords(example), "The cat sat.");
  assert.equal(exampleWords({ ...example, snippet_pair: "It was tired." }), "The cat sat. ‖ It was tired.");
  assert.equal(exampleWords({ ...example, snippet: "a".repeat(300), cut: true }), `${"a".repeat(300)}…`);
});

test("a run whose model is not served says why its texts do not open", () => {
  assert.equal(linkReason(RUN), "");
  const reason = linkReason({ ...RUN, served: false, model: "gpt-x" });
  assert.match(reason, /“gpt-x” is not served here/);
  assert.match(reason, /HEADSCOPE_MODELS/);
  assert.equal(runLabel(RUN), "wiki · all-MiniLM-L6-v2 · 2,000 texts");
  assert.equal(runLabel({ ...RUN, served: false }), "wiki · all-MiniLM-L6-v2 · 2,000 texts (model not served here)");
});

test("a head's roles across the texts read from its label counts, most frequent first", () => {
  const row = { count: 8, label_previous_token: 5, label_mixed: 2, label_broad: 1, label_self: 0, label_new_role: 0 };
  assert.equal(roleShares(row), "previous-token 63% · mixed 25% · broad 13%");
  assert.equal(roleShares({ count: 2, label_first_token_sink: 1, label_some_new: 1 }), "first-token-sink 50% · some-new 50%");
  assert.equal(roleShares(null), "");
});
