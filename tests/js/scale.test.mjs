// app/static/js/scale.js: the detail heatmap's colour scales. Run: node --test tests/js/
// Every expected number here is exact: the inputs are chosen so each quotient and logarithm is a float64
// that the arithmetic produces without rounding (powers of two, or exact decades of Math.log10).

import assert from "node:assert/strict";
import { test } from "node:test";

import {
  DEFAULT_SCALE,
  LOG_FLOOR,
  SCALES,
  headMax,
  logScaled,
  parseScale,
  rowMax,
  rowScaled,
  scaleValues,
} from "../../app/static/js/scale.js";

const NaN_ = Number.NaN;

test("the default is 0–1 and every offered scale parses; anything else falls back", () => {
  assert.equal(DEFAULT_SCALE, "unit");
  assert.deepEqual(Object.keys(SCALES), ["unit", "head", "row", "log"]);
  for (const name of Object.keys(SCALES)) assert.equal(parseScale(name), name);
  for (const bad of [null, undefined, "", "LOG", "toString", "__proto__", 3]) assert.equal(parseScale(bad), "unit");
  assert.match(SCALES.log.label, /floor 0\.0001/); // the menu states the floor
});

test("head max skips NaN (hidden or missing cells) and is 0 for nothing", () => {
  assert.equal(headMax(new Float32Array([0.25, 0.5, 0.125, 0])), 0.5);
  assert.equal(headMax([NaN_, 0.75, NaN_, 0.25]), 0.75);
  assert.equal(headMax([NaN_, NaN_]), 0);
  assert.equal(headMax([]), 0);
});

test("row max: each query row's own largest weight", () => {
  // 3 x 3, row 1 has a NaN (the first token hidden), row 2 is all NaN (nothing left).
  const values = [0.5, 0.25, 0.25, NaN_, 0.125, 0.875, NaN_, NaN_, NaN_];
  assert.deepEqual([...rowMax(values, 3)], [0.5, 0.875, 0]);
});

test("per row: each row divided by its own max, zeros and NaN kept", () => {
  const values = new Float32Array([0.5, 0.25, 0.25, 0, 0, 0, 0.125, 0.0625, NaN_]);
  assert.deepEqual([...rowScaled(values, 3)], [1, 0.5, 0.5, 0, 0, 0, 1, 0.5, NaN_]);
});

test("log: log10 of each weight with everything under the floor at the floor", () => {
  const values = [1, 0.1, 0.01, 0.001, LOG_FLOOR, 1e-5, 0, NaN_];
  assert.deepEqual([...logScaled(values)], [0, -1, -2, -3, -4, -4, -4, NaN_]);
});

test("scaleValues: 0–1 and head max keep the true weights as z; only zmax moves", () => {
  const values = new Float32Array([0.25, 0.125, 0.0625, 0.03125]);
  const unit = scaleValues(values, 2, "unit");
  assert.equal(unit.z, values);
  assert.deepEqual([unit.zmin, unit.zmax, unit.title, unit.transformed], [0, 1, "", false]);
  const head = scaleValues(values, 2, "head");
  assert.equal(head.z, values); // the colour bar's numbers are weights: the hover can read z
  assert.deepEqual([head.zmin, head.zmax, head.transformed], [0, 0.25, false]);
  assert.equal(head.title, "colour: 0 to the head's max 0.25");
  // A blank head (all zero) stays on 0–1 rather than dividing by zero.
  assert.equal(scaleValues(new Float32Array(4), 2, "head").zmax, 1);
});

test("scaleValues: per row and log are new arrays, marked transformed, with their ranges and ticks", () => {
  const values = new Float32Array([0.5, 0.25, 0.125, 0.5]);
  const row = scaleValues(values, 2, "row");
  assert.notEqual(row.z, values);
  assert.deepEqual([...row.z], [1, 0.5, 0.25, 1]);
  assert.deepEqual([row.zmin, row.zmax, row.transformed], [0, 1, true]);
  assert.match(row.title, /row/);
  const log = scaleValues([0.1, 1e-6, 0.01, NaN_], 2, "log");
  assert.deepEqual([...log.z], [-1, -4, -2, NaN_]);
  assert.deepEqual([log.zmin, log.zmax, log.transformed], [-4, 0, true]);
  assert.deepEqual(log.tickvals, [-4, -3, -2, -1, 0]);
  assert.deepEqual(log.ticktext, ["≤0.0001", "0.001", "0.01", "0.1", "1"]);
  assert.match(log.title, /floor 0\.0001/); // the colour bar states the floor too
  // An unknown name is the default, not an error.
  assert.equal(scaleValues(values, 2, "bogus").z, values);
});
