// The long-input mode's pure parts: choosing a trace (long-mode.js measure), reading /api/trace's NDJSON
// stream (trace-api.js), the text view's keys and line breaks (long-text.js), the words it says.
// Run: node --test tests/js/

import assert from "node:assert/strict";
import { test } from "node:test";

import { ApiError } from "../../app/static/js/api.js";
import { longSummary, measure, unavailable } from "../../app/static/js/long-mode.js";
import { endsLine, textKey } from "../../app/static/js/long-text.js";
import { splitLines } from "../../app/static/js/progress-stream.js";
import { streamTrace, traceBody, utf8Length } from "../../app/static/js/trace-api.js";
import { fakeFetch } from "./fake-fetch.mjs";

test("utf8Length counts what a tokenizer reads: 1 to 4 bytes a character", () => {
  for (const text of ["", "cat", "naïve café", "東京", "🙂 emoji", "a\u{10FFFF}b"]) {
    assert.equal(utf8Length(text), Buffer.byteLength(text, "utf8"), text);
  }
});

test("splitLines keeps the unfinished tail for the next chunk and drops blank lines", () => {
  assert.deepEqual(splitLines('{"a":1}\n{"b"'), [['{"a":1}'], '{"b"']);
  assert.deepEqual(splitLines("\n\nx\n"), [["x"], ""]);
  assert.deepEqual(splitLines("partial"), [[], "partial"]);
});

test("streamTrace reports each layer, however the chunks cut the lines, and returns the done event", async () => {
  const done = { event: "done", n: 4003, layers: 2 };
  const lines = `{"event":"progress","layer":0,"layers":2}\n{"event":"progress","layer":1,"layers":2}\n${JSON.stringify(done)}`;
  const calls = fakeFetch([lines.slice(0, 7), lines.slice(7, 50), lines.slice(50)]); // no final newline either
  const seen = [];
  const answer = await streamTrace({ text: "t", pair: "", model: "m", words: true, newTokens: 3 }, { onProgress: (e) => seen.push(e.layer) });
  assert.deepEqual(seen, [0, 1]);
  assert.deepEqual(answer, done);
  // The trace routes take the input alone: no words, no continuation (their schema forbids other fields).
  assert.deepEqual(calls[0].body, { text: "t", text_pair: null, model: "m" });
  assert.equal(calls[0].url, "/api/trace");
});

test("streamTrace throws the error line's detail, and a stream that ends without a result", async () => {
  fakeFetch(['{"event":"progress","layer":0,"layers":2}\n{"event":"error","detail":"the trace stopped: out of memory"}\n']);
  await assert.rejects(streamTrace({ text: "t" }), (error) => error instanceof ApiError && error.message === "the trace stopped: out of memory");
  fakeFetch(['{"event":"progress","layer":0,"layers":2}\n']);
  await assert.rejects(streamTrace({ text: "t" }), /ended before its result/);
});

test("streamTrace gives a 413's detail, which names the limit", async () => {
  const detail = "input has 9000 tokens; model 'm' traces at most 8192 tokens (the model's own limit); shorten the text";
  fakeFetch([], { status: 413, json: { detail } });
  await assert.rejects(streamTrace({ text: "t" }), (error) => error.status === 413 && error.message === detail);
});

test("measure: short in bytes runs the attention route unasked; longer is counted, traced only where it helps", async () => {
  let calls = fakeFetch([], { json: { n: 9999 } });
  assert.equal(await measure({ text: "a".repeat(500), pair: "b".repeat(12) }, { limit: 512 }), null);
  assert.equal(calls.length, 0); // a token spans at least a byte: 512 bytes are at most 512 tokens (+ specials)
  const count = { model: "m", n: 4003, max_tokens: 512, trace_max_tokens: 8192 };
  calls = fakeFetch([], { json: count });
  assert.deepEqual(await measure({ text: "東".repeat(171) }, { limit: 512 }), count); // 513 bytes
  assert.equal(calls[0].url, "/api/trace/tokens");
  fakeFetch([], { json: { ...count, n: 512 } }); // long in bytes, not in tokens
  assert.equal(await measure({ text: "a".repeat(600) }, { limit: 512 }), null);
  fakeFetch([], { json: { ...count, trace_max_tokens: 512 } }); // the model traces no more: cut, as before
  assert.equal(await measure({ text: "a".repeat(600) }, { limit: 512 }), null);
  calls = fakeFetch([], { json: count }); // short in bytes, yet the answer said truncated: template tokens
  assert.deepEqual(await measure({ text: "a" }, { limit: 512, truncated: true }), count);
  assert.equal(calls.length, 1);
});

test("traceBody sends chat only when set", () => {
  assert.deepEqual(traceBody({ text: "t", pair: "p", model: "", chat: true }), { text: "t", text_pair: "p", model: null, chat: true });
});

test("the text view's keys move a cursor within the tokens; Up/Down by a line's worth", () => {
  const moves = [
    [5, "ArrowRight", 10, 6],
    [9, "ArrowRight", 10, 9],
    [0, "ArrowLeft", 10, 0],
    [3, "ArrowDown", 100, 23],
    [3, "ArrowUp", 100, 0],
    [3, "Home", 100, 0],
    [3, "End", 100, 99],
    [3, "Enter", 100, null],
  ];
  for (const [i, key, n, want] of moves) assert.equal(textKey(i, key, n), want, `${key} from ${i} of ${n}`);
});

test("a token holding a newline ends a line of the text view", () => {
  assert.equal(endsLine("Ċ", true), true);
  assert.equal(endsLine(".ĊĊ", true), true);
  assert.equal(endsLine("Ċ", false), false); // a WordPiece token's "Ċ" is a letter
  assert.equal(endsLine("<0x0A>", false), true);
  assert.equal(endsLine("cat", true), false);
});

test("the status line and the reasons say what the page shows and why", () => {
  assert.equal(longSummary(4003, 128, "max"), "4,003 tokens, every head pooled to 128 × 128 (max)");
  assert.equal(longSummary(100, 100, "max"), "100 tokens");
  assert.equal(unavailable("Head statistics", 512), "Head statistics need the full matrices: available up to 512 tokens.");
  assert.equal(unavailable("Compare", 2048, "needs"), "Compare needs the full matrices: available up to 2,048 tokens.");
});
