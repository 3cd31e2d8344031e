// The model menu's labels and groups (issue 34): what each model's file says, and where it comes from.
// Run: node --test tests/js/

import assert from "node:assert/strict";
import { test } from "node:test";

import { modelFacts, modelGroups, modelLabel } from "../../app/static/js/labels.js";

test("a model's facts: family, parameters, quantization and size, each as known", () => {
  const smol = { name: "SmolLM2", layers: null, header_family: "llama", parameters: 134_515_008, quantization: "Q4_1", size_bytes: 98_000_000 };
  assert.equal(modelFacts(smol), "llama · 135 M params · Q4_1 · 98 MB");
  assert.equal(modelLabel(smol), "SmolLM2 — loads on first use · llama · 135 M params · Q4_1 · 98 MB");
  const big = { name: "qwen2.5:7b", layers: 28, heads: 28, kv_heads: 4, causal: true, header_family: "qwen2", parameters: 7_615_616_512, quantization: "Q4_K_M", size_bytes: 4_683_073_184 };
  assert.equal(modelLabel(big), "qwen2.5:7b — 28 layers × 28 heads over 4 KV heads (causal) · qwen2 · 7.6 B params · Q4_K_M · 4.7 GB");
  assert.equal(modelFacts({ parameters: 999_600, size_bytes: 1_234 }), "1.0 M params · 1.2 kB");
  assert.equal(modelFacts({ name: "random", family: "random" }), ""); // nothing read from a file
});

test("a model that cannot load reads as only unavailable, with its reason", () => {
  const why = "CheckpointNotFoundError: ollama's 'ghost:latest': its model blob sha256-bb is missing";
  const broken = { name: "ghost:latest", layers: null, header_family: "llama", size_bytes: 1_000, error: why };
  assert.equal(modelLabel(broken), `ghost:latest — unavailable: ${why}`);
  assert.doesNotMatch(modelLabel(broken), /loads on first use/);
  const long = modelLabel({ name: "x", layers: null, error: "y".repeat(500) });
  assert.equal(long, `x — unavailable: ${"y".repeat(159)}…`);
});

// /api/models `sources`, as the server's table of sources (mha.loading.sources.SOURCES) sends them
const SOURCES = Object.entries({
  bundled: "Bundled",
  operator: "Named by the operator",
  models_dir: "Models folder",
  ollama: "ollama",
  lmstudio: "LM Studio",
  huggingface: "Hugging Face",
}).map(([id, label]) => ({ id, label }));

test("the menu groups models by source, in the server's order of sources, empty groups left out", () => {
  // name: source, in the server's order; "old" has none, as from a server before sources: bundled
  const sources = { "q:7b": "ollama", "all-MiniLM-L6-v2": "bundled", "org/repo": "huggingface" };
  Object.assign(sources, { "p/m/f": "lmstudio", mine: "models_dir", "b:1b": "ollama", old: undefined });
  const models = Object.entries(sources).map(([name, source]) => ({ name, source }));
  const groups = modelGroups(models, SOURCES);
  assert.deepEqual(
    groups.map(([title, members]) => [title, members.map((m) => m.name)]),
    [
      ["Bundled", ["all-MiniLM-L6-v2", "old"]],
      ["Models folder", ["mine"]],
      ["ollama", ["q:7b", "b:1b"]],
      ["LM Studio", ["p/m/f"]],
      ["Hugging Face", ["org/repo"]],
    ],
  );
});

test("a group's title is the server's label: the page keeps no list of sources", () => {
  const models = [{ name: "a", source: "new" }, { name: "b", source: "bundled" }, { name: "c", source: "gone" }];
  const sources = [{ id: "new", label: "A source added later" }, { id: "bundled", label: "Bundled" }];
  assert.deepEqual(
    modelGroups(models, sources).map(([title, members]) => [title, members.map((m) => m.name)]),
    [["A source added later", ["a", "c"]], ["Bundled", ["b"]]],
  );
  // a server that sends no sources: one group per source, titled by its id, in list order
  assert.deepEqual(
    modelGroups(models).map(([title, members]) => [title, members.map((m) => m.name)]),
    [["new", ["a"]], ["bundled", ["b"]], ["gone", ["c"]]],
  );
  assert.deepEqual(modelGroups([], SOURCES), []);
});
