// app/static/js/state.js: the view state in the URL, and moving the selection. Run: node --test tests/js/

import assert from "node:assert/strict";
import { test } from "node:test";

import {
  DEFAULT_STATE,
  MAX_NEW_TOKENS,
  clampSelection,
  encodeState,
  getState,
  ignoredParams,
  initState,
  moveSelection,
  readState,
  subscribe,
  update,
} from "../../app/static/js/state.js";

const roundTrip = (state) => readState(`?${encodeState(state)}`);

test("the default state survives a round trip and makes a short link", () => {
  assert.deepEqual(roundTrip(DEFAULT_STATE), { ...DEFAULT_STATE });
  assert.equal(encodeState(DEFAULT_STATE), "layer=0&head=0&view=heatmap");
  assert.deepEqual(readState(""), { ...DEFAULT_STATE });
});

test("every field round-trips, odd characters included", () => {
  const odd = "a+b & c=d #e ?f %20 %zz é 😀 <b>\"x\"</b>\n\ttab  ";
  const state = {
    text: odd,
    pair: "second + sentence=2&3",
    model: "my/model?v=1",
    layer: 5,
    head: 11,
    view: "tokens",
    words: true,
    weighting: "norm",
    color: "entropy_norm",
    compare: true,
    btext: "B: 100% #1",
    bmodel: "other model",
    hideFirst: true,
    newTokens: 7,
    chat: true,
    lines: "layer",
    pairs: "ab",
    scale: "log",
    target: "Das Haus ist wunderbar. 100% & #1",
    kind: "encoder",
    probe: "heads",
    seed: 4294967295,
    sequences: 32,
    input: "probe",
  };
  assert.deepEqual(roundTrip(state), state);
  assert.deepEqual(roundTrip({ ...state, head: "mean" }), { ...state, head: "mean" });
  // A literal "+" is not a space, a space is: both come back as typed.
  assert.equal(readState("?text=a%2Bb+c").text, "a+b c");
});

test("B's fields travel only in compare mode; empty fields are left out", () => {
  const state = { ...DEFAULT_STATE, btext: "B", bmodel: "m", compare: false, pair: "" };
  const query = new URLSearchParams(encodeState(state));
  assert.deepEqual([...query.keys()], ["layer", "head", "view"]);
  assert.deepEqual(roundTrip(state), { ...DEFAULT_STATE });
});

test("malformed values fall back to the defaults", () => {
  const cases = {
    "layer=-1": { layer: 0 },
    "layer=abc": { layer: 0 },
    "layer=12345": { layer: 0 }, // more digits than any model has layers
    "layer=3.5": { layer: 0 },
    "layer=%203": { layer: 0 },
    "head=__proto__": { head: 0 }, // only the page's own aggregates are names
    "head=constructor": { head: 0 },
    "head=mean": { head: "mean" },
    "head=0012": { head: 12 },
    "view=flow": { view: "heatmap" },
    "words=true": { words: false }, // only "1" is true
    "compare=yes": { compare: false },
    "color=Robert');DROP": { color: "" },
    "color=entropy": { color: "entropy" },
    "nofirst=true": { hideFirst: false },
    "nofirst=1": { hideFirst: true },
    "continue=5": { newTokens: 5 },
    "continue=-1": { newTokens: 0 },
    "continue=2.5": { newTokens: 0 },
    "continue=abc": { newTokens: 0 },
    "continue=99": { newTokens: MAX_NEW_TOKENS }, // above the page's offer: clamped to it, not dropped
    "scale=row": { scale: "row" },
    "scale=Log": { scale: "unit" }, // only the offered names
    "scale=__proto__": { scale: "unit" },
    "weighting=norm": { weighting: "norm" },
    "weighting=Norm": { weighting: "weight" }, // only the API's names
    "weighting=1": { weighting: "weight" },
  };
  for (const [search, want] of Object.entries(cases)) {
    assert.deepEqual(readState(`?${search}`), { ...DEFAULT_STATE, ...want }, search);
  }
  // Repeated keys: the first wins, as URLSearchParams.get says.
  assert.equal(readState("?layer=2&layer=3").layer, 2);
});

