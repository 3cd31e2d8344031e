// The detail's colour-scale menu (#color-scale): its options are scale.js SCALES, its value the state's
// `scale` (so a link or a rerun keeps it). Token lines draw each weight as a line's own opacity and
// width, with no colour scale: there the menu is disabled and a note says why.

import { $, el } from "./dom.js";
import { SCALES } from "./scale.js";
import { getState, subscribe, update } from "./state.js";

export const TOKEN_LINES_NOTE = "Token lines draw each weight as it is (no colour scale).";

/** Fill the menu, keep it in step with the state, and write a choice to the state. */
export function initScaleMenu() {
  const select = $("colorScale");
  const note = $("colorScaleNote");
  select.replaceChildren(
    ...Object.entries(SCALES).map(([value, { label }]) => el("option", { text: label, attrs: { value } })),
  );
  note.textContent = TOKEN_LINES_NOTE;
  const mirror = (state) => {
    select.value = state.scale;
    const lines = state.view === "tokens";
    select.disabled = lines;
    select.title = lines ? TOKEN_LINES_NOTE : "";
    note.hidden = !lines;
  };
  select.addEventListener("change", () => update({ scale: select.value }));
  subscribe((state, changed) => {
    if (changed.has("scale") || changed.has("view")) mirror(state);
  });
  mirror(getState());
}
