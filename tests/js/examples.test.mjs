// static/js/examples.js: what a first visit runs. Run: node --test tests/js/

import assert from "node:assert/strict";
import { test } from "node:test";

import { EXAMPLES, firstExample } from "../../static/js/examples.js";

test("a URL without text starts from the first example; any text in the URL wins", () => {
  assert.deepEqual(firstExample(""), { text: EXAMPLES[0].text, pair: "" });
  assert.deepEqual(firstExample("?model=tiny-gpt2&layer=2"), { text: EXAMPLES[0].text, pair: "" });
  assert.equal(firstExample("?text=Dogs+bark."), null);
  assert.equal(firstExample("?text="), null); // an empty text asked for is still asked for
});

test("three examples: a coreference sentence, a pair, a long paragraph", () => {
  assert.deepEqual(EXAMPLES.map((e) => e.id), ["coreference", "pair", "paragraph"]);
  assert.equal(EXAMPLES[0].text, "The animal didn't cross the street because it was too tired.");
  assert.ok(EXAMPLES[1].pair.length > 0 && EXAMPLES.filter((e) => e.pair).length === 1);
  assert.ok(EXAMPLES[2].text.split(/\s+/).length >= 90); // ~120 subword tokens (the browser test counts them)
  assert.equal(new Set(EXAMPLES.map((e) => e.id)).size, EXAMPLES.length);
});