test("the colour scale: the default stays out of links, so links made before it read the same", () => {
  assert.equal(DEFAULT_STATE.scale, "unit");
  assert.equal(readState("?text=a&layer=1&head=2&view=heatmap").scale, "unit");
  assert.equal(new URLSearchParams(encodeState({ ...DEFAULT_STATE, scale: "unit" })).has("scale"), false);
  for (const scale of ["head", "row", "log"]) assert.equal(roundTrip({ ...DEFAULT_STATE, scale }).scale, scale);
});

test("weight × value norm travels as weighting=norm; weights, the default, stay out of links", () => {
  assert.equal(DEFAULT_STATE.weighting, "weight");
  const norm = { ...DEFAULT_STATE, text: "a", weighting: "norm" };
  assert.equal(new URLSearchParams(encodeState(norm)).get("weighting"), "norm");
  assert.deepEqual(roundTrip(norm), norm);
  assert.equal(new URLSearchParams(encodeState({ ...norm, weighting: "weight" })).has("weighting"), false);
  assert.equal(readState("?text=a&layer=1&head=2&view=heatmap").weighting, "weight"); // links made before it
  assert.deepEqual(ignoredParams("?weighting=values&weighting=norm"), [{ name: "weighting", value: "values" }]);
  assert.deepEqual(ignoredParams("?weighting=norm&weighting=weight"), []);
});

test("the values a link had that were ignored are named, in the link's order", () => {
  const ignored = ignoredParams("?text=x&layer=abc&head=__proto__&view=flow&words=true&color=a%20b&continue=2.5&model=zzz");
  assert.deepEqual(ignored, [
    { name: "layer", value: "abc" },
    { name: "head", value: "__proto__" },
    { name: "view", value: "flow" },
    { name: "words", value: "true" },
    { name: "color", value: "a b" },
    { name: "continue", value: "2.5" },
  ]); // text and model are free text: a model name is checked against the server's list, not here
  // Well-formed values are used, even out of range (clamped later, with its own notice) or over the
  // continuation limit (clamped to it).
  const fine = "?layer=99&head=mean&view=tokens&words=1&compare=0&nofirst=1&chat=1&color=entropy&continue=99";
  assert.deepEqual(ignoredParams(fine), []);
  assert.deepEqual(ignoredParams(`?${encodeState({ ...DEFAULT_STATE, text: "a", compare: true, words: true })}`), []);
  // Every value readState replaced by a default is named, and nothing it used.
  for (const search of ["?layer=-1", "?head=constructor", "?view=", "?nofirst=yes", "?continue=-1"]) {
    assert.equal(ignoredParams(search).length, 1, search);
  }
});

test("arrow keys walk heads, then the aggregate column, and stop at the edges", () => {
  const shape = { layers: 3, heads: 2 };
  assert.deepEqual(moveSelection({ layer: 0, head: 0 }, "ArrowRight", shape), { layer: 0, head: 1 });
  assert.deepEqual(moveSelection({ layer: 0, head: 1 }, "ArrowRight", shape), { layer: 0, head: "mean" });
  assert.deepEqual(moveSelection({ layer: 0, head: "mean" }, "ArrowRight", shape), { layer: 0, head: "mean" });
  assert.deepEqual(moveSelection({ layer: 0, head: "mean" }, "ArrowLeft", shape), { layer: 0, head: 1 });
  assert.deepEqual(moveSelection({ layer: 0, head: 0 }, "ArrowLeft", shape), { layer: 0, head: 0 });
  assert.deepEqual(moveSelection({ layer: 0, head: "mean" }, "ArrowDown", shape), { layer: 1, head: "mean" });
  assert.deepEqual(moveSelection({ layer: 2, head: 1 }, "ArrowDown", shape), { layer: 2, head: 1 });
  assert.deepEqual(moveSelection({ layer: 0, head: 1 }, "ArrowUp", shape), { layer: 0, head: 1 });
  assert.equal(moveSelection({ layer: 0, head: 0 }, "Enter", shape), null);
});

