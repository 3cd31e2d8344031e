// The tests' fetch: what tests/js/*.test.mjs that read the API install as globalThis.fetch. Not a test
// file itself (node --test runs *.test.mjs).

/** fetch answering `chunks` (strings, sent one by one as the body streams) with `status`; records calls. */
export function fakeFetch(chunks, { status = 200, json = null } = {}) {
  const calls = [];
  globalThis.fetch = async (url, options) => {
    calls.push({ url, body: JSON.parse(options.body) });
    if (json) return new Response(JSON.stringify(json), { status, headers: { "Content-Type": "application/json" } });
    const encoder = new TextEncoder();
    const body = new ReadableStream({
      start(controller) {
        for (const chunk of chunks) controller.enqueue(encoder.encode(chunk));
        controller.close();
      },
    });
    return new Response(body, { status });
  };
  return calls;
}
