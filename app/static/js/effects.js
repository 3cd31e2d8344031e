// "Which heads matter", the parts without DOM: POST /api/head-effects read as it streams (progress lines
// for models of more than 100 heads, then the result), the log colour scale of the L x H effects, how a
// value is written, and which output an effect refers to ("next token after “is”: “␣Paris” 0.62").
// Pure but for fetch, so tests/js/ imports it as the page does.

import { displayToken } from "./decoder.js";
import { streamProgress } from "./progress-stream.js";
import { quoted } from "./written.js";

// The colour scale spans at most this many decades below the largest effect: a head whose effect is a
// millionth of the largest one is as good as none, and one float32 rounding (~1e-7 relative) lies below.
export const DECADES = 6;

/**
 * The route's body: the input alone (no words, weighting or kind: the effect is on the model's output, and
 * an encoder-decoder's answer holds the heads of all three kinds).
 */
export function effectsBody({ text, pair, model, newTokens = 0, chat = false, target = "" }) {
  const input = { text, text_pair: pair || null, model: model || null };
  if (newTokens > 0) input.max_new_tokens = newTokens;
  if (target?.trim()) input.target = target;
  return chat ? { ...input, chat: true } : input;
}

/**
 * POST /api/head-effects, read as it streams: `onProgress({done, layers})` after each layer's heads;
 * resolves with the done event (HeadEffectsDone). A 4xx before the stream (an encoder-decoder, an input
 * the model cannot take) and an error line after it throw ApiError. Options: {signal, onProgress}.
 */
export async function streamEffects(query, options = {}) {
  const ended = "The measurement ended before its result: the server stopped answering.";
  return streamProgress("/api/head-effects", effectsBody(query), { ...options, failed: "Measuring failed.", ended });
}

/**
 * The outputs an answer's effects can refer to, as [{label, values: L x H}], the default one first: a
 * decoder's next token (then each step that wrote a token), an encoder's first token and mean-pooled state;
 * an encoder-decoder's for the heads of `kind` (its encoder's, decoder's or cross-attention's), at the
 * decoder's next token and each target token.
 */
export function effectOutputs(result, kind = "encoder") {
  if (result.sections) result = { ...result, ...result.sections[kind] };
  if (result.measure !== "kl") {
    const first = displayToken(result.tokens[0], result.byte_level);
    return [
      { label: `final state of the first token ${quoted(first)}`, values: result.effects },
      { label: "final state, mean-pooled over the tokens", values: result.pooled },
    ];
  }
  const last = result.positions.length - 1;
  const outputs = result.positions.map((position, step) => ({
    label: stepLabel(result, step),
    values: result.steps.map((row) => row.map((cell) => cell[step])),
  }));
  outputs[last].values = result.effects; // the same numbers: the answer's own table
  return [outputs[last], ...outputs.slice(0, last)];
}

/**
 * "next token after “is”: “␣Paris” 0.62" (the last step), "written token after ...: ..." (the others; an
 * encoder-decoder's given target: "target token after ...", the model's own most likely one named).
 */
export function stepLabel(result, step) {
  const spell = (token) => quoted(displayToken(token, result.byte_level));
  const forced = result.sections && !result.generated;
  const what = step === result.positions.length - 1 ? "next token" : forced ? "target token" : "written token";
  const after = spell(result.tokens[result.positions[step]]);
  return `${what} after ${after}: ${spell(result.top_tokens[step])} ${result.top_probs[step].toFixed(2)}`;
}

/** What the numbers measure, one line. */
export function measureText(measure) {
  return measure === "kl"
    ? "KL(p ‖ p without the head) of that prediction, in nats"
    : "1 − cosine between that state with and without the head";
}

/**
 * The log colour scale of an L x H table: {lo, hi, t(v)}, t in [0, 1]. hi is the largest value, lo the
 * smallest positive one, at most DECADES decades below hi; values at or below lo (0, or a rounding's -1e-17)
 * take the scale's first colour; where every positive value is the same, they take its last.
 */
export function logScale(values) {
  let hi = 0;
  let lo = Infinity;
  for (const row of values) {
    for (const v of row) {
      if (!(v > 0)) continue; // also NaN
      hi = Math.max(hi, v);
      lo = Math.min(lo, v);
    }
  }
  if (hi === 0) return { lo: 0, hi: 0, t: () => 0 };
  lo = Math.max(lo, hi / 10 ** DECADES);
  const span = Math.log10(hi) - Math.log10(lo);
  const t = (v) => {
    if (!(v > 0)) return 0;
    return span > 0 ? Math.min(1, Math.max(0, (Math.log10(v) - Math.log10(lo)) / span)) : 1;
  };
  return { lo, hi, t };
}

/** An effect as the page writes it: 3 significant digits, in exponent form below 0.001. */
export function formatEffect(v) {
  if (!Number.isFinite(v)) return "–";
  if (v === 0) return "0";
  return Math.abs(v) >= 0.001 ? v.toPrecision(3) : v.toExponential(2);
}

/** The `count` heads of largest effect, as [layer, head, value], largest first (ties in model order). */
export function topHeads(values, count) {
  const heads = values.flatMap((row, layer) => row.map((value, head) => [layer, head, value]));
  heads.sort((a, b) => b[2] - a[2] || a[0] - b[0] || a[1] - b[1]);
  return heads.slice(0, count);
}
