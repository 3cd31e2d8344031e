// Status a person must see where they look: the notice under the form (a truncated input), the reason PNG
// export is off in the token view, and "Copy link" with its confirmation beside the export buttons.

import { $ } from "./dom.js";

/**
 * The notice for a run's attention, or "" when there is nothing to say. A truncated input's prompt tokens
 * are exactly the limit the server applied; with words the page shows fewer items than that, so it names
 * `limit` (tokenLimit), when it knows it.
 */
export function truncationNotice(attention, { words = false, limit = null } = {}) {
  if (!attention?.truncated) return "";
  // Of a grid pooled into blocks (a snapshot past its size limit), the input's tokens, not the blocks.
  const prompt = (attention.header?.input_n ?? attention.n) - (attention.generated ?? 0);
  const rest = "the rest of the text was not read.";
  if (!words) return `Input truncated to ${prompt} tokens, the most this model reads here: ${rest}`;
  const cap = Number.isFinite(limit) ? `${limit} tokens` : "the model's token limit";
  return `Input truncated to ${cap}: the ${prompt} words shown are what fit; ${rest}`;
}

/** Show `message` in the notice under the form (hidden when empty). */
export function showNotice(message) {
  const box = $("notice");
  box.textContent = message;
  box.hidden = !message;
}

/** PNG export draws the heatmap only: off in the token view, with the reason shown and tied to the button. */
export function showExportAvailability(view) {
  const heatmap = view === "heatmap";
  $("exportPng").disabled = !heatmap;
  $("exportPng").title = heatmap ? "The heatmap as a PNG image" : $("exportPngReason").textContent;
  $("exportPngReason").hidden = heatmap;
}

let shareTimer = 0;

function confirmShare(message) {
  const status = $("shareStatus");
  status.textContent = message;
  clearTimeout(shareTimer);
  shareTimer = setTimeout(() => (status.textContent = ""), 6000); // long enough to read, then out of the way
}

// Without the async clipboard (an http page other than localhost, an old browser): copy from a selected,
// off-screen text field, the way pages did before navigator.clipboard.
function copyBySelection(text) {
  const field = document.createElement("textarea");
  field.value = text;
  field.setAttribute("readonly", "");
  field.style.position = "fixed";
  field.style.left = "-9999px";
  document.body.append(field);
  field.select();
  let copied = false;
  try {
    copied = document.execCommand("copy");
  } finally {
    field.remove();
  }
  return copied;
}

/** Copy the page's URL (it holds the view: state.js) and say so; on failure show the link to copy by hand. */
export async function copyLink() {
  const url = window.location.href;
  let copied = false;
  try {
    await navigator.clipboard.writeText(url);
    copied = true;
  } catch {
    copied = copyBySelection(url);
  }
  confirmShare(copied ? "Link copied: it reopens this view." : `Copy this link by hand: ${url}`);
  return copied;
}

/**
 * The token limit the server applies to `model` (its /api/models entry): the smaller of the model's own and
 * the page's `limits.max_tokens`; null when neither is known (a model not loaded yet).
 */
export function tokenLimit(model, limits = {}) {
  const known = [model?.max_tokens, limits?.max_tokens].filter(Number.isFinite);
  return known.length ? Math.min(...known) : null;
}
