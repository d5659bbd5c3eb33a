// Shared helpers of the replay-policy and recovery e2e tests: they build on harness.mjs
// (one server + one browser per file) and drive the demo page through `window.demo`.
import assert from 'node:assert/strict';
import { signInThroughUi } from './harness.mjs';

/**
 * Starts recording every message the worker sends the page (reports and answers) in
 * `window.__reports`. Idempotent per page load.
 */
export async function captureReports(page) {
  await page.evaluate(() => {
    if (window.__reportsInstalled) return;
    window.__reportsInstalled = true;
    window.__reports = [];
    window.demo.client.on('*', (m) => { window.__reports.push(JSON.parse(JSON.stringify(m))); });
  });
}

/** Forgets the reports received so far. */
export async function clearReports(page) {
  await page.evaluate(() => { window.__reports.length = 0; });
}

/** The reports (not command answers) received since the last clearReports. */
export async function reports(page) {
  return page.evaluate(() => window.__reports.filter((m) => m.type !== 'COMMAND_RESULT' && m.type !== 'QUEUE_STATE'));
}

/**
 * Waits until a flush summary (MUTATIONS_REPLAYED or MUTATIONS_PARTIAL) has arrived since
 * the last clearReports, and returns {blocked, summary}: the MUTATIONS_BLOCKED sent just
 * before that summary, and the summary.
 */
export async function waitForFlushReports(page, { timeout = 20000 } = {}) {
  await page.waitForFunction(
    () => window.__reports.some((m) => m.type === 'MUTATIONS_REPLAYED' || m.type === 'MUTATIONS_PARTIAL'),
    null, { timeout },
  );
  const all = await reports(page);
  const at = all.findIndex((m) => m.type === 'MUTATIONS_REPLAYED' || m.type === 'MUTATIONS_PARTIAL');
  const blocked = all.slice(0, at).reverse().find((m) => m.type === 'MUTATIONS_BLOCKED');
  return { blocked, summary: all[at], all };
}

/** One API call through the page (`window.demo.api`: CSRF and expected account set as the demo does). */
export async function apiCall(page, method, path, body) {
  return page.evaluate(([m, p, b]) => window.demo.api(m, p, b ?? undefined), [method, path, body ?? null]);
}

/** A write that must be queued by the worker: asserts the 202 and returns its body. */
export async function queuedWrite(page, path, body, method = 'POST') {
  const r = await apiCall(page, method, path, body);
  assert.equal(r.status, 202, `${method} ${path} should have been queued: ${JSON.stringify(r)}`);
  assert.equal(r.body?.queued, true, `${method} ${path}: ${JSON.stringify(r)}`);
  assert.equal(typeof r.body.id, 'number');
  assert.match(r.body.idempotencyKey, /^[A-Za-z0-9_-]{22,64}$/);
  return { ...r.body, key: r.body.idempotencyKey, path, method, body };
}

/** LIST_QUEUE's records. */
export async function listQueue(page) {
  const qs = await page.evaluate(() => window.demo.client.list());
  assert.equal(qs.type, 'QUEUE_STATE', `LIST_QUEUE answered ${JSON.stringify(qs)}`);
  return qs.records;
}

/** FLUSH_QUEUE; asserts it was answered as a COMMAND_RESULT and returns the answer. */
export async function flush(page) {
  const r = await page.evaluate(() => window.demo.client.flush());
  assert.equal(r.type, 'COMMAND_RESULT');
  assert.equal(r.command, 'FLUSH_QUEUE');
  return r;
}

/** Signs in through the form and waits until the page has bound the worker and flushed. */
export async function signIn(page, userId) {
  await signInThroughUi(page, userId);
  await page.waitForFunction(() => window.demo.sessionSynced === true, null, { timeout: 30000 });
}

/**
 * Signs out through the demo's button; when the device holds unsent work the demo asks,
 * and this answers "Sign out, keep them here".
 */
export async function signOutThroughUi(page) {
  await page.getByTestId('sign-out').click();
  const form = page.getByTestId('login-form');
  const keep = page.getByTestId('signout-keep');
  await Promise.race([form.waitFor({ state: 'visible' }), keep.waitFor({ state: 'visible' })]);
  if (await keep.isVisible()) await keep.click();
  await form.waitFor({ state: 'visible' });
  await page.waitForFunction(() => window.demo.state.user === null && window.demo.sessionSynced === false);
}

/**
 * A clean start for one test: queue and session cleared in the worker, the server reset
 * (data, ledger, sessions, faults, logs), and the page reloaded, signed out.
 */
export async function freshStart(h) {
  let page = h.context.pages()[0];
  if (page && await page.evaluate(() => Boolean(window.demo?.client)).catch(() => false)) {
    const r = await page.evaluate(() => window.demo.client.clearDevice());
    assert.equal(r.ok, true, `CLEAR_DEVICE refused: ${JSON.stringify(r)}`);
  }
  await h.reset();
  page = await h.openDemo({ page });
  await page.evaluate(() => window.demo.ready);
  await page.getByTestId('login-form').waitFor({ state: 'visible' });
  await captureReports(page);
  assert.deepEqual(await listQueue(page), [], 'a fresh start has an empty queue');
  return page;
}

/** The requests log's writes (auth routes excluded), optionally after a seq. */
export function writesIn(requests, afterSeq = -Infinity) {
  return requests.filter((r) => r.seq > afterSeq && r.method !== 'GET' && !/^\/api\/auth(\/|$)/i.test(r.path));
}

/** The highest seq in the requests log so far (-1 when empty). */
export async function lastSeq(h) {
  const rs = await h.requests();
  return rs.length ? Math.max(...rs.map((r) => r.seq)) : -1;
}

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

/**
 * Follows the service worker's running status through CDP (ServiceWorker domain):
 * `statuses` is every runningStatus seen in order, `current()` the latest.
 */
export async function watchWorker(h, page) {
  const cdp = await h.context.newCDPSession(page);
  const statuses = [];
  cdp.on('ServiceWorker.workerVersionUpdated', (e) => {
    for (const v of e.versions) if (v.status === 'activated') statuses.push(v.runningStatus);
  });
  await cdp.send('ServiceWorker.enable');
  return {
    statuses,
    current: () => statuses[statuses.length - 1],
    /** Waits until the worker reports `status`. */
    waitFor: (status, timeout = 10000) => eventually(() => statuses[statuses.length - 1] === status,
      { timeout, interval: 50, what: `the worker to be ${status} (seen: ${statuses.join(', ')})` }),
    detach: () => cdp.detach().catch(() => {}),
  };
}
