// The other pure helpers of app/static/js/: labels, statistics formatting and colour scales, heatmap ticks and
// escaping, thumbnail painting, API error details. Run: node --test tests/js/

import assert from "node:assert/strict";
import { test } from "node:test";

import { AGGREGATES, isAggregate } from "../../app/static/js/aggregates.js";
import { describeDetail, flatRows } from "../../app/static/js/api.js";
import { LUT, STOPS, statColor } from "../../app/static/js/colors.js";
import { paintThumbnail } from "../../app/static/js/grid.js";
import { plotSize } from "../../app/static/js/heatmap-figure.js";
import { plotlyText, thinTicks, tickFont } from "../../app/static/js/heatmap.js";
import { CHANGE, colorScaleFor, formatStat, statTable } from "../../app/static/js/insight.js";
import { exportName, modelLabel, selectionLabel, tokenLinesName } from "../../app/static/js/labels.js";
import { rolloutMix } from "../../app/static/js/rollout.js";
import { lineThreshold } from "../../app/static/js/tokens.js";

test("aggregates are the page's own names only", () => {
  assert.equal(isAggregate("mean"), true);
  for (const name of ["__proto__", "constructor", "toString", "0", 0, null, undefined]) assert.equal(isAggregate(name), false);
  const attention = { meanInto: (layer, out) => ({ layer, out }) };
  assert.deepEqual(AGGREGATES.mean.compute(attention, 2, "buf"), { layer: 2, out: "buf" });
});

test("labels: models, selections, export names", () => {
  assert.equal(modelLabel({ name: "bert", layers: 6, heads: 12, causal: false }), "bert — 6 layers × 12 heads");
  assert.equal(modelLabel({ name: "gpt", layers: 2, heads: 4, causal: true }), "gpt — 2 layers × 4 heads (causal)");
  assert.equal(modelLabel({ name: "lazy", layers: null }), "lazy — loads on first use");
  assert.equal(selectionLabel(2, 5), "layer 2, head 5");
  assert.equal(selectionLabel(0, "mean"), "layer 0, mean of all heads");
  assert.equal(exportName("all-MiniLM-L6-v2", 3, 1), "headscope-all-MiniLM-L6-v2-L3-H1");
  assert.equal(exportName("../x/ y:z", 0, "mean"), "headscope-.._x_y_z-L0-mean"); // never a path
  // The token lines name what they hold: one head, or every head of the layer overlaid.
  assert.equal(tokenLinesName("m", 2, 5), "headscope-m-L2-H5-tokens.svg");
  assert.equal(tokenLinesName("m", 2, 5, { allHeads: true }), "headscope-m-L2-all-heads-tokens.svg");
  assert.equal(exportName(undefined, 1, 0), "headscope-model-L1-H0");
});

test("statistics show 3 decimals (distance 2) and a dash when missing", () => {
  assert.equal(formatStat("entropy", 1.23456), "1.235");
  assert.equal(formatStat("distance", 1.23456), "1.23");
  assert.equal(formatStat("previous", Number.NaN), "–");
  assert.equal(formatStat("previous", null), "–");
});

test("the change score joins the statistics only in compare mode", () => {
  const analysis = { stats: { entropy: [[1, 2]] } };
  assert.deepEqual(Object.keys(statTable(analysis, null)), ["entropy"]);
  const withChange = statTable(analysis, { score: [[0.1, 0.2]] });
  assert.deepEqual(withChange[CHANGE], [[0.1, 0.2]]);
  assert.deepEqual(Object.keys(analysis.stats), ["entropy"]); // the answer itself is left alone
});

test("frame colours span the table's own range, skipping missing values", () => {
  const scale = colorScaleFor([[0.2, Number.NaN], [0.6, 0.4]]);
  assert.deepEqual([scale.lo, scale.hi], [0.2, 0.6]);
  assert.equal(scale.color(0.2), statColor(0));
  assert.equal(scale.color(0.6), statColor(1));
  assert.equal(colorScaleFor([[0.5, 0.5]]).color(0.5), statColor(0.5)); // a constant table: the middle
  assert.deepEqual([colorScaleFor([[Number.NaN]]).lo, colorScaleFor([[Number.NaN]]).hi], [0, 0]);
  assert.equal(statColor(-1), "rgb(68, 1, 84)"); // clamped to the first stop
  assert.equal(statColor(2), "rgb(253, 231, 37)");
  assert.equal(statColor(Number.NaN), statColor(0));
});

test("the thumbnail LUT runs from the scale's first stop to its last", () => {
  const rgb = (k) => Array.from(LUT.slice(4 * k, 4 * k + 4));
  assert.deepEqual(rgb(0), [255, 255, 255, 255]);
  assert.deepEqual(rgb(255), [8, 29, 88, 255]);
  assert.equal(STOPS.at(-1)[1], "#081d58");
});

test("Plotly labels: markup becomes literal text", () => {
  assert.equal(plotlyText("<b>&amp;</b>"), "&lt;b&gt;&amp;amp;&lt;/b&gt;");
  assert.equal(plotlyText(42), "42");
});

