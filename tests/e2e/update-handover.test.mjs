// An update of the worker, in Chromium driven as a user's browser is: no DevTools attached
// to the service workers (cdp.mjs attaches to the tabs only). Playwright attaches DevTools
// to every worker, and Chromium then keeps a restarted old worker alive until its
// five-minute lame-duck limit, which is why scenarios.test.mjs only reports its take-over
// time. Here the old worker is stopped mid-flush during the hand-over while an event
// reaches it, which starts it again. Chromium then forgets that it
// asked the old worker to stop when idle; the worker's nudge (docs/PROTOCOL.md section 8)
// renews the request, so the restart costs nothing instead of the 30 s idle timeout.
// Nothing is sent twice either way.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { resolve } from 'node:path';
import { launchChromium } from './cdp.mjs';
import { controlClient, repoRoot, startServer, stopServer } from './harness.mjs';

let server;
let browser;
let base;
let control;

before(async () => {
  const www = resolve(repoRoot, process.env.SW_OUTBOX_WWW || 'www');
  server = startServer(resolve(repoRoot, process.env.SW_OUTBOX_SERVER_BIN || 'target/release/sw-outbox-server'), www);
  base = await server.baseUrl;
  control = controlClient(base);
  browser = await launchChromium();
});
after(async () => {
  await browser?.close();
  if (server) await stopServer(server.child);
});

