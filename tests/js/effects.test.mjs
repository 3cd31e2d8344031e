// app/static/js/effects.js: the "Which heads matter" panel's pure parts: the route's body, the stream read as
// it comes, the outputs an answer's effects refer to and how they are named, the log colour scale, the
// numbers and the ranking. Run: node --test tests/js/

import assert from "node:assert/strict";
import { test } from "node:test";

import { ApiError } from "../../app/static/js/api.js";
import { DECADES, effectOutputs, effectsBody, formatEffect, logScale, stepLabel, streamEffects, topHeads } from "../../app/static/js/effects.js";
import { fakeFetch } from "./fake-fetch.mjs";

// A decoder's answer after writing one token: positions 3 (wrote "ĠParis") and 4 (the next one).
const decoder = {
  measure: "kl",
  tokens: ["<s>", "The", "Ġcapital", "Ġis", "ĠParis"],
  byte_level: true,
  positions: [3, 4],
  effects: [[0.5, 0.001], [2e-9, 0]],
  steps: [[[0.25, 0.5], [0.003, 0.001]], [[1e-8, 2e-9], [0, 0]]],
  top_tokens: ["ĠParis", "."],
  top_probs: [0.6231, 0.4],
};

test("the body is the input alone, with a continuation and the chat template when asked", () => {
  const query = { text: "t", pair: "", model: "m", words: true, weighting: "norm", kind: "encoder" };
  assert.deepEqual(effectsBody(query), { text: "t", text_pair: null, model: "m" });
  assert.deepEqual(effectsBody({ ...query, newTokens: 3, chat: true }), { text: "t", text_pair: null, model: "m", max_new_tokens: 3, chat: true });
  // An encoder-decoder's target goes with it (a blank one: the model writes its own); the kind does not.
  assert.deepEqual(effectsBody({ ...query, kind: "cross", target: "Das Haus." }), { text: "t", text_pair: null, model: "m", target: "Das Haus." });
  assert.deepEqual(effectsBody({ ...query, target: "  " }), { text: "t", text_pair: null, model: "m" });
});

test("streamEffects reports each layer however the chunks cut the lines, and returns the result", async () => {
  const done = { event: "done", layers: 2, effects: [[1], [2]] };
  const lines = `{"event":"progress","done":1,"layers":2}\n{"event":"progress","done":2,"layers":2}\n${JSON.stringify(done)}`;
  const calls = fakeFetch([lines.slice(0, 9), lines.slice(9, 60), lines.slice(60)]);
  const seen = [];
  const answer = await streamEffects({ text: "t", pair: "b", model: "m", newTokens: 2 }, { onProgress: (e) => seen.push(e.done) });
  assert.deepEqual(seen, [1, 2]);
  assert.deepEqual(answer, done);
  assert.equal(calls[0].url, "/api/head-effects");
  assert.deepEqual(calls[0].body, { text: "t", text_pair: "b", model: "m", max_new_tokens: 2 });
});

test("streamEffects throws an error line's detail, a 422's, and a stream without a result", async () => {
  fakeFetch(['{"event":"progress","done":1,"layers":2}\n{"event":"error","detail":"the head effects stopped: gone"}\n']);
  await assert.rejects(streamEffects({ text: "t" }), (error) => error instanceof ApiError && error.message === "the head effects stopped: gone");
  const detail = "'t5' is an encoder-decoder model: head effects are measured for encoder and decoder models only";
  fakeFetch([], { status: 422, json: { detail } });
  await assert.rejects(streamEffects({ text: "t" }), (error) => error.status === 422 && error.message === detail);
  fakeFetch(['{"event":"progress","done":1,"layers":2}\n']);
  await assert.rejects(streamEffects({ text: "t" }), /ended before its result/);
});