test("ticks never crowd: at most 64 per axis, never closer than 10 px (a 9 px font and 1 px of air)", () => {
  assert.deepEqual(thinTicks(0, 9, 32), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
  assert.deepEqual(thinTicks(0, 9, 7), [0, 2, 4, 6, 8]); // 7 px cells: every second label
  assert.deepEqual(thinTicks(0, 63, 10), [...Array(64).keys()]); // 64 tokens at 10 px: every one
  const many = thinTicks(0, 511, 4);
  assert.ok(many.length <= 64 && many[0] === 0);
  const step = many[1] - many[0];
  assert.ok(step * 4 >= 10 && many.every((t, k) => t === k * step));
  assert.deepEqual(thinTicks(3.2, 6.8, 32), [4, 5, 6]); // a zoomed range: only the visible cells
});

test("the label font is as large as the tick spacing allows, 9 to 12 px", () => {
  assert.equal(tickFont(10), 9);
  assert.equal(tickFont(12.4), 11);
  assert.equal(tickFont(40), 12);
  assert.equal(tickFont(4), 9); // never below the legible minimum: thinTicks spaces such labels out
});

test("plot size: every token labelled up to 64, else fits the room up to 640 px", () => {
  assert.equal(plotSize(10, 900), 360); // small inputs keep a readable minimum
  assert.equal(plotSize(100, 900), 640);
  assert.equal(plotSize(100, 500), 500);
  assert.equal(plotSize(512, 900), 640); // fits: labels thin, zooming brings them back
  assert.equal(plotSize(30, 900, 200), 640); // capped by 32 px a cell: 960, by the fit: 640
  assert.equal(plotSize(64, 300), 640); // 10 px a label: larger than the room, which scrolls
  assert.equal(plotSize(29, 300), 300); // 29 x 10 = 290 fits in the room
  assert.equal(plotSize(64, 210, 360, true), 210); // a phone: fits the screen, labels thin
  assert.equal(plotSize(64, 40, 360, true), 160); // never smaller than 160 px
});

function image(S) {
  return { width: S, height: S, data: new Uint8ClampedArray(4 * S * S) };
}
const pixel = (img, x, y) => Array.from(img.data.slice(4 * (y * img.width + x), 4 * (y * img.width + x) + 3));
const lut = (k) => Array.from(LUT.slice(4 * k, 4 * k + 3));

test("thumbnails: a small matrix repeats cells, a large one keeps each block's maximum", () => {
  const small = image(4);
  paintThumbnail(small, Float32Array.from([1, 0, 0, 1]), 2, false); // 2 x 2 -> 4 x 4
  assert.deepEqual(pixel(small, 0, 0), lut(255));
  assert.deepEqual(pixel(small, 1, 1), lut(255));
  assert.deepEqual(pixel(small, 3, 0), lut(0));
  const big = image(2);
  const m = new Float32Array(16); // 4 x 4 -> 2 x 2: one peak of 0.5 in the top-right block
  m[0 * 4 + 3] = 0.5;
  paintThumbnail(big, m, 4, false);
  assert.deepEqual(pixel(big, 1, 0), lut(128));
  assert.deepEqual(pixel(big, 0, 0), lut(0));
});

test("thumbnails of a causal model hatch the masked corner grey, not white", () => {
  const img = image(4);
  paintThumbnail(img, new Float32Array(16), 4, true);
  for (const [x, y] of [[1, 0], [3, 0], [3, 2]]) {
    const [r, g, b] = pixel(img, x, y);
    assert.ok(r === g && g === b && r < 245, `(${x}, ${y}) is ${[r, g, b]}`);
  }
  assert.deepEqual(pixel(img, 0, 3), lut(0)); // below the diagonal: attention 0 is white
});

test("token lines are pruned harder for long inputs", () => {
  assert.deepEqual([lineThreshold(10), lineThreshold(64), lineThreshold(65), lineThreshold(192), lineThreshold(512)], [0.01, 0.01, 0.03, 0.03, 0.06]);
});

test("API errors read as a person's sentence", () => {
  assert.equal(describeDetail("text is blank"), "text is blank");
  const validation = [
    { loc: ["body", "text"], msg: "Field required" },
    { loc: ["body", "layer"], msg: "Input should be greater than or equal to 0" },
    { msg: "no location" },
  ];
  assert.equal(describeDetail(validation), "text: Field required; layer: Input should be greater than or equal to 0; no location");
  assert.equal(describeDetail(undefined), "");
  assert.equal(describeDetail({ odd: 1 }), '{"odd":1}');
});

test("JSON matrices become n*n row-major values, the decoded heads' shape, numbers unchanged", () => {
  const rows = [
    [0.123457, 0.876543],
    [null, 1],
  ];
  const flat = flatRows(rows);
  assert.ok(flat instanceof Float64Array);
  assert.equal(flat.length, 4);
  assert.deepEqual(Array.from(flat.subarray(0, 2)), rows[0]); // the JSON's 6-decimal numbers, exactly
  assert.ok(Number.isNaN(flat[2])); // a missing value stays missing (drawn as a gap), never 0
  assert.equal(flat[3], 1);
  assert.equal(flatRows([]).length, 0);
});

test("the rollout caption states the residual weight the server sent", () => {
  assert.equal(rolloutMix(0.5), "0.5·A + 0.5·I per layer");
  assert.equal(rolloutMix(0.3), "0.7·A + 0.3·I per layer"); // not 0.7000000000000001
  assert.equal(rolloutMix(0), "1·A + 0·I per layer");
  assert.equal(rolloutMix(undefined), "the residual stream mixed into each layer");
});
