// plotly.js for the views that draw with it (the head detail: heatmap.js, long-detail.js, corpus-head.js).
// On the served page a deferred classic script runs plotly.js before the modules, so plotlyReady() resolves
// at once. A snapshot file (app/snapshot/) carries plotly.js as text, a <script type="text/plain"
// id="plotly-source"> block that never runs by itself: evaluating its 1.5 MB before the page's script would
// hold back every thumbnail (the grid needs no Plotly: grid.js paints canvases). loadPlotly() runs it once the
// grid is drawn and painted, as an inline script whose text is the block's, which the file's
// Content-Security-Policy allows by its hash (a hash-source matches any inline script, inserted or parsed).

const SOURCE_ID = "plotly-source";
// rAF never fires in a hidden or off-screen frame (a notebook output scrolled away): past this, load anyway.
const PAINT_FALLBACK_MS = 100;

let waiting = null; // {promise, resolve, reject} while the carried source has not run
let started = false;

function pending() {
  if (!waiting) {
    let resolve;
    let reject;
    const promise = new Promise((yes, no) => ((resolve = yes), (reject = no)));
    waiting = { promise, resolve, reject };
  }
  return waiting;
}

/** Resolves with window.Plotly once plotly.js has run; rejects where the page has no plotly.js at all. */
export function plotlyReady() {
  if (window.Plotly) return Promise.resolve(window.Plotly);
  if (!document.getElementById(SOURCE_ID) && !started) {
    return Promise.reject(new Error("plotly.js did not load, so the head detail cannot be drawn"));
  }
  return pending().promise;
}

/** Run `callback` once, after the next paint: a frame, then a task; or after PAINT_FALLBACK_MS, whichever comes first. */
function afterPaint(callback) {
  let done = false;
  const once = () => {
    if (done) return;
    done = true;
    callback();
  };
  requestAnimationFrame(() => setTimeout(once, 0)); // rAF runs before the frame's paint; the task after it
  setTimeout(once, PAINT_FALLBACK_MS);
}

function evaluate(source) {
  const script = document.createElement("script");
  script.textContent = source.textContent; // exactly the text the policy's hash was taken of
  source.remove(); // the text lives on in the script: not twice in the document
  document.head.append(script); // an inline classic script runs as it is inserted
  const { resolve, reject } = pending();
  if (window.Plotly) resolve(window.Plotly);
  else reject(new Error("plotly.js did not run (refused by the file's Content-Security-Policy?)"));
}

/** In a snapshot file, run the carried plotly.js after the next paint (once; a no-op on the served page). */
export function loadPlotly() {
  const source = document.getElementById(SOURCE_ID);
  if (started || window.Plotly || !source) return;
  started = true;
  pending();
  afterPaint(() => evaluate(source));
}
