// The head probe's own input as a run: "Find heads" opens a head on the sequence its scores came from (a
// start token, 50 random tokens, the same 50 again), where an induction head's stripe beside the diagonal
// is plain to see. The run's query carries `probe` ({seed, length}) instead of the text (api.js body), the
// form keeps the person's text, and a notice says what is on screen with a way back. In the URL as
// input=probe beside the probe's seed. Pure but for the notice's DOM, so tests/js/ import the rest.

import { $ } from "./dom.js";
import { PROBE_LENGTH } from "./probe.js";
import { inSnapshot } from "./snapshot-page.js";

/** The query of the probe's first sequence on `typed`'s model: every text option off (the API refuses them). */
export function probeQuery(typed, { seed }) {
  const off = { text: "", pair: "", words: false, weighting: "weight", newTokens: 0, chat: false };
  return { model: typed.model, ...off, probe: { seed, length: PROBE_LENGTH } };
}

/** What the notice says of a probe input. */
export function probeInputText({ seed, length }) {
  return (
    `Showing the head probe's input, not your text: a start token, ${length} random tokens (seed ${seed}) ` +
    "and the same tokens again. An induction head looks from each repeated token to the one after its first copy."
  );
}

/** Show (for a probe query) or hide the notice; its button calls onBack. */
export function showProbeInput(query, onBack) {
  const notice = $("probeInput");
  notice.hidden = !query?.probe;
  if (query?.probe) $("probeInputText").textContent = probeInputText(query.probe);
  $("probeInputBack").onclick = onBack;
  $("probeInputBack").hidden = inSnapshot(); // a snapshot carries this run alone: no text to go back to
}
