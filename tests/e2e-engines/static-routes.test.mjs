// `staticRoutes` (contract 1, r4): a site whose worker serves only the API lets the
// browser skip the worker for everything else, where the browser offers static routing
// (`InstallEvent.addRoutes`, Chromium).
//
// The site's worker script records, per worker start, every request its fetch listener
// sees (a listener added before the outbox's, which only looks), and answers a page's
// `{type: 'STATIC_ROUTES_SEEN'}` with that list and whether its install had `addRoutes`.
//
// Checked:
// - Chromium, `staticRoutes: true`: with the worker stopped, a navigation of a controlled
//   page, its files and an asset fetched by it never reach the worker (the instance an
//   offline API write then starts saw the write and not them), while an auth route
//   outside `apiPrefix` (`/Login`, any case) still does (the sign-in barrier observes it);
//   the write is queued 202 and replayed once;
// - Chromium, `staticRoutes: true` with a site's own `authRoutePattern`: paths starting
//   with its literal start (`/accounts/`) still reach the worker, the rest does not;
// - Chromium, the default (false): the same navigation and files reach the worker;
// - Firefox and WebKit (no `addRoutes`): `staticRoutes: true` changes nothing: every
//   request reaches the worker and an offline write is queued 202 (the Chromium-only
//   test is skipped with the reason).
import assert from 'node:assert/strict';
import { cp, mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { lacks } from './engines.mjs';
import { repoRoot } from './harness.mjs';
import { eventually, forEachEngine, withDiagnostics } from './outbox-helpers.mjs';
import { startSiteHost } from './site-host.mjs';

const SITE_HTML = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>static routes</title>
<script type="module" src="/site.js"></script></head>
<body><h1>site shell</h1></body></html>
`;

const SITE_JS = `import { registerOutbox } from '/sw-outbox/outbox-client.js';
const params = new URLSearchParams(location.search);
window.site = {};
window.site.ready = registerOutbox({ scriptUrl: params.get('sw'), scope: '/' }).then((client) => {
  window.site.client = client;
  return client;
});
window.site.json = async (method, path, body) => {
  const r = await fetch(path, {
    method, headers: { 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: r.status, body: await r.json().catch(() => null) };
};
/** What the worker instance running now saw (it is started by this message if stopped). */
window.site.seen = () => new Promise((resolve, reject) => {
  const listen = (e) => {
    if (e.data?.type !== 'STATIC_ROUTES_SEEN') return;
    navigator.serviceWorker.removeEventListener('message', listen);
    resolve(e.data);
  };
  navigator.serviceWorker.addEventListener('message', listen);
  navigator.serviceWorker.controller.postMessage({ type: 'STATIC_ROUTES_SEEN' });
  setTimeout(() => reject(new Error('the worker did not answer STATIC_ROUTES_SEEN')), 20000);
});
`;

/** The site's worker script: a listener that records what reaches this worker instance,
 * then the outbox with `config`. */
const siteWorker = (config) => `// The site's worker script.
const seen = [];
let hadAddRoutes = null;
self.addEventListener('install', (event) => { hadAddRoutes = typeof event.addRoutes === 'function'; });
self.addEventListener('fetch', (event) => {
  const u = new URL(event.request.url);
  seen.push(event.request.method + ' ' + u.pathname + u.search);
});
self.addEventListener('message', (event) => {
  if (event.data?.type !== 'STATIC_ROUTES_SEEN') return;
  event.source.postMessage({ type: 'STATIC_ROUTES_SEEN', seen,
    addRoutes: hadAddRoutes ?? (typeof InstallEvent !== 'undefined' && 'addRoutes' in InstallEvent.prototype) });
});
self.SW_OUTBOX_CONFIG = ${JSON.stringify(config)};
self.SW_OUTBOX_BASE = '/sw-outbox/';
importScripts('/sw-outbox/sw.js');
`;

let dir;

before(async () => {
  dir = await mkdtemp(join(tmpdir(), 'sw-outbox-static-routes-'));
  await mkdir(join(dir, 'sw-outbox'), { recursive: true });
  await mkdir(join(dir, 'assets'), { recursive: true });
  await cp(join(repoRoot, 'www/sw.js'), join(dir, 'sw-outbox/sw.js'));
  await cp(join(repoRoot, 'www/outbox-client.js'), join(dir, 'sw-outbox/outbox-client.js'));
  await cp(join(repoRoot, 'www/pkg'), join(dir, 'sw-outbox/pkg'), { recursive: true });
  await writeFile(join(dir, 'index.html'), SITE_HTML);
  await writeFile(join(dir, 'site.js'), SITE_JS);
  await writeFile(join(dir, 'assets/a.txt'), 'an asset\n');
  await writeFile(join(dir, 'static-sw.js'), siteWorker({ precache: [], dbName: 'static-routes-on', staticRoutes: true }));
  await writeFile(join(dir, 'custom-sw.js'), siteWorker({
    precache: [], dbName: 'static-routes-custom', staticRoutes: true, authRoutePattern: '^/accounts/(?:login|logout)(?:/|\\?|$)',
  }));
  await writeFile(join(dir, 'plain-sw.js'), siteWorker({ precache: [], dbName: 'static-routes-off' }));
});

after(async () => {
  if (dir) await rm(dir, { recursive: true, force: true });
});

const firstPage = async (h) => h.browser.pages()[0] ?? h.browser.newPage();

/** Opens the site with worker script `sw`, controlled, signed in as `user`. */
async function openSite(h, origin, sw, user) {
  const page = await firstPage(h);
  await page.goto(`${origin}/?sw=${sw}`);
  await page.waitForFunction(() => Boolean(window.site?.client));
  await page.evaluate(() => window.site.client.controlled);
  const login = await page.evaluate((u) => window.site.json('POST', '/api/auth/login', { userId: u, password: u }), user);
  assert.equal(login.status, 200, JSON.stringify(login));
  const session = await page.evaluate((u) => window.site.client.signedIn(u), user);
  assert.equal(session.ok, true, JSON.stringify(session));
  return page;
}

/** Loads the controlled page again and fetches an asset from it. */
async function loadAgain(page, origin, sw) {
  await page.goto(`${origin}/?sw=${sw}`);
  await page.waitForFunction(() => Boolean(window.site?.client));
  await page.evaluate(() => window.site.client.controlled);
  await page.evaluate(async () => { await (await fetch('/assets/a.txt')).text(); });
}

/** What this worker instance saw, after the page fetched an auth page outside the API
 * (last: the sign-in barrier it raises would hold a replay). */
async function seenAfterAuthPage(page) {
  await page.evaluate(() => fetch('/Login').then((r) => r.text()).catch(() => null));
  return page.evaluate(() => window.site.seen());
}

/** Leaves the browser without a registration, for the next test. */
const unregister = (page) => page.evaluate(async () => {
  for (const r of await navigator.serviceWorker.getRegistrations()) await r.unregister();
});

/** An offline write: queued 202 by the outbox. */
async function offlineWrite(page, host, title) {
  host.setDown(true);
  try {
    const write = await page.evaluate((t) => window.site.json('POST', '/api/projects/p1/tasks', { title: t }), title);
    assert.equal(write.status, 202, JSON.stringify(write));
    assert.equal(write.body.queued, true);
    return write;
  } finally {
    host.setDown(false);
  }
}

/** Replays the queue and checks the write was applied once. */
async function replayedOnce(h, page, write) {
  const flushed = await page.evaluate(() => window.site.client.flush());
  assert.equal(flushed.ok, true, JSON.stringify(flushed));
  const applied = await eventually(async () => {
    const a = (await h.applied()).filter((x) => x.key === write.body.idempotencyKey);
    return a.length ? a : null;
  }, { what: 'the queued write applied' });
  assert.equal(applied.length, 1, JSON.stringify(applied));
}

const CHROMIUM_ONLY = (engine) => engine !== 'chromium'
  && `${engine} has no InstallEvent.addRoutes (static routing is Chromium's); the test below checks the option changes nothing there`;

forEachEngine((engine, harness) => {
  let host;
  before(async () => { host = await startSiteHost(harness().baseUrl); });
  after(async () => { await host?.close(); });

  test('staticRoutes: true: a stopped worker is not started by the page\'s navigation and files; an auth route and an API write still reach it',
    { skip: CHROMIUM_ONLY(engine) || lacks(engine, 'stopWorkers') }, withDiagnostics(harness, async () => {
      const h = harness();
      const page = await openSite(h, host.origin, '/static-sw.js', 'alice');
      await h.stopWorkers();
      const starts = await h.workerStarts();
      await loadAgain(page, host.origin, '/static-sw.js');
      const nav = await page.evaluate(() => performance.getEntriesByType('navigation')[0]?.workerMatchedSourceType ?? null);
      if (nav !== null) assert.equal(nav, 'network', 'the browser matched the navigation to the network route');
      const write = await offlineWrite(page, host, 'written with static routes');
      await replayedOnce(h, page, write);
      const seen = await seenAfterAuthPage(page);
      assert.equal(seen.addRoutes, true);
      const paths = seen.seen;
      assert.ok(paths.includes('POST /api/projects/p1/tasks'), `the write reached the worker: ${JSON.stringify(paths)}`);
      assert.ok(paths.includes('GET /Login'), `an auth route (any case) reached it: ${JSON.stringify(paths)}`);
      for (const p of ['GET /?sw=/static-sw.js', 'GET /site.js', 'GET /sw-outbox/outbox-client.js', 'GET /assets/a.txt']) {
        assert.ok(!paths.includes(p), `${p} went around the worker: ${JSON.stringify(paths)}`);
      }
      assert.ok(await h.workerStarts() > starts, 'the write started the worker');
      await unregister(page);
    }));

  test('staticRoutes: true with a site\'s own authRoutePattern: what starts with its literal start still reaches the worker, the rest goes around it',
    { skip: CHROMIUM_ONLY(engine) || lacks(engine, 'stopWorkers') }, withDiagnostics(harness, async () => {
      const h = harness();
      const page = await openSite(h, host.origin, '/custom-sw.js', 'alice');
      await h.stopWorkers();
      await loadAgain(page, host.origin, '/custom-sw.js');
      // `/accounts/other` is not an auth route of this pattern, but it starts with the
      // pattern's literal start (`/accounts/`): kept, the conservative side.
      await page.evaluate(() => Promise.all(['/accounts/other', '/Login'].map((p) => fetch(p).then((r) => r.text()).catch(() => null))));
      const paths = (await page.evaluate(() => window.site.seen())).seen;
      assert.ok(paths.includes('GET /accounts/other'), `kept by the pattern's literal start: ${JSON.stringify(paths)}`);
      for (const p of ['GET /?sw=/custom-sw.js', 'GET /assets/a.txt', 'GET /Login']) {
        assert.ok(!paths.includes(p), `${p} went around the worker: ${JSON.stringify(paths)}`);
      }
      await unregister(page);
    }));

  test('staticRoutes: false (the default): the page\'s navigation and files reach the worker',
    { skip: CHROMIUM_ONLY(engine) || lacks(engine, 'stopWorkers') }, withDiagnostics(harness, async () => {
      const h = harness();
      const page = await openSite(h, host.origin, '/plain-sw.js', 'bob');
      await h.stopWorkers();
      await loadAgain(page, host.origin, '/plain-sw.js');
      const write = await offlineWrite(page, host, 'written without static routes');
      await replayedOnce(h, page, write);
      const paths = (await seenAfterAuthPage(page)).seen;
      for (const p of ['GET /?sw=/plain-sw.js', 'GET /site.js', 'GET /assets/a.txt', 'GET /Login', 'POST /api/projects/p1/tasks']) {
        assert.ok(paths.includes(p), `${p} reached the worker: ${JSON.stringify(paths)}`);
      }
      await unregister(page);
    }));

  test('staticRoutes: true where the engine has no addRoutes: every request still reaches the worker, and an offline write is queued',
    { skip: engine === 'chromium' && 'Chromium has addRoutes: the tests above cover it' }, withDiagnostics(harness, async () => {
      const h = harness();
      const page = await openSite(h, host.origin, '/static-sw.js', 'alice');
      await loadAgain(page, host.origin, '/static-sw.js');
      const write = await offlineWrite(page, host, 'written where there is no static routing');
      await replayedOnce(h, page, write);
      const seen = await seenAfterAuthPage(page);
      assert.equal(seen.addRoutes, false, `${engine} has addRoutes now: test it as Chromium is`);
      for (const p of ['GET /?sw=/static-sw.js', 'GET /assets/a.txt', 'GET /Login', 'POST /api/projects/p1/tasks']) {
        assert.ok(seen.seen.includes(p), `${p} reached the worker: ${JSON.stringify(seen.seen)}`);
      }
      await unregister(page);
    }));
}, { name: 'static routes', setup: () => ({ www: dir, requireWorker: false }) });
