// The text view of a long input: the prompt as text, one inline span a token (special tokens marked,
// spelled as every view spells them: decoder.js displayToken). Choose a token (click, or Enter on the
// focused text) and every token is shaded by how much that query token attends to it in the selected head
// (/api/trace/row, exact), with its top-k keys listed; an entry of the list scrolls to its token.
//
// Fast at 8,192 tokens: the spans are built once per trace; a row, a head or a cursor move only restyles.

import { styledApart } from "./decode.js";
import { $, el } from "./dom.js";
import { fetchRow } from "./trace-api.js";
import { displayToken, topK } from "./decoder.js";
import { selectionLabel } from "./labels.js";
import { quoted, shade, topParts } from "./written.js";

export const LONG_TOP_K = 10;
// written.js's shade at each of its 256 steps, made once: a row restyles 8,192 spans.
const SHADES = Array.from({ length: 256 }, (_, k) => shade(k / 255));
const PAGE_TOKENS = 20; // Up/Down move the cursor this many tokens: about a line of text

/** Where the cursor goes for `key` from token `i` of `n`; null for other keys. Pure (tests/js/). */
export function textKey(i, key, n) {
  const moves = {
    ArrowRight: i + 1,
    ArrowLeft: i - 1,
    ArrowDown: i + PAGE_TOKENS,
    ArrowUp: i - PAGE_TOKENS,
    Home: 0,
    End: n - 1,
  };
  return Object.hasOwn(moves, key) ? Math.min(n - 1, Math.max(0, moves[key])) : null;
}

/** True when a token holds a newline: "\n", byte-level "Ċ", SentencePiece's byte "<0x0A>". */
export function endsLine(token, byteLevel) {
  return token.includes("\n") || token.includes("<0x0A>") || (byteLevel && token.includes("Ċ"));
}

export class LongText {
  constructor() {
    this.els = {
      panel: $("longText"),
      tokens: $("longTextTokens"),
      caption: $("longTextCaption"),
      top: $("longTextTop"),
      cursor: $("longTextCursor"),
    };
    this.spans = [];
    this.spelled = [];
    this.run = null;
    this.q = -1; // the chosen query token
    this.cursor = -1; // the keyboard's token
    this.selection = { layer: 0, head: 0 };
    this.controller = null; // the row in flight; a newer one aborts it
    this.values = null; // the row shown
    const { tokens, top } = this.els;
    tokens.addEventListener("click", (event) => {
      const span = event.target.closest("[data-i]");
      if (!span) return;
      this.moveCursor(Number(span.dataset.i), { scroll: false });
      this.choose(Number(span.dataset.i));
    });
    // A keyboard arrival puts the cursor in view; a click's focus must not scroll under the pointer.
    tokens.addEventListener("focus", () => {
      const at = this.cursor >= 0 ? this.cursor : Math.max(0, this.q);
      this.moveCursor(at, { scroll: tokens.matches(":focus-visible") });
    });
    tokens.addEventListener("keydown", (event) => this.onKey(event));
    tokens.addEventListener("mouseover", (event) => this.onHover(event.target.closest("[data-i]")));
    top.addEventListener("click", (event) => {
      const button = event.target.closest("button[data-index]");
      if (button) this.reveal(Number(button.dataset.index));
    });
  }

  /** A hovered token's title: its spelling, position and weight in the row shown. */
  onHover(span) {
    if (!span || !this.values) return;
    const j = Number(span.dataset.i);
    span.title = `${this.spelled[j]} (token ${j}): ${this.values[j].toFixed(6)}`;
  }

  onKey(event) {
    if (!this.spans.length || event.altKey || event.ctrlKey || event.metaKey) return;
    if (event.key === "Enter" || event.key === " ") {
      event.preventDefault();
      this.choose(this.cursor);
      return;
    }
    const next = textKey(this.cursor, event.key, this.spans.length);
    if (next === null) return;
    event.preventDefault();
    this.moveCursor(next);
  }

  moveCursor(i, { scroll = true } = {}) {
    this.spans[this.cursor]?.classList.remove("cursor");
    this.cursor = i;
    const span = this.spans[i];
    if (!span) return;
    span.classList.add("cursor");
    this.els.tokens.setAttribute("aria-activedescendant", span.id);
    if (scroll) span.scrollIntoView({ block: "nearest", inline: "nearest" });
    const weight = this.values ? `, weight ${this.values[i].toFixed(4)}` : "";
    this.els.cursor.textContent = `token ${i}: ${quoted(this.spelled[i])}${weight}`;
  }

  /** Scroll token `i` into view and put the cursor on it (a top-k entry was chosen). */
  reveal(i) {
    this.moveCursor(i);
    this.els.tokens.focus({ preventScroll: true });
  }

