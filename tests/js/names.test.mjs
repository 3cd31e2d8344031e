// What the page calls things and what it tells people: statistic names, roles and badges (names.js), the
// truncation notice and token limit (notices.js), export file names (labels.js). Run: node --test tests/js/

import assert from "node:assert/strict";
import { test } from "node:test";

import { matrixRows } from "../../app/static/js/export.js";
import { allHeadsName, headJsonName } from "../../app/static/js/labels.js";
import {
  BADGE_MIN_SHARE,
  ROLES,
  STAT_NAMES,
  badgeRule,
  badgesShown,
  readableKey,
  standoutBadges,
  statName,
  thresholdSentences,
} from "../../app/static/js/names.js";
import { tokenLimit, truncationNotice } from "../../app/static/js/notices.js";

// The keys mha.analysis.head_stats returns (STAT_DESCRIPTIONS), plus compare mode's change score.
const API_KEYS = [
  "entropy", "entropy_norm", "distance", "self", "previous", "next", "local", "forward", "special",
  "punctuation", "first", "max", "previous_token", "duplicate_token", "induction", "change",
];

test("every statistic the API names has a readable header with its unit, never its code name", () => {
  for (const key of API_KEYS) {
    const name = statName(key);
    assert.ok(STAT_NAMES[key], key);
    assert.doesNotMatch(name, /_/, key);
    assert.notEqual(name, key);
    assert.match(name, /\(.+\)$/, `${key}: the unit or range in brackets`);
  }
  assert.equal(statName("entropy_norm"), "Entropy (normalised, 0–1)");
  assert.equal(statName("label"), "Role");
  assert.equal(statName("kv group"), "KV group");
  // A statistic a newer server adds still reads as words.
  assert.equal(readableKey("attention_to_verbs"), "Attention to verbs");
  assert.equal(statName("new_stat"), "New stat");
});

test("thresholds read as sentences, in the order the labels apply them", () => {
  const sentences = thresholdSentences({ pointer: 0.5, broad: 0.8, local: 0.6 });
  assert.equal(sentences.length, 4);
  assert.match(sentences[0], /more than 50% of its weight/);
  assert.match(sentences[1], /normalised entropy is at least 0\.8/);
  assert.match(sentences[2], /at least 60% of its weight/);
  assert.equal(sentences[3], "Any other head is mixed.");
  for (const s of sentences) assert.doesNotMatch(s, /[{}"]/); // never raw JSON
  const induction = thresholdSentences({ pointer: 0.5, induction: 0.5, induction_margin: 0.3 });
  assert.match(induction[0], /induction score is at least 0\.5 and at least 0\.3 above/);
  assert.match(induction[1], /more than 50% of its weight/); // the induction rule applies first
  assert.deepEqual(thresholdSentences({}), []);
  assert.deepEqual(thresholdSentences(undefined), []);
});

test("badges only on heads whose role's statistic reaches the stated share", () => {
  const analysis = {
    labels: [["special-sink", "special-sink", "broad"], ["previous-token", "mixed", "unknown-role"]],
    stats: {
      special: [[0.8, 0.79, 0.9], [0, 0, 0]],
      previous: [[0, 0, 0], [0.95, 0, 0]],
      entropy_norm: [[0, 0, 0.99], [0, 0, 0]],
    },
  };
  // 0.8 is the bound itself (>=); 0.79 passes the role's 0.5 threshold but does not stand out.
  assert.deepEqual(standoutBadges(analysis), [["spec", "", ""], ["prev", "", ""]]);
  assert.deepEqual(badgesShown(standoutBadges(analysis)).map(([label]) => label), ["previous-token", "special-sink"]);
  assert.deepEqual(standoutBadges({}), []);
  assert.match(badgeRule(), new RegExp(`${Math.round(BADGE_MIN_SHARE * 100)}%`));
  // Every badge text is distinct, so the glossary names each one once.
  const texts = Object.values(ROLES).map((r) => r.badge).filter(Boolean);
  assert.equal(new Set(texts).size, texts.length);
});

test("truncation notice names the limit and what is shown", () => {
  assert.equal(truncationNotice({ truncated: false, n: 5 }), "");
  assert.equal(truncationNotice(null), "");
  assert.equal(
    truncationNotice({ truncated: true, n: 512 }, { limit: 512 }),
    "Input truncated to 512 tokens, the most this model reads here: the rest of the text was not read.",
  );
  assert.equal(
    truncationNotice({ truncated: true, n: 90 }, { words: true, limit: 128 }),
    "Input truncated to 128 tokens: the 90 words shown are what fit; the rest of the text was not read.",
  );
  assert.match(truncationNotice({ truncated: true, n: 90 }, { words: true }), /the model's token limit: the 90 words/);
  // A continuation's written tokens come after the truncated prompt.
  assert.match(truncationNotice({ truncated: true, n: 40, generated: 8 }), /truncated to 32 tokens/);
  // A grid pooled into blocks (a snapshot past its size limit) was cut at its input's tokens, not its blocks.
  assert.match(truncationNotice({ truncated: true, n: 128, header: { input_n: 512 } }), /truncated to 512 tokens/);
  assert.equal(tokenLimit({ max_tokens: 1024 }, { max_tokens: 512 }), 512);
  assert.equal(tokenLimit({ max_tokens: 128 }, { max_tokens: 512 }), 128);
  assert.equal(tokenLimit(undefined, {}), null);
  assert.equal(tokenLimit({ max_tokens: null }, undefined), null);
});

test("JSON exports are named for what they hold", () => {
  assert.equal(allHeadsName("all-MiniLM-L6-v2"), "headscope-all-MiniLM-L6-v2-all-heads.json");
  assert.equal(allHeadsName("org/model x", { words: true }), "headscope-org_model_x-all-heads-words.json");
  assert.equal(headJsonName("tiny-gpt2", 2, 7), "headscope-tiny-gpt2-L2-H7.json");
  assert.equal(headJsonName("tiny-gpt2", 0, "mean", { words: true }), "headscope-tiny-gpt2-L0-mean-words.json");
  // Rows of an n*n buffer, 6 decimals as the API rounds: 1/3 in float32 is 0.3333333432674408.
  assert.deepEqual(matrixRows(new Float32Array([1 / 3, 2 / 3, 1, 0]), 2), [[0.333333, 0.666667], [1, 0]]);
});
