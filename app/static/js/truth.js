// The page says when what it shows is not what was asked for: a link naming a model this server does not
// serve, or a layer/head beyond the model (shown anyway, with the default or the nearest, and a notice
// saying so); an old result left on screen after a failed run (marked stale); B models that compare
// cannot pair with A (disabled, with the reason); attention flow over its token limit (the button off,
// the limit on it). The message builders are pure, so Node's test runner imports them (tests/js/).

import { $, el } from "./dom.js";
import { modelLabel } from "./labels.js";

/** A model the page can run: listed by the server and not failed to load. */
export function servable(models, name) {
  const model = models.get(name);
  return Boolean(model) && !model.error;
}

/**
 * "Model 'x' is not served here; showing y." for a name a link asked for that the page could not use;
 * null when it could (or the link named none). `role` "B" words it for compare's B model.
 */
export function modelNotice(requested, models, shown, role = "") {
  if (!requested || requested === shown) return null;
  const what = role ? `${role} model` : "Model";
  const why = models.has(requested) ? `is unavailable here (${models.get(requested).error})` : "is not served here";
  return `${what} “${requested}” ${why}; showing ${shown}.`;
}

/**
 * What clamping did to a selection: "layer 9 is beyond this model's 6 layers (0–5); showing layer 5",
 * the same for the head; null when nothing moved. `model`: {layers, heads}.
 */
export function selectionNotice(requested, shown, { layers, heads }) {
  const parts = [];
  if (requested.layer !== shown.layer) {
    parts.push(`layer ${requested.layer} is beyond this model's ${layers} layers (0–${layers - 1}); showing layer ${shown.layer}`);
  }
  if (requested.head !== shown.head) {
    parts.push(`head ${requested.head} is beyond its ${heads} heads (0–${heads - 1}); showing head ${shown.head}`);
  }
  return parts.length ? `${parts.join("; ")}.` : null;
}

/** "Ignored in the link: view “x”, layer “y”." for state.js ignoredParams; null when none. */
export function ignoredNotice(ignored) {
  if (!ignored.length) return null;
  return `Ignored in the link: ${ignored.map(({ name, value }) => `${name} “${value}”`).join(", ")}.`;
}

/**
 * Why B's model cannot be compared with A's, or "" when it can or a size is not known yet (a model not
 * loaded): the compare API needs the same layers and heads (its heads are paired one to one).
 */
export function compareProblem(a, b) {
  if (!a || !b || a.layers == null || b.layers == null) return "";
  if (a.layers === b.layers && a.heads === b.heads) return "";
  return `${b.layers} layers × ${b.heads} heads; A (${a.name}) has ${a.layers} × ${a.heads}, and compare pairs heads one to one`;
}

/** The flow button's words: its limit in the unit the run counts (tokens, or words with Words on). */
export function flowButtonLabel(limit, words) {
  return limit ? `Compute attention flow (up to ${limit} ${words ? "words" : "tokens"})` : "Compute attention flow";
}

/** Why flow is off for an input of `n` over `limit`, or null when it is within. */
export function flowLimitNote(n, limit, words) {
  if (!limit || n <= limit) return null;
  const unit = words ? "words" : "tokens";
  return (
    `Attention flow is limited to ${limit} ${unit} (it solves n² max-flow problems); this input has ${n}. ` +
    "Shorten the text to compute it; the rollout above has no such limit."
  );
}

/** The stale banner: which input the result on screen belongs to, cut to `max` characters. */
export function staleMessage(query, max = 80) {
  const text = query.text.replace(/\s+/g, " ").trim();
  const shown = text.length > max ? `${text.slice(0, max - 1)}…` : text;
  return `Showing the previous result, for “${shown}”: the last run failed (see the message above).`;
}

/** The notice under the form: one line per key, so a later message replaces its own kind only. */
export class Notices {
  constructor(box) {
    this.box = box;
    this.lines = new Map();
  }

  set(key, message) {
    if (message) this.lines.set(key, message);
    else this.lines.delete(key);
    this.render();
  }

  clear() {
    this.lines.clear();
    this.render();
  }

  render() {
    this.box.replaceChildren(...[...this.lines].map(([key, text]) => el("p", { text, data: { key } })));
    this.box.hidden = this.lines.size === 0;
  }
}

/** Mark the result on screen as `query`'s, left from before a failed run; null clears the mark. */
export function markStale(query) {
  for (const panel of [$("workspace"), $("analysis")]) panel.classList.toggle("stale", Boolean(query));
  const banner = $("staleBanner");
  banner.textContent = query ? staleMessage(query) : "";
  banner.hidden = !query;
}

/**
 * Enable the B models compare can pair with `aName` and disable the rest with the reason (option text and
 * title). When B's choice is disabled, B takes A's model; returns the name it had then, else null.
 */
export function refreshModelB(models, aName) {
  const a = models.get(aName);
  const select = $("modelB");
  for (const option of select.options) {
    const model = models.get(option.value);
    if (!model || model.error) continue; // form.js marked it unavailable already
    const problem = compareProblem(a, model);
    option.disabled = Boolean(problem);
    option.textContent = problem ? `${modelLabel(model)} — not comparable with A` : modelLabel(model);
    option.title = problem
      ? `Cannot be compared with A: ${problem}.`
      : model.layers == null
        ? "Comparable when it has A's layers and heads (its size is known once it has loaded)."
        : "";
  }
  if (!select.selectedOptions[0]?.disabled) return null;
  const was = select.value;
  select.value = aName;
  return was;
}

/** The notice for B's model put back to A's by refreshModelB. */
export function modelBNotice(was, models, aName) {
  if (!was) return null;
  return `B model “${was}” cannot be compared with ${aName}: ${compareProblem(models.get(aName), models.get(was))}; B uses ${aName}.`;
}
