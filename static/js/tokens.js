// Token view (the one people know from bertviz): each token on the left draws lines to the tokens it
// attends to on the right; line opacity and width follow the weight. Hovering a token isolates its
// lines. SVG, with every token written through textContent.

import { displayToken } from "./decoder.js";
import { svg } from "./dom.js";

const ROW_PX = 20;
const TEXT_PX = 150; // at most, for each column of tokens
const MIN_GAP_PX = 60;
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

/** Draw into `container`; `values` is n*n row-major. Returns the number of lines drawn. */
export function renderTokenView(container, { tokens: raw, values, segments, special, causal, exact = false }) {
  const tokens = raw.map(displayToken); // the page's spelling, in the drawing and its SVG export
  const n = tokens.length;
  const { width, text: textPx, gap: gapPx } = tokenLayout(container.clientWidth);
  const height = n * ROW_PX + 10;
  const leftX = textPx - 6;
  const rightX = textPx + gapPx + 6;
  const y = (i) => 5 + i * ROW_PX + ROW_PX / 2;
  const threshold = lineThreshold(n);

  const root = svg("svg", {
    class: "token-lines",
    width,
    height,
    viewBox: `0 0 ${width} ${height}`,
    role: "img",
    "aria-label": "Attention from each query token (left) to key tokens (right)",
  });
  const links = svg("g", { class: "links" });
  let drawn = 0;
  for (let i = 0; i < n; i++) {
    const group = svg("g", { "data-i": i });
    for (let j = 0; j < (causal ? i + 1 : n); j++) {
      const w = values[i * n + j];
      if (!(w >= threshold)) continue; // NaN too: the first token hidden, or a row with nothing left
      group.append(
        svg("line", {
          x1: textPx,
          y1: y(i),
          x2: textPx + gapPx,
          y2: y(j),
          "data-j": j,
          "stroke-opacity": Math.min(1, w).toFixed(3),
          "stroke-width": (1 + 3 * w).toFixed(2),
        }),
      );
      drawn++;
    }
    links.append(group);
  }
  const columns = svg("g", { class: "columns" });
  for (let i = 0; i < n; i++) {
    const cls = `tok${segments?.[i] === 1 ? " seg1" : ""}${special?.[i] ? " special" : ""}`;
    columns.append(
      svg("text", { class: `${cls} left`, x: leftX, y: y(i), "text-anchor": "end", "data-i": i }, tokens[i]),
      svg("text", { class: `${cls} right`, x: rightX, y: y(i), "text-anchor": "start", "data-j": i }, tokens[i]),
    );
  }
  root.append(links, columns);

  // Hover isolation: a query token shows only its own lines; a key token only the lines into it.
  const clear = () => {
    root.classList.remove("isolate");
    for (const node of root.querySelectorAll(".active")) node.classList.remove("active");
  };
  columns.addEventListener("mouseover", (event) => {
    const text = event.target.closest("text");
    if (!text) return;
    clear();
    root.classList.add("isolate");
    text.classList.add("active");
    if (text.classList.contains("left")) {
      links.querySelector(`g[data-i="${text.dataset.i}"]`)?.classList.add("active");
    } else {
      for (const line of links.querySelectorAll(`line[data-j="${text.dataset.j}"]`)) line.classList.add("active");
    }
  });
  columns.addEventListener("mouseleave", clear);

  container.replaceChildren(root);
  container.dataset.lines = String(drawn);
  container.dataset.threshold = String(threshold);
  container.dataset.exact = String(exact); // the redraw with exact values resets any hover
  return drawn;
}
