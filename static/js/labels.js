// What the page calls things: model options, the selected head, export file names. Pure (no DOM), so the
// unit tests in tests/js/ import it as the page does.

import { AGGREGATES, isAggregate } from "./aggregates.js";

/** "name — 6 layers × 12 heads (causal)"; a model that is not loaded yet does not know its size. */
export function modelLabel(m) {
  const size = m.layers == null ? "loads on first use" : `${m.layers} layers × ${m.heads} heads`;
  return `${m.name} — ${size}${m.causal ? " (causal)" : ""}`;
}

/** "layer 2, head 5" or "layer 2, mean of all heads". */
export function selectionLabel(layer, head) {
  return isAggregate(head) ? `layer ${layer}, ${AGGREGATES[head].title}` : `layer ${layer}, head ${head}`;
}

/** A file name stem for exports: the model name reduced to [A-Za-z0-9._-] (never a path), layer, head. */
export function exportName(model, layer, head) {
  const safe = (model || "model").replace(/[^A-Za-z0-9._-]+/g, "_");
  return `headscope-${safe}-L${layer}-${isAggregate(head) ? head : `H${head}`}`;
}