test("a selection from a link is clamped to the model it meets", () => {
  const shape = { layers: 4, heads: 8 };
  assert.deepEqual(clampSelection({ layer: 9, head: 99 }, shape), { layer: 3, head: 7 });
  assert.deepEqual(clampSelection({ layer: 9, head: "mean" }, shape), { layer: 3, head: "mean" });
  assert.deepEqual(clampSelection({ layer: 1, head: 2 }, shape), { layer: 1, head: 2 });
});

// update(): the one writer. A fake URL writer records what would reach the address bar.
function fresh(initial = {}) {
  const urls = [];
  initState({ ...DEFAULT_STATE, ...initial }, { write: (state) => urls.push(encodeState(state)) });
  return urls;
}

test("update merges the patch, writes the URL once and tells subscribers what changed", () => {
  const urls = fresh({ text: "a cat" });
  const calls = [];
  subscribe((state, changed) => calls.push([state, [...changed].sort()]));
  const changed = update({ layer: 2, head: "mean", view: "heatmap" });
  assert.deepEqual([...changed].sort(), ["head", "layer"]); // view was heatmap already
  assert.deepEqual(urls, ["text=a+cat&layer=2&head=mean&view=heatmap"]);
  assert.equal(calls.length, 1);
  assert.deepEqual(calls[0][1], ["head", "layer"]);
  assert.equal(calls[0][0], getState());
  assert.deepEqual(getState(), { ...DEFAULT_STATE, text: "a cat", layer: 2, head: "mean" });
});

test("an update that changes nothing still writes the URL but notifies no one", () => {
  const urls = fresh({ layer: 1 });
  let notified = 0;
  subscribe(() => notified++);
  assert.equal(update({ layer: 1 }).size, 0);
  assert.equal(update({}).size, 0);
  assert.equal(notified, 0);
  assert.equal(urls.length, 2); // a link with malformed values is written out clean by the next update
});

test("the state cannot change behind update's back", () => {
  fresh();
  const before = getState();
  assert.ok(Object.isFrozen(before));
  assert.throws(() => {
    before.layer = 5; // modules are strict: writing a frozen field throws
  }, TypeError);
  update({ color: "entropy" });
  assert.equal(before.color, ""); // a reader's old snapshot stays what it was
  assert.equal(getState().color, "entropy");
});

test("an unknown field throws before anything is written or changed", () => {
  const urls = fresh();
  let notified = 0;
  subscribe(() => notified++);
  assert.throws(() => update({ layer: 3, colour: "x" }), /unknown state field\(s\) colour/);
  assert.deepEqual([urls.length, notified, getState().layer], [0, 0, 0]);
});

test("subscribers see the merged state in order, and an unsubscribed one hears nothing", () => {
  fresh();
  const seen = [];
  const stop = subscribe((state) => seen.push(`a${state.layer}`));
  subscribe((state) => seen.push(`b${state.layer}`));
  update({ layer: 1 });
  stop();
  update({ layer: 2 });
  assert.deepEqual(seen, ["a1", "b1", "b2"]);
  initState(DEFAULT_STATE, { write: () => {} }); // a fresh start drops every subscriber
  update({ layer: 3 });
  assert.deepEqual(seen, ["a1", "b1", "b2"]);
});

test("an encoder-decoder view: the target and a kind other than cross travel in the link", () => {
  const state = { ...DEFAULT_STATE, text: "The house", target: "Das Haus", kind: "decoder" };
  const query = new URLSearchParams(encodeState(state));
  assert.equal(query.get("target"), "Das Haus");
  assert.equal(query.get("kind"), "decoder");
  assert.deepEqual(roundTrip(state), state);
  // Cross attention is the default (the alignment picture): a link need not say it; a blank target neither.
  const plain = new URLSearchParams(encodeState({ ...state, target: "", kind: "cross" }));
  assert.equal(plain.has("kind") || plain.has("target"), false);
  // A kind the page does not know falls back to cross, and the page says it ignored it.
  assert.equal(readState("?kind=sideways").kind, "cross");
  assert.deepEqual(ignoredParams("?kind=sideways&kind=encoder"), [{ name: "kind", value: "sideways" }]);
});
