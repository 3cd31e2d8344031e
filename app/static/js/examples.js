// The example inputs a newcomer starts from: the first one runs on a first visit (a URL with no text), and
// each is a chip above the text box that fills the form and runs it. Pure data apart from renderExamples,
// so Node's test runner imports it as the page does (tests/js/).

import { el } from "./dom.js";

export const EXAMPLES = Object.freeze([
  Object.freeze({
    id: "coreference",
    label: "Coreference",
    title: "Which noun does “it” attend to? A classic of attention papers",
    text: "The animal didn't cross the street because it was too tired.",
    pair: "",
  }),
  Object.freeze({
    id: "pair",
    label: "Sentence pair",
    title: "A question and its answer as a pair: look for heads that reach across from one to the other",
    text: "Where did the cat sleep after lunch?",
    pair: "The cat slept on the warm windowsill all afternoon.",
  }),
  Object.freeze({
    id: "paragraph",
    label: "Long paragraph",
    title: "About 120 tokens of running text: positional and broad heads stand out",
    text:
      "Attention lets every token in a sentence look at every other token and decide how much each one " +
      "matters. Some heads simply look at the previous word, some gather at punctuation or at the first " +
      "token, and a few follow grammar: a verb finds its subject, a pronoun finds the noun it stands for. " +
      "Early layers tend to stay local, while later layers spread their weight across the whole paragraph. " +
      "None of this is designed by hand; it emerges from training on large amounts of text, which is why " +
      "looking at the heads one by one is a useful way to see what a model has learned.",
    pair: "",
  }),
  // On the bundled LLM (offered only where the server has it): a user's turn in its chat template, and the
  // model's own answer written after it, so its heads are seen reading the question and writing the reply.
  Object.freeze({
    id: "chat",
    label: "Chat with an LLM",
    title: "SmolLM2-135M-Instruct answers in its chat template: look for the first-token sink and the heads that find “France”",
    text: "What is the capital of France?",
    pair: "",
    model: "SmolLM2-135M-Instruct",
    chat: true,
    newTokens: 12,
  }),
]);

/** What a first visit runs: the state's text fields when the URL names no text, else nothing. */
export function firstExample(search) {
  if (new URLSearchParams(search).has("text")) return null;
  const { text, pair } = EXAMPLES[0];
  return { text, pair };
}

/** The examples a server offering `models` (names) can run: one naming a model only where it is served. */
export function examplesFor(models) {
  return EXAMPLES.filter((example) => !example.model || models.has(example.model));
}

/**
 * One button per example in `container` that the server's `models` (a Map or Set of names) can run;
 * `onPick(example)` on click (Enter and Space come with <button>).
 */
export function renderExamples(container, onPick, models = new Set()) {
  const buttons = examplesFor(models).map((example) => {
    const button = el("button", {
      className: "chip example",
      text: example.label,
      attrs: { type: "button", title: example.title },
      data: { example: example.id },
    });
    button.addEventListener("click", () => onPick(example));
    return button;
  });
  container.replaceChildren(...buttons);
}
