// Encoder-decoder models (T5, BART, Marian): the three kinds of attention a run holds, which one the grid and
// the detail show, and what the page calls their axes. A decoded seq2seq answer is the encoder's Attention
// with `sections` {encoder, decoder, cross}; every other answer is one square "self" Attention, which these
// helpers pass through unchanged. Pure (no DOM), so tests/js/ imports it as the page does.

export const ENCODER_DECODER = "encoder-decoder";

// The kind switch's options, in the order the data flows: source, target, target -> source.
export const KIND_LABELS = Object.freeze({
  encoder: "Encoder self-attention",
  decoder: "Decoder self-attention",
  cross: "Cross-attention",
});

/** True for an Attention, a run's answer or an /api/models entry of an encoder-decoder model. */
export function isSeq2seq(thing) {
  return thing?.architecture === ENCODER_DECODER;
}

/** The Attention of `kind` in a decoded answer; the answer itself when it has no sections (not seq2seq). */
export function sectionOf(attention, kind) {
  return attention.sections?.[kind] ?? attention;
}

/** {rows, cols}: query and key counts of an Attention (both n for a square one decoded before sections). */
export function shapeOf(attention) {
  return { rows: attention.rows ?? attention.n, cols: attention.cols ?? attention.n };
}

/** Query tokens (rows) and key tokens (columns), with their special marks; square: the tokens twice. */
export function axesOf(attention) {
  return {
    queryTokens: attention.queryTokens ?? attention.tokens,
    keyTokens: attention.keyTokens ?? attention.tokens,
    querySpecial: attention.querySpecial ?? attention.special,
    keySpecial: attention.keySpecial ?? attention.special,
  };
}

/** True when queries and keys are different sequences (cross-attention): the views draw two axes. */
export function isRectangular(attention) {
  return attention.kind === "cross" || shapeOf(attention).rows !== shapeOf(attention).cols;
}

/**
 * Axis titles of the heatmap and headings of the token lines: which sentence each side holds. Cross
 * attention reads target tokens (down) against source tokens (across); the decoder's are target tokens.
 */
export function axisNames(kind) {
  if (kind === "cross") return { query: "target token (query)", key: "source token (key)" };
  if (kind === "decoder") return { query: "target token (query)", key: "target token (key)" };
  if (kind === "encoder") return { query: "source token (query)", key: "source token (key)" };
  return { query: "query (attending)", key: "key (attended to)" };
}

/**
 * The status line of a seq2seq run: "7 source tokens → 5 target tokens (the model wrote 4 tokens) · encoder
 * 2 layers × 4 heads, decoder 3 × 4". `full` is the decoded answer (the encoder's Attention, with sections).
 */
export function seq2seqSummary(full) {
  const { encoder, decoder } = full.sections;
  const k = decoder.generated; // the decoder's rows are the target: the model wrote its last k tokens
  const wrote = k > 0 ? ` (the model wrote ${k} token${k === 1 ? "" : "s"})` : "";
  const target = `${decoder.rows ?? decoder.n} target tokens${wrote}`;
  return (
    `${encoder.n} source tokens → ${target} · encoder ${encoder.layers} layers × ${encoder.heads} heads, ` +
    `decoder ${decoder.layers} × ${decoder.heads}`
  );
}

/** Rollout multiplies the encoder's layers (a square chain); for the other kinds the panel says so. */
export function rolloutNote(kind) {
  if (kind === "encoder" || !Object.hasOwn(KIND_LABELS, kind)) return null;
  return (
    `Attention rollout runs across the encoder only (its layers chain source to source); ${KIND_LABELS[kind].toLowerCase()} ` +
    "has no such chain. Switch to Encoder self-attention to see it."
  );
}

/** The notice for what a seq2seq run did not read: the source and the target each say it ("" when none). */
export function seq2seqTruncation(full) {
  const parts = [];
  if (full.truncated) parts.push(`Source truncated to ${full.n} tokens, the most this model reads here.`);
  const decoder = full.sections?.decoder;
  if (decoder?.truncated) {
    const m = decoder.rows ?? decoder.n;
    parts.push(`Target truncated to ${m} tokens, the most its decoder reads here: the rest was not forced.`);
  }
  return parts.join(" ");
}

/** The model name export files are named by: an encoder-decoder's gets the kind ("t5-small-cross"). */
export function fileModel(attention) {
  return isSeq2seq(attention) && attention.kind ? `${attention.model}-${attention.kind}` : attention.model;
}
