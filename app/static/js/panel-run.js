// One streamed request of an analysis panel ("Find heads", "Which heads matter"): the panel's button,
// progress bar, message and data-state through loading, ready or error, and its AbortController: a new
// request (another click, a new run or model) aborts the one in flight, and the panel goes back to what it
// showed. A request still running after FORWARD_MS shows the panel's Cancel, as a long forward does
// (work-progress.js): it aborts the request, whose closed connection stops the server's work before its next
// chunk. The owner holds els ({ button, cancel, progress, message, panel }), signal (the run's, or null),
// controller and result.

import { ApiError } from "./api.js";
import { FORWARD_MS } from "./work-progress.js";

/**
 * Run `request(signal, onProgress)` for `owner`, saying `loading` meanwhile; onProgress(done, total, text)
 * moves the bar. Its answer becomes owner.result and `show(result)` draws it; a refused request
 * (`refused(error)`: the service's own words) says its message, any other failure `${failed}: ${message}`.
 */
export async function runPanel(owner, { loading, failed, refused, request, show }) {
  owner.controller?.abort();
  const controller = new AbortController();
  owner.controller = controller;
  const signal = AbortSignal.any([owner.signal, controller.signal].filter(Boolean));
  const { button, cancel, progress, message, panel } = owner.els;
  let cancelled = false;
  const stop = () => {
    cancelled = true;
    controller.abort();
  };
  cancel.addEventListener("click", stop, { once: true });
  const offer = setTimeout(() => (cancel.hidden = false), FORWARD_MS);
  button.disabled = true;
  progress.hidden = false;
  progress.removeAttribute("value"); // indeterminate until the first report (none for a short request)
  message.textContent = loading;
  panel.dataset.state = "loading";
  const onProgress = (done, total, text) => {
    progress.max = total;
    progress.value = done;
    message.textContent = text;
  };
  try {
    const result = await request(signal, onProgress);
    if (signal.aborted) return;
    owner.result = result;
    message.textContent = "";
    await show(result);
    panel.dataset.state = "ready";
  } catch (error) {
    if (signal.aborted) return;
    const said = error instanceof ApiError && refused(error);
    message.textContent = said ? error.message : `${failed}: ${error.message}`;
    panel.dataset.state = "error";
  } finally {
    clearTimeout(offer);
    cancel.removeEventListener("click", stop);
    if (owner.controller === controller) {
      // Not taken over by another request: the panel is this one's to settle. Aborted (a new run started),
      // it goes back to what it showed; the new run's own request follows.
      owner.controller = null;
      progress.hidden = true;
      cancel.hidden = true;
      button.disabled = false;
      if (signal.aborted) {
        message.textContent = cancelled ? "Cancelled." : "";
        panel.dataset.state = owner.result ? "ready" : "idle";
      }
    }
  }
}