/** Polls `fn` in `tab` until it returns a truthy value; returns it. */
async function until(tab, fn, { arg, timeout = 20000, what = String(fn) } = {}) {
  const end = Date.now() + timeout;
  for (;;) {
    const v = await tab.evaluate(fn, arg).catch(() => undefined); // a navigating page throws
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out after ${timeout} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

const P = (pid) => `/api/projects/${pid}/tasks`;
const scriptFor = (config) => `/sw.js?config=${encodeURIComponent(JSON.stringify(config))}`;
/** The page is controlled by the worker at `script` (a suffix of its URL). */
const controlledBy = (script) => navigator.serviceWorker.controller?.scriptURL.endsWith(script);

let a; // tab A: the one the test's CDP session follows workers from
let b; // tab B
let current; // the script URL now controlling both tabs
const versions = new Map(); // versionId -> {url, status, running}
const log = [];
let t0 = Date.now();
const at = () => `${((Date.now() - t0) / 1000).toFixed(1)}s`;

/** Opens two signed-in demo tabs under the worker for `{}`, with nothing attached to it. */
async function openTabs() {
  current = scriptFor({});
  const demoUrl = `${base}/?swconfig=${encodeURIComponent('{}')}`;
  a = await browser.openTab(demoUrl);
  await until(a, () => Boolean(window.demo?.client && navigator.serviceWorker.controller), { what: 'tab A controlled' });
  await a.evaluate(async () => {
    await window.demo.ready;
    document.querySelector('[data-testid=login-user]').value = 'alice';
    document.querySelector('[data-testid=login-password]').value = 'alice';
    document.querySelector('[data-testid=login-form]').requestSubmit();
  });
  await until(a, () => window.demo.sessionSynced === true, { what: 'tab A signed in' });
  b = await browser.openTab(demoUrl);
  await until(b, () => Boolean(window.demo?.client && navigator.serviceWorker.controller
    && window.demo.state.user?.id === 'alice' && window.demo.sessionSynced), { what: 'tab B signed in' });

  const sws = (await browser.send('Target.getTargets')).targetInfos.filter((x) => x.type === 'service_worker');
  assert.ok(sws.length >= 1, 'the worker is a target');
  assert.deepEqual(sws.filter((x) => x.attached), [], 'the premise: no DevTools session on a service worker');

  browser.events.on('ServiceWorker.workerVersionUpdated', (p, sessionId) => {
    if (sessionId !== a.sessionId) return;
    for (const v of p.versions) {
      const prev = versions.get(v.versionId);
      if (prev && prev.status === v.status && prev.running === v.runningStatus) continue;
      versions.set(v.versionId, { url: v.scriptURL, status: v.status, running: v.runningStatus, registration: v.registrationId });
      log.push(`${at()} ${v.versionId}:${v.status}/${v.runningStatus}`);
    }
  });
  await a.send('ServiceWorker.enable');
}

const idOf = (url) => [...versions].filter(([, v]) => v.url.endsWith(url)).map(([id]) => id).pop();

/**
 * Queues four writes from the two tabs in `workspaces`, starts a slow flush in the old
 * worker, installs the worker for `config`, and once it waits, stops the old worker and
 * starts it again. Returns the seconds from the restart until both tabs are controlled by
 * the new worker and how often the old one started, after checking every write was
 * applied at most once and what remains is accounted for.
 */
async function handOver(t, { config, workspaces }) {
  t0 = Date.now();
  log.length = 0;
  const oldUrl = current;
  const newUrl = scriptFor(config);
  await control('network', { down: true });
  const queued = [];
  for (let i = 0; i < 4; i += 1) {
    const r = await (i % 2 ? b : a).evaluate(([p, body]) => window.demo.api('POST', p, body),
      [P(workspaces[i < 2 ? 0 : 1]), { title: `update ${i}` }]);
    assert.equal(r.status, 202, `queued: ${JSON.stringify(r)}`);
    queued.push({ id: r.body.id, key: r.body.idempotencyKey });
  }
  await control('network', { down: false });
  await control('faults', { rules: [{ path: '/api/projects/*/tasks', method: 'POST', kind: 'delay', delayMs: 5000 }] });
  // The old worker is busy (a replay waits on the server) while the new one installs.
  const keys = new Set(queued.map((q) => q.key));
  for (let tries = 0; ; tries += 1) {
    await a.evaluate(() => { window.demo.client.flush().catch(() => null); });
    const deadline = Date.now() + 2000;
    let running = false;
    while (!running && Date.now() < deadline) {
      running = (await control('requests')).requests.some((r) => keys.has(r.key) && r.status === null);
      if (!running) await new Promise((r) => setTimeout(r, 50));
    }
    if (running) break;
    assert.ok(tries < 10, 'a replay of the old worker under way'); // a flush inside the offline backoff is refused
  }

  await b.evaluate((url) => navigator.serviceWorker.register(url, { scope: '/' }).then(() => true), newUrl);
  await until(a, async (url) => {
    const reg = await navigator.serviceWorker.getRegistration('/');
    return Boolean(reg?.waiting?.scriptURL.endsWith(url) || reg?.active?.scriptURL.endsWith(url));
  }, { arg: newUrl, timeout: 30000, what: 'the new version installed' });
  const oldId = idOf(oldUrl);
  const newId = idOf(newUrl);
  assert.ok(oldId && newId, `both versions seen: ${log.join('; ')}`);
  assert.equal(versions.get(newId).status, 'installed', `the new version waits for the busy old one: ${log.join('; ')}`);
  log.push(`${at()} new version waiting`);

  // Both commands in one go: a sync event (of a tag the outbox does not own) reaches the
  // old worker while it stops, and starts it again.
  const [stopped, started] = await Promise.all([
    a.send('ServiceWorker.stopWorker', { versionId: oldId }).then(() => 'ok', (e) => e.message),
    a.send('ServiceWorker.dispatchSyncEvent', {
      origin: base, registrationId: versions.get(oldId).registration, tag: 'test-restart', lastChance: false,
    }).then(() => 'ok', (e) => e.message),
  ]);
  log.push(`${at()} stop ${stopped}, sync event ${started}`);
  const restarted = Date.now();
  await until(a, controlledBy, { arg: newUrl, timeout: 180000, what: 'the new version to control tab A' });
  await until(b, controlledBy, { arg: newUrl, timeout: 10000, what: 'the new version to control tab B' });
  const seconds = (Date.now() - restarted) / 1000;
  current = newUrl;
  log.push(`${at()} both tabs controlled by the new version`);
  const starts = log.filter((l) => l.includes(` ${oldId}:`) && l.endsWith('/starting')).length;
  t.diagnostic(`take-over ${seconds.toFixed(1)} s after the restart; old worker starts seen: ${starts}`);
  t.diagnostic(`versions: ${log.join('; ')}`);

  // Everything queued is applied once, through the new worker. A write cut off mid-request
  // by the stop is left outcome-unknown, and later writes of its workspace wait behind it.
  await control('faults', { rules: [] });
  const behindUnknown = (rec, records) => records.some((x) => x.workspace === rec.workspace && x.id < rec.id
    && x.attentionReason === 'outcome-unknown');
  const ids = new Set(queued.map((q) => q.id));
  const end = Date.now() + 60000;
  let left;
  for (;;) {
    await a.evaluate(() => window.demo.client.flush().catch(() => null));
    left = (await a.evaluate(() => window.demo.client.list())).records.filter((x) => ids.has(x.id));
    if (left.every((x) => x.state !== 'queued' || behindUnknown(x, left)) || Date.now() > end) break;
    await new Promise((r) => setTimeout(r, 300));
  }
  const applied = (await control('applied')).applied.map((x) => x.key);
  t.diagnostic(`left: ${JSON.stringify(left.map((x) => [x.id, x.state, x.attentionReason]))}`);
  assert.equal(new Set(applied).size, applied.length, `no key applied twice: ${JSON.stringify(applied)}`);
  for (const { id, key } of queued) {
    const times = applied.filter((k) => k === key).length;
    const rec = left.find((x) => x.id === id);
    if (!rec) {
      assert.equal(times, 1, `record ${id} applied exactly once`);
    } else if (rec.state === 'queued') {
      assert.ok(behindUnknown(rec, left), `record ${id} waits behind an outcome-unknown one: ${JSON.stringify(left)}`);
      assert.equal(times, 0, `record ${id} not applied yet`);
    } else {
      assert.equal(rec.attentionReason, 'outcome-unknown', `left as ${JSON.stringify(rec)}`);
      assert.ok(times <= 1, `record ${id} applied at most once`);
    }
  }
  return { seconds, starts };
}

test('an old worker restarted once during an update hands over at once, not after the 30 s idle timeout',
  { timeout: 400000 }, async (t) => {
    await openTabs();
    // The event must reach the old worker while it stops; if it came too late (the new
    // version already took over), the hand-over is tried again with another version.
    let result;
    for (let attempt = 0; attempt < 3; attempt += 1) {
      result = await handOver(t, { config: { replayConcurrency: 2 + attempt }, workspaces: [`u${attempt}a`, `u${attempt}b`] });
      if (result.starts > 0) break;
    }
    const { seconds, starts } = result;
    assert.equal(starts, 1, `the old worker was restarted during the hand-over: ${log.join('; ')}`);
    // Without the nudge this is Chromium's 30 s idle timeout (measured: 30.1 s). A second
    // restart in one hand-over still costs that: Chromium acts on the first pending
    // skipWaiting() of a waiting worker only.
    assert.ok(seconds < 10, `the new version took over ${seconds.toFixed(1)} s after the restart: ${log.join('; ')}`);
  });
