// The long-input detail's figure (app/static/js/long-figure.js): token coordinates, axis titles, the badge,
// hover words and the causal mask of a window. Run: node --test tests/js/

import assert from "node:assert/strict";
import { test } from "node:test";

import {
  MAX_CELLS,
  axisTitle,
  badgeText,
  blockLabels,
  buildLongFigure,
  describeWindow,
  drawnEdges,
  isExact,
  tokenSpan,
  visibleSpan,
} from "../../app/static/js/long-figure.js";

test("token spans are written with thousands separators, the last token inclusive", () => {
  assert.equal(tokenSpan(1024, 2048), "1,024–2,047");
  assert.equal(tokenSpan(7, 8), "7");
  assert.equal(MAX_CELLS, 512);
});

test("an axis is exact when every block is one token", () => {
  assert.equal(isExact([10, 11, 12, 13]), true);
  assert.equal(isExact([0, 2, 4, 5]), false);
});

test("a visible range becomes the integer tokens that cover it, clamped to [0, n)", () => {
  assert.deepEqual(visibleSpan([1000.4, 1149.2], 3000), [1000, 1150]);
  assert.deepEqual(visibleSpan([1150, 1000], 3000), [1000, 1150]); // a reversed (query) axis
  assert.deepEqual(visibleSpan([-40, 3100], 3000), [0, 3000]);
  assert.deepEqual(visibleSpan([3200, 3300], 3000), [2999, 3000]); // panned past the end: still one token
  assert.deepEqual(visibleSpan([5.2, 5.7], 3000), [5, 6]);
});

test("blocks of one size are drawn at their edges, blocks a token apart evenly, within a token of them", () => {
  assert.deepEqual(drawnEdges([10, 13, 16, 19]), [10, 13, 16, 19]);
  const edges = [0, 2, 4, 7]; // 7 tokens in 3 blocks: floor(c * 7 / 3)
  const drawn = drawnEdges(edges);
  assert.deepEqual(drawn, [0, 7 / 3, 14 / 3, 7]);
  drawn.forEach((x, c) => assert.ok(x >= edges[c] && x < edges[c] + 1));
});

test("axis titles say pooled until one cell is one token", () => {
  assert.equal(axisTitle("Key", [1024, 1032, 1040, 2048], 8, "max"), "Key tokens 1,024–2,047, pooled ×8 (max)");
  assert.equal(axisTitle("Query", [5, 6, 7], 1, "max"), "Query tokens 5–6");
});

test("the badge names both factors, or says exact", () => {
  assert.equal(badgeText({ exact: false, factor: [8, 6], reduce: "mean" }), "pooled ×8 × 6 (mean)");
  assert.equal(badgeText({ exact: true, factor: [1, 1], reduce: "max" }), "exact: 1 cell = 1 token");
});

test("hover words: a token where a block is one, a span where pooled, escaped for Plotly", () => {
  assert.deepEqual(blockLabels([2, 3, 5], ["a", "b", "<c>", "d", "e", "f"], "query", "queries"), [
    "query '&lt;c&gt;' (2)",
    "queries 3–4",
  ]);
});

const TOKENS = ["<s>", "Ġthe", "Ġcat", "Ġsat", "Ġon", "Ġthe"];

test("an exact window: edges as x and y, token ticks, 6-decimal hover, masked cells are gaps", () => {
  const win = {
    values: [
      [0.5, 0.0, 0.0],
      [0.25, 0.75, 0.0],
    ],
    row_edges: [3, 4, 5],
    col_edges: [2, 3, 4, 5],
    exact: true,
    reduce: "max",
    factor: [1, 1],
  };
  const range = { x: [2, 5], y: [5, 3] };
  const spec = { tokens: TOKENS, byteLevel: true, causal: true, size: 600, title: "layer 1, head 2", range };
  const { data, layout } = buildLongFigure(win, spec);
  const [heatmap] = data;
  assert.deepEqual(heatmap.x, [2, 3, 4, 5]);
  assert.deepEqual(heatmap.y, [3, 4, 5]);
  // Query 3 cannot see key 4; query 4 sees keys 2..4.
  assert.deepEqual(heatmap.z, [
    [0.5, 0.0, null],
    [0.25, 0.75, 0.0],
  ]);
  assert.equal(heatmap.text[0][1], "query '␣sat' (3) → key '␣sat' (3)");
  assert.equal(heatmap.text[0][2], "");
  assert.equal(heatmap.hovertemplate, "%{text}: %{z:.6f}<extra></extra>");
  assert.deepEqual(layout.xaxis.tickvals, [2.5, 3.5, 4.5]);
  assert.deepEqual(layout.xaxis.ticktext, ["␣cat", "␣sat", "␣on"]);
  assert.deepEqual(layout.yaxis.range, [5, 3]); // the view kept, queries down
  assert.equal(layout.xaxis.title.text, "Key tokens 2–4");
  assert.equal(layout.plot_bgcolor, "#ececec"); // a masked gap reads as the normal detail's mask
  assert.equal(describeWindow(win, "layer 1, head 2"), "layer 1, head 2: queries 3–4, keys 2–4; 2 × 3 cells, exact: 1 cell = 1 token.");
});

test("a pooled window: numeric ticks, pooled titles and hover, the whole head by default", () => {
  const win = {
    values: [
      [0.9, 0.1],
      [0.4, 0.6],
    ],
    row_edges: [0, 3, 6],
    col_edges: [0, 3, 6],
    exact: false,
    reduce: "max",
    factor: [3, 3],
  };
  const { data, layout } = buildLongFigure(win, { tokens: TOKENS, byteLevel: true, causal: false, size: 600, title: "t" });
  assert.deepEqual(data[0].x, [0, 3, 6]);
  assert.equal(data[0].text[1][0], "queries 3–5 → keys 0–2");
  assert.equal(data[0].hovertemplate, "%{text}: max %{z:.4f}<extra></extra>");
  assert.deepEqual(data[0].z, win.values); // not causal: nothing masked
  assert.equal(layout.xaxis.tickmode, "auto");
  assert.equal(layout.yaxis.title.text, "Query tokens 0–5, pooled ×3 (max)");
  assert.deepEqual(layout.xaxis.range, [0, 6]);
  assert.deepEqual(layout.yaxis.range, [6, 0]);
});
