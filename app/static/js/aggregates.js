// Per-layer aggregate "heads" shown as an extra column of the model view and selectable like a head.
// Each entry computes an n*n matrix from the decoded attention on the client. Whole-model aggregates
// that need the server (attention rollout and flow, head statistics, compare) come from the insight API
// and render into the #analysis section (rollout.js, insight.js, compare.js), not here.

export const AGGREGATES = Object.freeze({
  mean: Object.freeze({
    label: "mean",
    title: "mean of all heads",
    compute: (attention, layer, out) => attention.meanInto(layer, out),
  }),
});

/** True when `head` names an aggregate rather than a head index. */
export function isAggregate(head) {
  return typeof head === "string" && Object.hasOwn(AGGREGATES, head);
}
