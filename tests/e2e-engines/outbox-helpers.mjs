// Helpers of the scenarios: the demo driven through its page (`window.demo`), in any
// engine. Same names and signatures as tests/e2e/outbox-helpers.mjs (they take a page).
import assert from 'node:assert/strict';
import { describe, after, before } from 'node:test';
import { lacks, selectedEngines } from './engines.mjs';
import { installRecorders, signInThroughUi, startHarness } from './harness.mjs';

/**
 * Defines the scenarios of `body(engine, harness)` once per selected engine, in a
 * `describe` named `engine` (or `${engine}: ${name}`) with its own server and browser.
 * `harness()` is the harness once `before` has made it. `setup(engine)` may resolve with
 * more options of startHarness (e.g. the `www` it serves), `teardown(engine)` undoes it
 * after the browser and server are gone.
 */
export function forEachEngine(body, { name, setup, teardown } = {}) {
  for (const engine of selectedEngines()) {
    describe(name ? `${engine}: ${name}` : engine, () => {
      let h;
      before(async () => { h = await startHarness({ engine, ...(setup ? await setup(engine) : {}) }); });
      after(async () => {
        await h?.close();
        if (teardown) await teardown(engine);
      });
      body(engine, () => h);
    });
  }
}

/** Starts recording every message the worker sends the page (idempotent per load). */
export const captureReports = installRecorders;

/** Forgets the reports received so far. */
export const clearReports = (page) => page.evaluate(() => { window.__reports.length = 0; });

/** The reports (not command answers) received since the last clearReports. */
export const reports = (page) => page.evaluate(() => window.__reports.filter((m) => m.type !== 'COMMAND_RESULT' && m.type !== 'QUEUE_STATE'));

/** Every message (answers included) received since the last clearReports. */
export const messages = (page) => page.evaluate(() => window.__reports.slice());

/**
 * Waits until a flush summary (MUTATIONS_REPLAYED or MUTATIONS_PARTIAL) has arrived since
 * the last clearReports; returns {blocked, summary, all}, `blocked` being the
 * MUTATIONS_BLOCKED just before the summary. By default the first flush that ran under a
 * signed-in account (its report blocks nothing as `no-session`): a flush that met nobody
 * signed in (the worker's own triggers between a sign-out and a sign-in, where there is
 * no Background Sync; reconnectAs's hold) is passed over. `signedIn: false`: any flush.
 */