test("a decoder's effects name the next token first, then each written one, as the page spells tokens", () => {
  assert.equal(stepLabel(decoder, 1), "next token after “␣Paris”: “.” 0.40");
  assert.equal(stepLabel(decoder, 0), "written token after “␣is”: “␣Paris” 0.62");
  const outputs = effectOutputs(decoder);
  assert.deepEqual(outputs.map((o) => o.label), [stepLabel(decoder, 1), stepLabel(decoder, 0)]);
  assert.equal(outputs[0].values, decoder.effects); // the answer's own table for the last step
  assert.deepEqual(outputs[1].values, [[0.25, 0.003], [1e-8, 0]]); // steps[l][h][0]
});

test("an encoder-decoder's effects are those of the kind on screen, at the next token, then each target token", () => {
  const section = (base) => ({ layers: 1, heads: 2, effects: [[base, base / 10]], steps: [[[base * 2, base], [base / 5, base / 10]]] });
  const seq2seq = {
    measure: "kl",
    tokens: ["<pad>", "▁Das"],
    byte_level: false,
    positions: [0, 1],
    generated: 0,
    top_tokens: ["▁Das", "▁Haus"],
    top_probs: [0.5, 0.25],
    effects: [[0.3, 0.03]],
    sections: { encoder: section(0.3), decoder: section(0.7), cross: section(0.9) },
  };
  for (const kind of ["encoder", "decoder", "cross"]) {
    const outputs = effectOutputs(seq2seq, kind);
    assert.equal(outputs[0].values, seq2seq.sections[kind].effects);
    assert.deepEqual(outputs[1].values, seq2seq.sections[kind].steps.map((row) => row.map((cell) => cell[0])));
  }
  assert.deepEqual(effectOutputs(seq2seq).map((o) => o.label), [
    "next token after “␣Das”: “␣Haus” 0.25",
    "target token after “<pad>”: “␣Das” 0.50", // a given target: the model's own most likely token named
  ]);
  assert.equal(effectOutputs({ ...seq2seq, generated: 1 }, "cross")[1].label, "written token after “<pad>”: “␣Das” 0.50");
});

test("an encoder's effects are on the first token's state, then the mean-pooled one", () => {
  const encoder = { measure: "cosine", tokens: ["[CLS]", "hi", "[SEP]"], byte_level: false, effects: [[0.1]], pooled: [[0.2]] };
  const outputs = effectOutputs(encoder);
  assert.deepEqual(outputs.map((o) => o.label), ["final state of the first token “[CLS]”", "final state, mean-pooled over the tokens"]);
  assert.deepEqual(outputs.map((o) => o.values), [[[0.1]], [[0.2]]]);
});

test("the log scale spans the largest value down to the smallest positive, at most DECADES decades", () => {
  const scale = logScale([[1e-3, 1e-1], [1e-2, 0]]);
  assert.deepEqual([scale.lo, scale.hi], [1e-3, 1e-1]);
  assert.equal(scale.t(1e-1), 1);
  assert.ok(Math.abs(scale.t(1e-2) - 0.5) < 1e-12); // one decade of two: halfway
  assert.equal(scale.t(1e-3), 0);
  assert.equal(scale.t(0), 0);
  assert.equal(scale.t(-1e-17), 0); // a rounding below zero takes the first colour
  const wide = logScale([[1, 1e-12]]);
  assert.equal(wide.lo, 10 ** -DECADES);
  assert.equal(wide.t(1e-12), 0);
  const flat = logScale([[0.5, 0.5]]);
  assert.equal(flat.t(0.5), 1); // one value: the top colour
  assert.deepEqual([logScale([[0, 0]]).hi, logScale([[0, 0]]).t(0)], [0, 0]);
});

test("effects are written with 3 significant digits, small ones in exponent form", () => {
  assert.equal(formatEffect(0.5), "0.500");
  assert.equal(formatEffect(0.00123), "0.00123");
  assert.equal(formatEffect(2.5e-7), "2.50e-7");
  assert.equal(formatEffect(0), "0");
  assert.equal(formatEffect(Number.NaN), "–");
});

test("topHeads lists the largest effects first, ties in model order", () => {
  assert.deepEqual(topHeads([[0.1, 0.5], [0.5, 0.2]], 3), [[0, 1, 0.5], [1, 0, 0.5], [1, 1, 0.2]]);
});
