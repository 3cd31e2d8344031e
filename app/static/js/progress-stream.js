// A progress stream read as it arrives: POST /api/trace, /api/head-effects and /api/attention/progress
// answer NDJSON (one JSON object a line: progress lines, and for the last a model's load lines, then the
// done event, or an error line; app/service/progress.py, work_progress.py). Pure but for fetch, so tests/js/
// imports it as the page does.

import { ApiError, describeDetail, post } from "./api.js";

/**
 * Split a stream's text into complete lines: returns [lines, rest], `rest` the unfinished tail to prepend
 * to the next chunk. Pure (tests/js/).
 */
export function splitLines(buffer) {
  const lines = buffer.split("\n");
  const rest = lines.pop();
  return [lines.filter((line) => line.trim()), rest];
}

/**
 * POST `body` to `path`, read as it streams (fetch + ReadableStream + TextDecoderStream): `onProgress(event)`
 * for each progress line, `onLoad(event)` for each load line; resolves with the done event. A 4xx before the stream throws ApiError (post's);
 * an error line throws ApiError with its detail (`failed` when it has none), and a stream that ends without
 * its done event ApiError(`ended`).
 */
export async function streamProgress(path, body, { signal, onProgress = () => {}, onLoad = () => {}, failed, ended }) {
  const response = await post(path, body, signal);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let rest = "";
  let done = null;
  for (;;) {
    const { value, done: finished } = await reader.read();
    const [lines, tail] = splitLines(rest + (value ?? "") + (finished ? "\n" : ""));
    rest = tail;
    for (const line of lines) {
      const event = JSON.parse(line);
      if (event.event === "progress") onProgress(event);
      else if (event.event === "load") onLoad(event);
      else if (event.event === "error") throw new ApiError(describeDetail(event.detail) || failed, 500);
      else if (event.event === "done") done = event;
    }
    if (finished) break;
  }
  if (!done) throw new ApiError(ended, 0);
  return done;
}