export async function waitForFlushReports(page, { timeout = 30000, signedIn = true } = {}) {
  const find = (all, under) => {
    for (let i = 0; i < all.length; i += 1) {
      if (all[i].type !== 'MUTATIONS_REPLAYED' && all[i].type !== 'MUTATIONS_PARTIAL') continue;
      const blocked = all.slice(0, i).reverse().find((m) => m.type === 'MUTATIONS_BLOCKED');
      // Every flush reports MUTATIONS_BLOCKED before its summary: a summary without one
      // is the end of a flush that began before the reports were cleared.
      if (!blocked) continue;
      if (under && blocked.blocked.some((b) => b.reason === 'no-session')) continue;
      return { blocked, summary: all[i], all };
    }
    return null;
  };
  let found = null;
  await page.waitForFunction(() => window.__reports.some((m) => m.type === 'MUTATIONS_REPLAYED' || m.type === 'MUTATIONS_PARTIAL'),
    null, { timeout });
  const end = Date.now() + timeout;
  while (!(found = find(await reports(page), signedIn))) {
    if (Date.now() > end) throw new Error(`no flush under a signed-in account reported within ${timeout} ms: ${JSON.stringify(await reports(page))}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  return found;
}

/** One API call through the page (`window.demo.api`: CSRF and expected account as the demo sets them). */
export const apiCall = (page, method, path, body) => page.evaluate(([m, p, b]) => window.demo.api(m, p, b ?? undefined), [method, path, body ?? null]);

/** A write that must be queued by the worker: asserts the 202 and returns its body. */
export async function queuedWrite(page, path, body, method = 'POST') {
  const r = await apiCall(page, method, path, body);
  assert.equal(r.status, 202, `${method} ${path} should have been queued: ${JSON.stringify(r)}`);
  assert.equal(r.body?.queued, true, `${method} ${path}: ${JSON.stringify(r)}`);
  assert.equal(typeof r.body.id, 'number');
  assert.match(r.body.idempotencyKey, /^[A-Za-z0-9_-]{22,64}$/);
  return { ...r.body, key: r.body.idempotencyKey, path, method, body };
}

/** Any command through the page helper; resolves with the worker's answer. */
export const send = (page, message) => page.evaluate((m) => window.demo.client.send(m, { timeoutMs: 20000 }), message);

/** LIST_QUEUE's records. */
export async function listQueue(page) {
  const qs = await page.evaluate(() => window.demo.client.list());
  assert.equal(qs.type, 'QUEUE_STATE', `LIST_QUEUE answered ${JSON.stringify(qs)}`);
  return qs.records;
}

/** FLUSH_QUEUE; asserts it was answered as a COMMAND_RESULT and returns the answer. */
export async function flush(page) {
  const r = await page.evaluate(() => window.demo.client.flush());
  assert.equal(r.type, 'COMMAND_RESULT', JSON.stringify(r));
  assert.equal(r.command, 'FLUSH_QUEUE', JSON.stringify(r));
  return r;
}

/** Signs in through the form and waits until the page has bound the worker and flushed. */
export async function signIn(page, userId, { timeout = 30000 } = {}) {
  await signInThroughUi(page, userId);
  await page.waitForFunction(() => window.demo.sessionSynced === true, null, { timeout });
}

/**
 * Signs out through the demo's button; when the device holds unsent work the demo asks,
 * and this answers "Sign out, keep them here".
 */
export async function signOutThroughUi(page, { timeout = 30000 } = {}) {
  await page.getByTestId('sign-out').click({ timeout });
  const form = page.getByTestId('login-form');
  const keep = page.getByTestId('signout-keep');
  await page.waitForFunction(() => {
    const $ = (t) => document.querySelector(`[data-testid="${t}"]`);
    return !$('signout-dialog').hidden || !$('login-form').hidden;
  }, null, { timeout });
  if (await keep.isVisible()) await keep.click({ timeout });
  await form.waitFor({ state: 'visible', timeout });
  await page.waitForFunction(() => window.demo.state.user === null && window.demo.sessionSynced === false, null, { timeout });
}

/**
 * Brings the network back after an offline sign-out with the server's session moved to
 * `user` first. The signed-out account's server session is still alive (the server was
 * not told), and without Background Sync the worker's own triggers (the offline probe,
 * the live retry: contract 2.4, 2.6) flush as soon as the network answers: such a flush
 * would rightly replay that account's records under it, before `user` signs in. So the
 * identity check answers 401 (nobody signed in) until the page has logged `user` in;
 * then the page signs in through the form as usual.
 */
export async function reconnectAs(h, page, user) {
  await h.control('faults', { rules: [{ path: '/api/auth/me', method: 'GET', kind: 'status', status: 401 }] });
  await h.setNetwork(true);
  const status = await page.evaluate((u) => fetch('/api/auth/login', {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ userId: u, password: u }),
  }).then((r) => r.status), user);
  assert.equal(status, 200, `${user} logged in on the server`);
  await h.control('faults', { rules: [] });
}

/**
 * A clean start for one test: queue and session cleared in the worker, the server reset
 * (data, ledger, sessions, faults, logs), and the page reloaded, signed out.
 */
export async function freshStart(h) {
  let page = h.browser.pages()[0];
  if (page && await page.evaluate(() => Boolean(window.demo?.client && navigator.serviceWorker.controller)).catch(() => false)) {
    const r = await page.evaluate(() => window.demo.client.clearDevice());
    assert.equal(r.ok, true, `CLEAR_DEVICE refused: ${JSON.stringify(r)}`);
  }
  await h.reset();
  page = await h.openDemo({ page });
  await page.getByTestId('login-form').waitFor({ state: 'visible' });
  await page.waitForFunction(() => window.demo.state.user === null);
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
export async function eventually(fn, { timeout = 20000, interval = 100, what = 'condition' } = {}) {
  const end = Date.now() + timeout;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out after ${timeout} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, interval));
  }
}

/**
 * Runs a test body, appending the pages', the browser's and the server's last words to a
 * failure. `harness` is the harness or a function returning it (it is made in `before`).
 */
export function withDiagnostics(harness, fn) {
  return async (t) => {
    try {
      await fn(t);
    } catch (err) {
      const h = typeof harness === 'function' ? harness() : harness;
      if (h && err && typeof err === 'object') err.message += `\n${await h.diagnostics()}`;
      throw err;
    }
  };
}

/** The requests log's entries carrying `key`. */
export async function sentWithKey(h, key) {
  return (await h.requests()).filter((r) => r.key === key);
}

/** The demo's URL under a worker configured by `config` (its `?swconfig=`). */
export const swPath = (config) => `/?swconfig=${encodeURIComponent(JSON.stringify(config))}`;

/** How long pristine waits for the database's deletion while a connection holds it. */
const BLOCKED_MS = 20000;

/** Deletes the 'sw-outbox' database from `page`: {deleted: 'deleted' | 'blocked' | 'error …',
 * controller, registrations}; 'blocked' once it waited BLOCKED_MS for the last connection. */
function deleteOutboxDatabase(page) {
  return page.evaluate(async (ms) => {
    const deleted = await new Promise((res) => {
      const d = indexedDB.deleteDatabase('sw-outbox');
      d.onsuccess = () => res('deleted');
      d.onerror = () => res(`error ${d.error}`);
      d.onblocked = () => { /* waits for the last connection to close, then succeeds */ };
      setTimeout(() => res('blocked'), ms);
    });
    return {
      deleted,
      controller: Boolean(navigator.serviceWorker.controller),
      registrations: (await navigator.serviceWorker.getRegistrations()).length,
    };
  }, BLOCKED_MS);
}

/**
 * Leaves the origin with no worker registration, no caches and no 'sw-outbox' database,
 * and the first tab on an uncontrolled page of the origin (/icon.svg: no worker code),
 * every other tab closed.
 */
export async function pristine(h) {
  await h.reset();
  const [first, ...others] = await h.browser.openPages();
  for (const p of others) await p.close();
  let page = first ?? await h.browser.newPage();
  await page.goto(`${h.baseUrl}/icon.svg`);
  await page.evaluate(async () => {
    for (const r of await navigator.serviceWorker.getRegistrations()) await r.unregister();
    for (const k of await caches.keys()) await caches.delete(k);
  });
  await page.goto(`${h.baseUrl}/icon.svg`); // no longer controlled: the registration goes
  // An old worker may still hold the database open: stopped where the engine can; where
  // it cannot (WebKit), the worker closes its connection on the deletion's versionchange.
  if (!lacks(h.engine, 'stopWorkers')) await h.stopWorkers();
  let state = await deleteOutboxDatabase(page);
  if (state.deleted === 'blocked' && lacks(h.engine, 'restartOnProfile')) {
    // Seen in WebKit about once in 25 runs of a file, each time right after a test
    // that ends as its worker stores a flush's last steps; most likely WebKit stopped
    // that worker with its registration and left a transaction unfinished, so the
    // connection never closes (docs/TESTING.md, the engines table: as an update's
    // stopped worker). A new WebKit session
    // has no website data at all, which is the pristine origin this asks for.
    console.log(`# pristine: the deletion of 'sw-outbox' stayed blocked ${BLOCKED_MS} ms in ${h.engine}: browser started again`);
    await h.restartBrowser();
    page = h.browser.pages()[0] ?? await h.browser.newPage();
    await page.goto(`${h.baseUrl}/icon.svg`);
    state = await deleteOutboxDatabase(page);
  }
  assert.deepEqual(state, { deleted: 'deleted', controller: false, registrations: 0 }, 'a pristine origin');
  return page;
}

/** Opens the demo under a worker configured by `config` on a pristine origin, signed in as `user` (null: not). */
export async function openWith(h, config, { user = 'alice' } = {}) {
  const page = await pristine(h);
  await h.openDemo({ page, path: swPath(config) });
  if (user) await signIn(page, user);
  return page;
}

/**
 * The clipboard's text, read by the page (navigator.clipboard.readText) in a click, as a
 * person's paste is: WebKit lets a page read it only during a user gesture, Chromium only
 * with the permission the harness grants.
 */
export async function readClipboard(h, page) {
  await h.grantClipboardRead();
  await page.evaluate(() => {
    const button = document.createElement('button');
    button.type = 'button';
    button.textContent = 'Read the clipboard';
    button.dataset.testid = 'test-read-clipboard';
    window.__clipboard = null;
    button.addEventListener('click', () => {
      navigator.clipboard.readText().then((text) => { window.__clipboard = { text }; },
        (err) => { window.__clipboard = { error: String(err) }; }).finally(() => button.remove());
    });
    document.body.append(button);
  });
  await page.getByTestId('test-read-clipboard').click();
  await page.waitForFunction(() => window.__clipboard !== null, null, { timeout: 10000 });
  const read = await page.evaluate(() => window.__clipboard);
  if ('error' in read) throw new Error(`the page could not read the clipboard: ${read.error}`);
  return read.text;
}

/**
 * One read request on the outbox's 'mutations' store (`get`, `getAllKeys`, `count`, …),
 * made straight on IndexedDB in the page, no worker involved; resolves with its result
 * (null for nothing).
 */
export function readMutations(page, method, ...args) {
  return page.evaluate(([m, a]) => new Promise((res, rej) => {
    const open = indexedDB.open('sw-outbox');
    open.onerror = () => rej(open.error);
    open.onsuccess = () => {
      const req = open.result.transaction('mutations').objectStore('mutations')[m](...a);
      req.onsuccess = () => { open.result.close(); res(req.result ?? null); };
      req.onerror = () => rej(req.error);
    };
  }), [method, args]);
}

/** Reads record `id` of the outbox's 'mutations' store straight from IndexedDB in the page. */
export const storedRecord = (page, id) => readMutations(page, 'get', id);

/**
 * What the page and its service workers say right now, for a failure report: the page's
 * controller and the registration's workers with their states, when the controller
 * changed (installRecorders), the demo's session, the requestIds of its commands still
 * unanswered and how long ago they were sent, what the chaos run marked as pending
 * (`window.__pendingStep`), the page's errors, and a LIST_QUEUE summary. Every question to
 * a worker has a timeout of its own (`timeoutMs`), so a stuck worker is reported as
 * such instead of waited for; never throws (a page that cannot answer says so).
 */
export async function outboxState(page, { timeoutMs = 5000 } = {}) {
  try {
    return await page.evaluate(async (ms) => {
      const within = (p, what) => Promise.race([
        Promise.resolve(p).catch((e) => `${what} failed: ${e?.message ?? e}`),
        new Promise((r) => setTimeout(() => r(`${what}: no answer within ${ms} ms`), ms)),
      ]);
      const reg = await within(navigator.serviceWorker.getRegistration(), 'getRegistration');
      const worker = (w) => (w ? `${w.scriptURL.replace(location.origin, '')} ${w.state}` : null);
      const client = window.demo?.client;
      // Before the LIST_QUEUE below joins them. A helper's requestId starts with the time.
      const unanswered = client ? [...client.pending.entries()].map(([id, p]) => {
        const sent = /^oc-([0-9a-z]+)-/.exec(id);
        return `${p.message?.type ?? '?'} ${id}${sent ? ` (sent ${Date.now() - parseInt(sent[1], 36)} ms ago)` : ''}`;
      }) : null;
      const list = client ? await within(client.send({ type: 'LIST_QUEUE' }, { timeoutMs: ms }), 'LIST_QUEUE') : 'no client';
      const records = Array.isArray(list?.records)
        ? list.records.map((r) => `#${r.id} ${r.ownerId ?? '-'} ${r.workspace ?? 'notes'} ${r.state}${r.attentionReason ? ` ${r.attentionReason}` : ''}`)
        : list;
      return {
        at: new Date().toISOString(),
        controller: worker(navigator.serviceWorker.controller),
        registration: typeof reg === 'object' && reg
          ? { installing: worker(reg.installing), waiting: worker(reg.waiting), active: worker(reg.active) }
          : reg,
        user: window.demo?.state?.user?.id ?? null,
        sessionSynced: window.demo?.sessionSynced ?? null,
        unanswered,
        pendingStep: window.__pendingStep ?? null,
        errors: (window.__errors ?? []).slice(-10),
        queue: records,
        controllerChanges: (window.__controllerChanges ?? []).slice(-10),
      };
    }, timeoutMs);
  } catch (err) {
    return { unavailable: err.message.split('\n')[0] };
  }
}
