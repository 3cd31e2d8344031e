// Token view (the one people know from bertviz): each token on the left draws lines to the tokens it
// attends to on the right; line opacity and width follow the weight, its colour the head (one head, or
// every head of a layer: lines.js). Hovering a token isolates its lines; a tap, or Enter on the focused
// drawing, pins that isolation until Escape or a second tap. A line's values show on hover, tap or
// ←/→ through a pinned token's lines. SVG, with every token written through textContent.

import { displayToken } from "./decoder.js";
import { svg } from "./dom.js";
import { collectLines, lineText } from "./lines.js";

const ROW_PX = 20;
const TEXT_PX = 150; // at most, for each column of tokens
const MIN_GAP_PX = 60;
const HEAD_SPREAD_PX = 10; // the heads of a layer fan out over this much of a row, so their lines do not coincide
const MAX_GAP_PX = 420; // wider, the lines flatten out and read worse
const DEFAULT_WIDTH_PX = 520; // for a panel not laid out yet

/** Widths of the token columns and the gap between them for a panel `widthPx` wide (0: not laid out). */
export function tokenLayout(widthPx) {
  const width = Math.min(widthPx > 0 ? widthPx : DEFAULT_WIDTH_PX, 2 * TEXT_PX + MAX_GAP_PX);
  const text = Math.min(TEXT_PX, Math.floor((width - MIN_GAP_PX) / 2));
  return { width, text, gap: width - 2 * text };
}

/** Weights below this are not drawn; larger inputs prune harder so the SVG stays light. */
export function lineThreshold(n) {
  return n <= 64 ? 0.01 : n <= 192 ? 0.03 : 0.06;
}

/**
 * Draw into `container`. `heads` is [{h, values, color, dash, slot}] (values n*n row-major; slot in
 * [-0.5, 0.5] places the head's line ends within a row); or one head's `values` alone. With `keyTokens`
 * (cross-attention) the right column is that other sentence, values n*cols: the drawing is the alignment of
 * the two, and `sides` {left, right} heads each column with its sentence's name. `keep(i, j)` filters
 * lines (pairs), `budget` caps them, `pinned` ({side, index} or null) is the token isolated at first;
 * `onPin(pin)` hears a change of it, `onRead(text)` each line or token read out. Returns {drawn, threshold, cut}.
 */
export function renderTokenView(container, spec) {
  const drawing = drawTokenView(container.clientWidth, spec);
  const isolation = new Isolation(drawing, spec);
  bindPointer(drawing, isolation);
  bindKeys(drawing, isolation);
  // A redraw (the exact head arriving, a swatch) replaces the drawing: keyboard focus stays in it, or the
  // next arrow key would move the page's head selection instead of the cursor.
  const focused = container.contains(document.activeElement);
  container.replaceChildren(drawing.root);
  if (focused) drawing.root.focus({ preventScroll: true });
  return { drawn: drawing.lines.length, threshold: drawing.threshold, cut: drawing.cut };
}

/**
 * The drawing for a panel `widthPx` wide: the lines above the threshold (within `budget`) and both columns
 * of tokens, in an SVG that is not on the page yet. Returns its parts, what the lines are, and `read`, which
 * says a line in words.
 */
function drawTokenView(widthPx, spec) {
  const { tokens: raw, values, causal, layer = 0, head = 0, exact = false, keep, budget = Infinity, byteLevel } = spec;
  const heads = spec.heads ?? [{ h: head, values, color: null, dash: "", slot: 0 }];
  const tokens = raw.map((token) => displayToken(token, byteLevel)); // the page's spelling, drawn and exported
  const keyTokens = spec.keyTokens ? spec.keyTokens.map((token) => displayToken(token, byteLevel)) : tokens;
  const n = tokens.length;
  const cols = keyTokens.length;
  const { width, text: textPx, gap: gapPx } = tokenLayout(widthPx);
  const top = spec.sides ? ROW_PX : 0; // a row for the columns' headings
  const height = top + Math.max(n, cols) * ROW_PX + 10;
  const at = { textPx, gapPx, leftX: textPx - 6, rightX: textPx + gapPx + 6, y: (i) => top + 5 + i * ROW_PX + ROW_PX / 2 };
  const threshold = lineThreshold(Math.max(n, cols));
  const { lines, cut } = collectLines(heads, { n, cols, causal, threshold, keep, budget });
  const read = (line) => lineText({ layer, ...line }, tokens, { exact, keyTokens });

  const root = svg("svg", {
    class: "token-lines",
    width,
    height,
    viewBox: `0 0 ${width} ${height}`,
    tabindex: 0,
    role: "group",
    "aria-label":
      "Attention from each query token (left) to key tokens (right). ↑/↓ choose a token, Enter shows only its " +
      "lines, ←/→ read them one by one, Escape shows all again.",
  });
  const { links, groups } = drawLinks(lines, heads, n, at);
  const columns = drawColumns(tokens, keyTokens, spec, at);
  root.append(links, columns);
  if (spec.sides) root.append(drawSides(spec.sides, at));
  return { root, links, columns, groups, lines, cut, threshold, tokens, keyTokens, n, cols, read };
}

