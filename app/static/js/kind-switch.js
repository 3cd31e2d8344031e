// The kind switch of encoder-decoder models (`#kind-switch`, radios named "kind": one tab stop, the arrow
// keys choose): encoder self-attention, decoder self-attention or cross-attention, as state `kind`. Hidden
// for every other model, whose one attention is the encoder's or the decoder's own.

import { $ } from "./dom.js";

/** Each choice calls `onChoose(kind)`. */
export function bindKindSwitch(onChoose) {
  for (const radio of $("kindSwitch").querySelectorAll("input[name=kind]")) {
    radio.addEventListener("change", () => radio.checked && onChoose(radio.value));
  }
}

/** Show the switch (or hide it: `visible` false) with `kind` checked. */
export function showKindSwitch(visible, kind) {
  const box = $("kindSwitch");
  box.hidden = !visible;
  for (const radio of box.querySelectorAll("input[name=kind]")) radio.checked = radio.value === kind;
}
