// app/static/js/examples.js: what a first visit runs. Run: node --test tests/js/

import assert from "node:assert/strict";
import { test } from "node:test";

import { EXAMPLES, examplesFor, firstExample } from "../../app/static/js/examples.js";

test("a URL without text starts from the first example; any text in the URL wins", () => {
  assert.deepEqual(firstExample(""), { text: EXAMPLES[0].text, pair: "" });
  assert.deepEqual(firstExample("?model=tiny-gpt2&layer=2"), { text: EXAMPLES[0].text, pair: "" });
  assert.equal(firstExample("?text=Dogs+bark."), null);
  assert.equal(firstExample("?text="), null); // an empty text asked for is still asked for
});

test("four examples: a coreference sentence, a pair, a long paragraph, a chat on the bundled LLM", () => {
  assert.deepEqual(EXAMPLES.map((e) => e.id), ["coreference", "pair", "paragraph", "chat"]);
  assert.equal(EXAMPLES[0].text, "The animal didn't cross the street because it was too tired.");
  assert.ok(EXAMPLES[1].pair.length > 0 && EXAMPLES.filter((e) => e.pair).length === 1);
  assert.ok(EXAMPLES[2].text.split(/\s+/).length >= 90); // ~120 subword tokens (the browser test counts them)
  assert.equal(new Set(EXAMPLES.map((e) => e.id)).size, EXAMPLES.length);
});

test("the chat example opens the bundled LLM with its chat template and 12 new tokens, where it is served", () => {
  const chat = EXAMPLES.find((e) => e.id === "chat");
  assert.equal(chat.text, "What is the capital of France?");
  assert.deepEqual([chat.model, chat.chat, chat.newTokens, chat.pair], ["SmolLM2-135M-Instruct", true, 12, ""]);
  // Only the examples naming no model (or a served one) are offered.
  assert.deepEqual(examplesFor(new Set(["all-MiniLM-L6-v2"])).map((e) => e.id), ["coreference", "pair", "paragraph"]);
  const served = new Map([["all-MiniLM-L6-v2", {}], ["SmolLM2-135M-Instruct", {}]]);
  assert.deepEqual(examplesFor(served).map((e) => e.id), ["coreference", "pair", "paragraph", "chat"]);
});