/** The lines, one group per query token (`data-i`), each line styled by its head. */
function drawLinks(lines, heads, n, { textPx, gapPx, y }) {
  const style = new Map(heads.map((entry) => [entry.h, entry]));
  const links = svg("g", { class: "links" });
  const groups = Array.from({ length: n }, (_, i) => svg("g", { "data-i": i }));
  lines.forEach((line, k) => {
    const { color, dash, slot } = style.get(line.h);
    const dy = slot * HEAD_SPREAD_PX;
    const attrs = { x1: textPx, y1: y(line.i) + dy, x2: textPx + gapPx, y2: y(line.j) + dy };
    Object.assign(attrs, { "data-j": line.j, "data-h": line.h, "data-k": k });
    if (color) attrs.stroke = color; // an attribute, not CSS, so the SVG export keeps the colours
    if (dash) attrs["stroke-dasharray"] = dash;
    attrs["stroke-opacity"] = Math.min(1, line.w).toFixed(3);
    attrs["stroke-width"] = (1 + 3 * Math.min(1, line.w)).toFixed(2);
    groups[line.i].append(svg("line", attrs, undefined));
  });
  links.append(...groups);
  return { links, groups };
}

/** The query tokens right-aligned on the left (`data-i`), the key tokens on the right (`data-j`). */
function drawColumns(tokens, keyTokens, { segments, special, keySpecial, keyTokens: other }, { leftX, rightX, y }) {
  const n = tokens.length;
  const cols = keyTokens.length;
  const keyMarks = other ? keySpecial : special;
  const columns = svg("g", { class: "columns" });
  const cls = (k, marks) => `tok${segments?.[k] === 1 && !other ? " seg1" : ""}${marks?.[k] ? " special" : ""}`;
  for (let k = 0; k < Math.max(n, cols); k++) {
    if (k < n) columns.append(svg("text", { class: `${cls(k, special)} left`, x: leftX, y: y(k), "text-anchor": "end", "data-i": k }, tokens[k]));
    if (k >= cols) continue;
    const attrs = { class: `${cls(k, keyMarks)} right`, x: rightX, y: y(k), "text-anchor": "start", "data-j": k };
    columns.append(svg("text", attrs, keyTokens[k]));
  }
  return columns;
}

/** Each column's heading: the name of its sentence (cross-attention). */
function drawSides({ left, right }, { leftX, rightX }) {
  const at = 5 + ROW_PX / 2;
  const sides = svg("g", { class: "sides" });
  sides.append(
    svg("text", { class: "side-title", x: leftX, y: at, "text-anchor": "end" }, left),
    svg("text", { class: "side-title", x: rightX, y: at, "text-anchor": "start" }, right),
  );
  return sides;
}

/**
 * What one drawing isolates: a query token (left) shows only its own lines; a key token (right) only the
 * lines into it. A pinned token stays isolated; the cursor is the query token the arrow keys are on, and
 * `step` which of the pinned token's lines ←/→ is on.
 */
class Isolation {
  constructor(drawing, { pinned = null, onPin = () => {}, onRead = () => {} }) {
    this.drawing = drawing;
    this.onPin = onPin;
    this.onRead = onRead;
    const { n, cols } = drawing;
    this.pin = pinned && pinned.index < (pinned.side === "left" ? n : cols) ? pinned : null;
    this.cursor = this.pin?.side === "left" ? this.pin.index : -1;
    this.step = -1;
    this.isolate(this.pin);
    // A redraw (another head, a swatch) keeps a pinned token and says what it shows.
    this.onRead(this.pin ? this.summary(this.pin) : "");
  }

  textOf({ side, index }) {
    return this.drawing.columns.querySelector(`text.${side}[data-${side === "left" ? "i" : "j"}="${index}"]`);
  }

  linesOf({ side, index }) {
    const { groups, links } = this.drawing;
    return side === "left" ? [...groups[index].children] : [...links.querySelectorAll(`line[data-j="${index}"]`)];
  }

