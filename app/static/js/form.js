// The input form: the model lists, what is being typed (the next run's query), the status line and the
// alert. The form holds only what a person is typing; what was run is the view state (state.js), which
// fills the form once, when a link is opened.

import { $, el } from "./dom.js";
import { modelGroups, modelLabel } from "./labels.js";
import { ENCODER_DECODER } from "./seq2seq.js";
import { MAX_NEW_TOKENS, parseNewTokens } from "./state.js";
import { servable } from "./truth.js";
import { DEFAULT_WEIGHTING } from "./weighting.js";

let models = new Map(); // name -> /api/models entry, as fillModels last made it

/** The server-known state of the page's JSON data block (models, limits); {} when it is missing. */
export function readInitialState() {
  try {
    return JSON.parse($("initialState").textContent);
  } catch {
    return {};
  }
}

export function setBusy(message) {
  const status = $("status");
  status.textContent = message;
  status.classList.toggle("busy", Boolean(message));
  $("form").setAttribute("aria-busy", message ? "true" : "false");
}

export function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.hidden = !message;
}

/** Both model selects from GET /api/models's answer; returns {models: name -> model, defaultModel}. */
export function fillModels(info) {
  models = new Map(info.models.map((m) => [m.name, m]));
  const defaultModel = info.default ?? info.models[0]?.name ?? "";
  // One group per source, titled as /api/models `sources` says (Bundled, Models folder, ...): a native <optgroup>,
  // so the menu keeps the select's own keyboard use (arrows, type-ahead) and screen readers name the group.
  const groups = modelGroups(info.models, info.sources).map(([title, members]) =>
    el("optgroup", { attrs: { label: title } }, members.map(modelOption)),
  );
  $("model").replaceChildren(...groups);
  $("modelB").replaceChildren(...groups.map((group) => group.cloneNode(true)));
  return { models, defaultModel };
}

function modelOption(m) {
  const label = modelLabel(m);
  const option = el("option", { text: label, attrs: { value: m.name } });
  if (m.error) {
    option.disabled = true;
    option.title = m.error;
  }
  return option;
}

/**
 * A run tells us the size of a model that was not loaded when the page was rendered; `entries` (the
 * /api/models list, fetched after that run) what the answer does not carry, such as its chat template.
 */
export function learnModel(attention, entries = []) {
  const known = models.get(attention.model);
  if (!known || known.layers != null) return;
  const { layers, heads, kvHeads, causal } = attention;
  const listed = entries.find((entry) => entry.name === attention.model);
  Object.assign(known, { layers, heads, kv_heads: kvHeads, causal, chat_template: listed?.chat_template });
  known.architecture ??= attention.architecture ?? listed?.architecture; // the answer says it for seq2seq
  known.max_tokens ??= listed?.max_tokens; // the model's own limit, known once it is loaded
  for (const select of [$("model"), $("modelB")]) {
    const option = [...select.options].find((o) => o.value === attention.model);
    if (option) option.textContent = modelLabel(known);
  }
  showNewTokens();
}

/** Sizes of models loaded since the list was read (/api/models `entries`); true when one was learnt. */
export function learnEntries(entries) {
  let learnt = false;
  for (const entry of entries) {
    const known = models.get(entry.name);
    if (!known || known.layers != null || entry.layers == null) continue;
    Object.assign(known, entry);
    for (const select of [$("model"), $("modelB")]) {
      const option = [...select.options].find((o) => o.value === entry.name);
      if (option) option.textContent = modelLabel(known);
    }
    learnt = true;
  }
  return learnt;
}

/**
 * "Continue by k tokens" is offered for causal models; for a model not loaded yet (its kind unknown) only
 * when a link already asks for a continuation, which the run then tries (an encoder answers 422).
 */