  /** Build the spans of a trace (`run.trace`: the done event); the last token first: its row picks the next. */
  show(run, { layer, head }) {
    const { tokens, special, unknown, n, byte_level: byteLevel } = run.trace;
    const started = performance.now(); // benchmarks read "headscope-long-text" and "headscope-long-row"
    this.run = run;
    this.selection = { layer, head };
    this.spelled = tokens.map((token) => displayToken(token, byteLevel));
    const apart = styledApart(special, unknown, n); // special tokens and [UNK]
    const fragment = document.createDocumentFragment();
    this.spans = this.spelled.map((text, i) => {
      const span = el("span", { className: apart[i] ? "lt-token special" : "lt-token", text, data: { i } });
      span.id = `lt-${i}`;
      fragment.append(span);
      if (endsLine(tokens[i], byteLevel)) fragment.append(document.createElement("br")); // the text's own lines
      return span;
    });
    this.els.tokens.replaceChildren(fragment);
    performance.measure("headscope-long-text", { start: started });
    this.els.top.replaceChildren();
    this.values = null;
    this.els.panel.hidden = false;
    this.q = -1;
    this.cursor = -1;
    this.choose(n - 1);
  }

  /** Another head of the same trace: the same query token's row again. */
  select(layer, head) {
    this.selection = { layer, head };
    if (this.run && this.q >= 0) this.choose(this.q);
  }

  clear() {
    this.controller?.abort();
    this.run = null;
    this.values = null;
    this.spans = [];
    this.els.tokens.replaceChildren();
    this.els.top.replaceChildren();
    this.els.caption.textContent = "";
    this.els.panel.hidden = true;
    delete this.els.panel.dataset.q;
  }

  /** Query token `q`: fetch its row in the selected head and shade the text by it. */
  async choose(q) {
    const run = this.run;
    if (!run || !(q >= 0 && q < this.spans.length)) return;
    this.spans[this.q]?.classList.remove("query");
    this.spans[this.q]?.removeAttribute("aria-current");
    this.q = q;
    this.spans[q].classList.add("query");
    this.spans[q].setAttribute("aria-current", "true");
    this.controller?.abort();
    const controller = new AbortController();
    this.controller = controller;
    const { layer, head } = this.selection;
    this.els.panel.dataset.state = "loading";
    try {
      const signal = AbortSignal.any([run.signal, controller.signal]);
      const row = await fetchRow(run.query, layer, head, q, { signal });
      if (controller.signal.aborted) return;
      this.paint(row.values, { layer, head, q });
    } catch (error) {
      if (controller.signal.aborted || run.signal.aborted) return;
      this.els.caption.textContent = `The weights of token ${q} could not be read: ${error.message}`;
      this.els.panel.dataset.state = "error";
    }
  }

  /** Style updates only: every span's shade (weight ÷ the row's largest), the top-k list, the caption. */
  paint(values, { layer, head, q }) {
    const { spans, spelled } = this;
    const started = performance.now();
    const causal = this.run.trace.causal;
    let peak = 0;
    for (const v of values) if (v > peak) peak = v;
    for (let j = 0; j < spans.length; j++) {
      const span = spans[j];
      const weight = values[j];
      const step = Math.round((peak > 0 ? weight / peak : 0) * 255); // as shade() rounds it
      const { background, dark } = SHADES[Math.min(255, Math.max(0, step))];
      span.style.backgroundColor = background;
      span.classList.toggle("dark", dark);
      span.classList.toggle("masked", causal && j > q); // after the query: a causal model cannot look there
      span.dataset.weight = String(weight); // its title is written when hovered (onHover), not 8,192 a row
    }
    this.values = values;
    const top = topK(values, values.length, 0, LONG_TOP_K);
    const entry = ({ index, weight }) => {
      const options = { className: "link lt-top", attrs: { type: "button" }, data: { index, weight } };
      const button = el("button", options, topParts(spelled, index, weight, 4));
      return el("li", {}, [button]);
    };
    this.els.top.replaceChildren(...top.map(entry));
    const { heads, kv_heads: kvHeads } = this.run.trace;
    const masked = causal ? "; tokens after it are masked (greyed): a causal model cannot look ahead" : "";
    this.els.caption.textContent =
      `${quoted(spelled[q])} (token ${q}) in ${selectionLabel(layer, head, { heads, kvHeads })}: each token ` +
      `shaded by its weight ÷ the largest (${peak.toFixed(4)}), exact${masked}. ` +
      `Its ${top.length} strongest keys are listed below; choose one to scroll to it.`;
    const state = { q: String(q), layer: String(layer), head: String(head), state: "ready" };
    Object.assign(this.els.panel.dataset, state);
    performance.measure("headscope-long-row", { start: started });
  }
}