  /** Give the class `selector` names (".active") to `nodes` alone. */
  mark(selector, nodes) {
    for (const node of this.drawing.root.querySelectorAll(selector)) node.classList.remove(selector.slice(1));
    for (const node of nodes) node.classList.add(selector.slice(1));
  }

  isolate(target) {
    this.drawing.root.classList.toggle("isolate", target !== null);
    this.mark(".active", target ? [this.textOf(target), ...this.linesOf(target)] : []);
  }

  /** A token's lines in words: how many, and the strongest three. */
  summary(target) {
    const { lines, tokens, keyTokens, threshold, read } = this.drawing;
    const strongest = this.linesOf(target)
      .map((node) => lines[Number(node.dataset.k)])
      .sort((a, b) => b.w - a.w);
    const name = `'${(target.side === "left" ? tokens : keyTokens)[target.index]}' (${target.side === "left" ? "query" : "key"})`;
    if (strongest.length === 0) return `${name}: no line above ${threshold}.`;
    const top = strongest.slice(0, 3).map(read).join("; ");
    return `${name}: ${strongest.length} line(s); strongest ${top}.`;
  }

  setPin(target) {
    this.pin = target;
    this.step = -1;
    this.mark(".current", []);
    this.isolate(this.pin);
    this.onPin(this.pin);
    this.onRead(this.pin ? this.summary(this.pin) : "");
  }

  /** ←/→ (`by` +1 or -1): the pinned token's next line, strongest first, read out; false when it has none. */
  stepLine(by) {
    const { lines, read } = this.drawing;
    const own = this.linesOf(this.pin).sort((a, b) => lines[Number(b.dataset.k)].w - lines[Number(a.dataset.k)].w);
    if (own.length === 0) return false;
    this.step = (this.step + (by > 0 ? 1 : own.length - 1)) % own.length;
    this.mark(".current", [own[this.step]]);
    this.onRead(read(lines[Number(own[this.step].dataset.k)]));
    return true;
  }
}

/** Hover isolates a token (unless one is pinned), a tap pins or unpins it; hover or tap on a line reads it. */
function bindPointer({ columns, links, lines, read }, isolation) {
  const targetOf = (text) => {
    const side = text.classList.contains("left") ? "left" : "right";
    return { side, index: Number(side === "left" ? text.dataset.i : text.dataset.j) };
  };
  columns.addEventListener("mouseover", (event) => {
    const text = event.target.closest("text");
    if (!text || isolation.pin) return;
    isolation.isolate(targetOf(text));
  });
  columns.addEventListener("mouseleave", () => isolation.isolate(isolation.pin));
  columns.addEventListener("click", (event) => {
    const text = event.target.closest("text");
    if (!text) return;
    const target = targetOf(text);
    const { pin } = isolation;
    isolation.setPin(pin && pin.side === target.side && pin.index === target.index ? null : target);
  });
  const readLine = (event) => {
    const line = event.target.closest("line");
    if (line) isolation.onRead(read(lines[Number(line.dataset.k)]));
  };
  links.addEventListener("mouseover", readLine);
  links.addEventListener("click", readLine);
}

/** ↑/↓ move the cursor over the query tokens, Enter or Space pins it, ←/→ read its lines, Escape unpins. */
function bindKeys({ root, n }, isolation) {
  root.addEventListener("keydown", (event) => {
    const { key } = event;
    if (key === "ArrowUp" || key === "ArrowDown") {
      isolation.cursor = Math.max(0, Math.min(n - 1, isolation.cursor + (key === "ArrowUp" ? -1 : 1)));
      const target = { side: "left", index: isolation.cursor };
      isolation.mark(".cursor", [isolation.textOf(target)]);
      if (isolation.pin) isolation.setPin(target);
      else isolation.onRead(isolation.summary(target));
    } else if (key === "Enter" || key === " ") {
      if (isolation.cursor < 0) isolation.cursor = 0;
      isolation.setPin(isolation.pin ? null : { side: "left", index: isolation.cursor });
      isolation.mark(".cursor", [isolation.textOf({ side: "left", index: isolation.cursor })]);
    } else if ((key === "ArrowLeft" || key === "ArrowRight") && isolation.pin) {
      if (!isolation.stepLine(key === "ArrowRight" ? 1 : -1)) return; // no line to step to: the page hears the key
    } else if (key === "Escape" && isolation.pin) {
      isolation.setPin(null);
    } else {
      return;
    }
    event.preventDefault();
    event.stopPropagation(); // the page's arrow keys move the head selection; here they move in the drawing
  });
}