export function showNewTokens() {
  const known = models.get($("model").value);
  const causal = known?.causal;
  $("newTokensField").hidden = !(causal === true || (causal == null && parseNewTokens($("newTokens").value) > 0));
  // The chat template likewise: offered where the tokenizer has one, or tried where a link asks for it.
  const chat = known?.chat_template;
  $("chatField").hidden = !(chat === true || (chat == null && $("chat").checked));
  // The target box for encoder-decoder models; for a model whose kind is unknown, when a link gives a target.
  const architecture = known?.architecture;
  const seq2seq = architecture === ENCODER_DECODER || (architecture == null && Boolean($("target").value.trim()));
  $("targetField").hidden = !seq2seq;
  // An encoder-decoder's answers are token-level (the API's words: 422): Words is off for one, saying why.
  const words = $("words");
  const label = words.parentElement;
  label.dataset.title ??= label.title; // the template's own, put back when another model allows words
  words.disabled = architecture === ENCODER_DECODER;
  label.title = words.disabled ? "Encoder-decoder models show tokens only: words are merged for encoders and decoders" : label.dataset.title;
}

/**
 * The weighting chosen in the switch ("weight" or "norm"), also while a long input has it off: the trace
 * reads weights, and the run says that norm was asked for and why it is not shown (main.js runLong).
 */
export function chosenWeighting() {
  return $("weightingSwitch").querySelector("input[name=weighting]:checked")?.value ?? DEFAULT_WEIGHTING;
}

/** Check the switch's radio of `weighting`. */
export function showWeighting(weighting) {
  for (const radio of $("weightingSwitch").querySelectorAll("input[name=weighting]")) radio.checked = radio.value === weighting;
}

/**
 * A's query as typed: {text, pair, model, words, weighting, newTokens, chat}, plus `target` (blank: the model
 * writes it) for an encoder-decoder model; 0 and false where a control is hidden.
 */
export function currentQuery() {
  const newTokens = $("newTokensField").hidden ? 0 : parseNewTokens($("newTokens").value);
  const chat = !$("chatField").hidden && $("chat").checked;
  const query = {
    text: $("text").value,
    pair: $("textPair").value,
    model: $("model").value,
    words: $("words").checked && !$("words").disabled,
    weighting: chosenWeighting(),
    newTokens,
    chat,
  };
  return $("targetField").hidden ? query : { ...query, target: $("target").value };
}

/** Compare mode as typed: {compare, btext, bmodel}. */
export function currentB() {
  return { compare: $("compare").checked, btext: $("textB").value, bmodel: $("modelB").value };
}

/**
 * Put a link's state into the form, and wire what only shapes the form: submit and Ctrl+Enter call
 * onRun(), ticking Compare shows B's inputs, and B's model follows A's until someone picks one for B.
 */
export function initForm(state, { defaultModel, limits = {} }, { onRun }) {
  $("text").value = state.text;
  $("textPair").value = state.pair;
  $("model").value = servable(models, state.model) ? state.model : defaultModel;
  $("words").checked = state.words;
  showWeighting(state.weighting);
  $("compare").checked = state.compare;
  $("compareInputs").hidden = !state.compare;
  $("textB").value = state.btext;
  $("modelB").value = servable(models, state.bmodel) ? state.bmodel : $("model").value;
  // The service's own limit (HEADSCOPE_MAX_NEW_TOKENS) where it is below the page's.
  $("newTokens").max = String(Math.min(MAX_NEW_TOKENS, limits.max_new_tokens ?? MAX_NEW_TOKENS));
  $("newTokens").value = String(state.newTokens);
  $("chat").checked = state.chat;
  $("target").value = state.target;
  showNewTokens();

  $("form").addEventListener("submit", (event) => {
    event.preventDefault();
    onRun();
  });
  for (const name of ["text", "textPair", "textB", "target"]) {
    $(name).addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        onRun();
      }
    });
  }
  $("compare").addEventListener("change", () => {
    $("compareInputs").hidden = !$("compare").checked;
    if ($("compare").checked) $("textB").focus();
  });
  let modelBChosen = Boolean(state.bmodel);
  $("modelB").addEventListener("change", () => {
    modelBChosen = true;
  });
  $("model").addEventListener("change", () => {
    if (!modelBChosen) $("modelB").value = $("model").value;
    showNewTokens();
  });
  // What is typed is what runs: a count outside 0..MAX_NEW_TOKENS (or not a whole number) is put right.
  $("newTokens").addEventListener("change", () => {
    $("newTokens").value = String(parseNewTokens($("newTokens").value));
  });
}
