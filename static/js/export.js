// Export of the run on screen: the detail figure as PNG or SVG (Plotly), the token lines as SVG, or the
// whole answer as JSON (POST /api/attention, under the run's AbortSignal) with the tokens as the page spells
// them beside the raw ones (display_tokens).

import { $, el } from "./dom.js";
import { ApiError, fetchFullBlob } from "./api.js";
import { setBusy, showError } from "./form.js";
import { withDisplayTokens } from "./decoder.js";
import { exportImage } from "./heatmap.js";
import { exportName } from "./labels.js";
import { getState } from "./state.js";

function download(blob, filename) {
  const url = URL.createObjectURL(blob);
  const a = el("a", { attrs: { href: url, download: filename } });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

/** Export `run` (null before the first run) as "png", "svg" or "json". */
export async function exportAs(run, format) {
  if (!run) {
    showError("Run a sentence first, then export it.");
    return;
  }
  showError("");
  const { layer, head, view } = getState();
  const name = exportName(run.attention.model, layer, head);
  try {
    if (format === "json") {
      setBusy("Preparing JSON…");
      download(withDisplayTokens(await fetchFullBlob(run.query, { signal: run.signal }), run.attention), `${name}.json`);
      setBusy("");
    } else if (view === "tokens" && format === "svg") {
      const source = new XMLSerializer().serializeToString($("tokenView").querySelector("svg"));
      download(new Blob([source], { type: "image/svg+xml" }), `${name}-tokens.svg`);
    } else {
      await exportImage($("headDetail"), format, name);
    }
  } catch (error) {
    if (run.signal.aborted) return; // a new run took over; its own status line stays
    setBusy("");
    showError(error instanceof ApiError ? error.message : `Export failed: ${error.message}`);
  }
}
