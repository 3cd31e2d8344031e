// app/static/js/keys.js: where a key leads in the head grid, the heatmap's cell cursor and the tabs, and what the
// cursor reads out. Run: node --test tests/js/

import assert from "node:assert/strict";
import { test } from "node:test";

import { cellKey, cellText, gridKey, tabKey } from "../../app/static/js/keys.js";

const MODEL = { layers: 6, heads: 12 }; // the aggregate column "mean" comes after head 11

test("grid: arrows step, the aggregate column is part of the row, edges hold", () => {
  assert.deepEqual(gridKey({ layer: 2, head: 5 }, "ArrowRight", false, MODEL), { layer: 2, head: 6 });
  assert.deepEqual(gridKey({ layer: 2, head: 11 }, "ArrowRight", false, MODEL), { layer: 2, head: "mean" });
  assert.deepEqual(gridKey({ layer: 2, head: "mean" }, "ArrowRight", false, MODEL), { layer: 2, head: "mean" });
  assert.deepEqual(gridKey({ layer: 2, head: "mean" }, "ArrowLeft", false, MODEL), { layer: 2, head: 11 });
  assert.deepEqual(gridKey({ layer: 0, head: 3 }, "ArrowUp", false, MODEL), { layer: 0, head: 3 });
  assert.deepEqual(gridKey({ layer: 5, head: "mean" }, "ArrowDown", false, MODEL), { layer: 5, head: "mean" });
});

test("grid: Home/End, Ctrl+Home/End and PageUp/PageDown", () => {
  const at = { layer: 3, head: 7 };
  assert.deepEqual(gridKey(at, "Home", false, MODEL), { layer: 3, head: 0 });
  assert.deepEqual(gridKey(at, "End", false, MODEL), { layer: 3, head: "mean" });
  assert.deepEqual(gridKey(at, "Home", true, MODEL), { layer: 0, head: 0 });
  assert.deepEqual(gridKey(at, "End", true, MODEL), { layer: 5, head: "mean" });
  assert.deepEqual(gridKey(at, "PageUp", false, MODEL), { layer: 0, head: 7 });
  assert.deepEqual(gridKey(at, "PageDown", false, MODEL), { layer: 5, head: 7 });
  // Other keys are left to the page (Tab, letters), and Ctrl+arrow to the browser.
  assert.equal(gridKey(at, "Tab", false, MODEL), null);
  assert.equal(gridKey(at, "a", false, MODEL), null);
  assert.equal(gridKey(at, "ArrowRight", true, MODEL), null);
});

test("cell cursor: arrows step and stop at the edges; Home/End in the row, Ctrl the corners, PageUp/Down the column", () => {
  const n = 5;
  // from (i j), key (^ = with Ctrl), to (i j)
  const cases = `
    2 2 ArrowUp 1 2 | 2 2 ArrowDown 3 2 | 2 2 ArrowLeft 2 1 | 2 2 ArrowRight 2 3
    0 0 ArrowUp 0 0 | 4 4 ArrowRight 4 4 | 4 4 ArrowDown 4 4 | 0 0 ArrowLeft 0 0
    2 3 Home 2 0 | 2 1 End 2 4 | 2 3 ^Home 0 0 | 2 3 ^End 4 4 | 2 3 PageUp 0 3 | 2 3 PageDown 4 3`;
  for (const row of cases.split(/[|\n]/).filter((c) => c.trim())) {
    const [i, j, key, ti, tj] = row.trim().split(/\s+/);
    const ctrl = key.startsWith("^");
    const got = cellKey({ i: Number(i), j: Number(j) }, key.replace("^", ""), ctrl, n);
    assert.deepEqual(got, { i: Number(ti), j: Number(tj) }, row);
  }
  assert.equal(cellKey({ i: 2, j: 3 }, "Escape", false, n), null);
  assert.equal(cellKey({ i: 0, j: 0 }, "ArrowDown", false, 0), null); // nothing drawn
});

test("tabs: Left/Right wrap round, Home/End go to the ends", () => {
  assert.equal(tabKey(0, "ArrowRight", 2), 1);
  assert.equal(tabKey(1, "ArrowRight", 2), 0);
  assert.equal(tabKey(0, "ArrowLeft", 2), 1);
  assert.equal(tabKey(1, "Home", 2), 0);
  assert.equal(tabKey(0, "End", 2), 1);
  assert.equal(tabKey(0, "ArrowDown", 2), null);
  assert.equal(tabKey(0, "Enter", 2), null);
});

test("cell text: the hover's words, the value at its 3 decimals, masked and hidden cells said so", () => {
  const tokens = ["[CLS]", "the", "cat", "␣sat"];
  assert.equal(cellText({ tokens, i: 2, j: 1, value: 0.7349 }), "query 'cat' (2) → key 'the' (1): 0.735");
  assert.equal(cellText({ tokens, i: 3, j: 3, value: 1 }), "query '␣sat' (3) → key '␣sat' (3): 1.000");
  assert.equal(
    cellText({ tokens, i: 1, j: 2, value: null, causal: true }),
    "query 'the' (1) → key 'cat' (2): masked (a causal model cannot look ahead)",
  );
  // On the diagonal a causal model's cell is a value, not masked.
  assert.equal(cellText({ tokens, i: 2, j: 2, value: 0.25, causal: true }), "query 'cat' (2) → key 'cat' (2): 0.250");
  assert.equal(
    cellText({ tokens, i: 2, j: 0, value: null, renormalised: true }),
    "query 'cat' (2) → key '[CLS]' (0): hidden (first token set aside, rows renormalised)",
  );
  assert.equal(
    cellText({ tokens, i: 2, j: 1, value: 0.5, renormalised: true }),
    "query 'cat' (2) → key 'the' (1): 0.500 (renormalised without the first token)",
  );
  assert.equal(cellText({ tokens, i: 2, j: 1, value: null }), "query 'cat' (2) → key 'the' (1): no value");
});
