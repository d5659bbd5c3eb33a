// Helpers shared by the Chromium-only suites built on tests/e2e/harness.mjs (tests/interop,
// tests/bundler). The end-to-end scenarios' helpers are tests/e2e-engines/outbox-helpers.mjs.

/** Polls `fn` until it returns a truthy value; returns it. */
export async function eventually(fn, { timeout = 15000, interval = 100, what = 'condition' } = {}) {
  const end = Date.now() + timeout;
  let last;
  for (;;) {
    last = await fn();
    if (last) return last;
    if (Date.now() > end) throw new Error(`timed out after ${timeout} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, interval));
  }
}

/**
 * Runs a test body, appending the browser's and the server's last words to a failure.
 * `harness` is the harness or a function returning it (it is made in `before`).
 */
export function withDiagnostics(harness, fn) {
  return async (t) => {
    try {
      await fn(t);
    } catch (err) {
      const h = typeof harness === 'function' ? harness() : harness;
      if (h && err && typeof err === 'object') err.message += `\n${h.diagnostics()}`;
      throw err;
    }
  };
}
