// First load and worker life, contract revision 3 (sections 1 and 8), against a small
// site that uses the outbox as an adopter does (its own worker script, the page helper
// from the site's copy), served by the reference server behind tests' site host
// (site-host.mjs: a switch that drops every connection, pages included).
//
// Checked:
// - a request that is not the outbox's is never answered by it, even by a worker the
//   browser just started: the site's own listener after the outbox's (a cache-first
//   shell, as Workbox's precaching serves one) launches the app offline from a stopped
//   worker, and an API write made then is queued (202) and replayed once (Chromium and
//   Firefox: WebKit's automation cannot stop a worker);
// - a write that arrives while the module cannot start (its database was taken to a
//   newer version, and the worker restarted) is answered 503 queued:false and never
//   reaches the server; a read goes to the network; a command gets ok:false with the
//   reason (Chromium and Firefox, for the same reason);
// - the first install precaches the files the page just loaded from the HTTP cache, not
//   downloading them again (Chromium and Firefox; WebKit's worker does not share the
//   page's HTTP cache, so there they still come twice; an update fetches with `no-store`);
// - a `handle_fetch` that throws (forced: the glue's Outbox class patched by the site's
//   worker) answers a write 503 queued:false, never sent, and sends an auth request to
//   the network without the outbox's headers (every engine; from a cold worker too in
//   Chromium and Firefox);
// - registerOutbox resolves before the page is controlled, its commands wait for control,
//   and persistent storage is asked for only when the site says so (every engine);
// - a page that will not be controlled gets that answer at once: outside the worker's
//   scope (every engine), after a hard reload (Chromium through CDP, Firefox through
//   WebDriver's Refresh, which is one);
// - with `skipWaiting: false` a new version waits for the page's prompt, is not nudged
//   into taking over when the old worker restarts (Chromium and Firefox), and takes over
//   on `applyUpdate()` (every engine).
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
<html lang="en"><head><meta charset="utf-8"><title>a site with an outbox</title>
<script type="module" src="/site.js"></script></head>
<body><h1>site shell</h1></body></html>
`;

// The site's page code: the page helper as the package README shows it, with what the
// tests read recorded on window.site. navigator.storage.persist is counted (and never
// granted, so no engine shows a prompt).
const SITE_JS = `import { registerOutbox } from '/sw-outbox/outbox-client.js';
const params = new URLSearchParams(location.search);
window.persistCalls = 0;
const counted = async () => { window.persistCalls += 1; return false; };
// (WebKitGTK's MiniBrowser has no navigator.storage at all: the counter stands in for it.)
if (navigator.storage) navigator.storage.persist = counted;
else Object.defineProperty(navigator, 'storage', { value: { persist: counted }, configurable: true });
window.site = { waitingSeen: 0, controlling: [] };
const options = { scriptUrl: params.get('sw') ?? '/sw.js', scope: params.get('scope') ?? '/' };
if (params.get('persist')) options.persist = params.get('persist');
window.site.ready = registerOutbox(options).then((client) => {
  window.site.client = client;
  window.site.atResolve = {
    controlled: navigator.serviceWorker.controller !== null,
    registered: client.registration !== undefined,
  };
  client.onUpdateWaiting(() => { window.site.waitingSeen += 1; });
  client.onControlling((e) => { window.site.controlling.push(e); });
  return client;
});
window.site.json = async (method, path, body, headers = {}) => {
  const r = await fetch(path, {
    method, headers: { 'Content-Type': 'application/json', ...headers },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: r.status, body: await r.json().catch(() => null) };
};
`;

/** The site's worker script: the outbox alone (`/sw.js`). */
const outboxWorker = (config, version = 1) => `// The site's worker script, version ${version}.
self.SW_OUTBOX_CONFIG = ${JSON.stringify(config)};
self.SW_OUTBOX_BASE = '/sw-outbox/';
importScripts('/sw-outbox/sw.js');
`;

/** A site worker that loads the outbox for its API only, then serves its own shell
 * cache-first, as Workbox's precaching does (`/pair-sw.js`). */
const PAIR_WORKER = `// The site's worker script: the outbox for the API, then the site's own shell.
self.SW_OUTBOX_CONFIG = { precache: [], dbName: 'pair-outbox' };
self.SW_OUTBOX_BASE = '/sw-outbox/';
importScripts('/sw-outbox/sw.js');

const SHELL = 'site-shell-v1';
self.addEventListener('install', (event) => {
  event.waitUntil(caches.open(SHELL).then((c) => c.addAll(['/', '/site.js', '/sw-outbox/outbox-client.js'])));
});
self.addEventListener('fetch', (event) => {
  const url = new URL(event.request.url);
  if (event.request.method !== 'GET' || url.origin !== self.location.origin || url.pathname.startsWith('/api/')) return;
  const key = event.request.mode === 'navigate' ? '/' : url.pathname;
  event.respondWith(caches.open(SHELL).then((c) => c.match(key)).then((hit) => hit || fetch(event.request)));
});
`;

/** A site worker whose module's `handle_fetch` throws synchronously (a defect, forced from
 * outside by patching the glue's Outbox class), for the shim's guard (`/throw-sw.js`). */
const THROW_WORKER = `self.SW_OUTBOX_CONFIG = { precache: [], dbName: 'throw-outbox' };
self.SW_OUTBOX_BASE = '/sw-outbox/';
// The glue may come after sw.js's first evaluation (a restarted worker imports it when
// an event first needs the module): patched whenever it has been imported.
const importFirst = self.importScripts.bind(self);
self.importScripts = (...urls) => {
  importFirst(...urls);
  if (typeof wasm_bindgen !== 'undefined') {
    wasm_bindgen.Outbox.prototype.handle_fetch = function () { throw new Error('forced by the test'); };
  }
};
importScripts('/sw-outbox/sw.js');
`;

/** A site worker with the outbox's own shell: the page's files (`/shell-sw.js`). */
const SHELL_WORKER = `self.SW_OUTBOX_CONFIG = { precache: ['/site.js', '/sw-outbox/outbox-client.js'], dbName: 'shell-outbox' };
self.SW_OUTBOX_BASE = '/sw-outbox/';
importScripts('/sw-outbox/sw.js');
`;

const DB = 'first-load-outbox';

let dir;

before(async () => {
  dir = await mkdtemp(join(tmpdir(), 'sw-outbox-first-load-'));
  await mkdir(join(dir, 'sw-outbox'), { recursive: true });
  await cp(join(repoRoot, 'www/sw.js'), join(dir, 'sw-outbox/sw.js'));
  await cp(join(repoRoot, 'www/outbox-client.js'), join(dir, 'sw-outbox/outbox-client.js'));
  await cp(join(repoRoot, 'www/pkg'), join(dir, 'sw-outbox/pkg'), { recursive: true });
  await writeFile(join(dir, 'index.html'), SITE_HTML);
  await writeFile(join(dir, 'site.js'), SITE_JS);
  await writeFile(join(dir, 'pair-sw.js'), PAIR_WORKER);
  await writeFile(join(dir, 'throw-sw.js'), THROW_WORKER);
  await writeFile(join(dir, 'shell-sw.js'), SHELL_WORKER);
  await writeFile(join(dir, 'sw.js'), outboxWorker({ dbName: DB }));
});

after(async () => {
  if (dir) await rm(dir, { recursive: true, force: true });
});

/** The site host in front of this describe's reference server; closed after it. */
function hosted(harness) {
  let host;
  before(async () => { host = await startSiteHost(harness().baseUrl); });
  after(async () => { await host?.close(); });
  return () => host;
}

/** Opens `path` of the site and waits until the page helper's handle is there. */
async function openSite(page, origin, path = '/') {
  await page.goto(`${origin}${path}`);
  await page.waitForFunction(() => Boolean(window.site?.client));
  return page;
}

/** Signs in through the API and binds the worker to the account. */
async function signIn(page, user) {
  const login = await page.evaluate((u) => window.site.json('POST', '/api/auth/login', { userId: u, password: u }), user);
  assert.equal(login.status, 200, JSON.stringify(login));
  const session = await page.evaluate((u) => window.site.client.signedIn(u), user);
  assert.equal(session.ok, true, JSON.stringify(session));
  return login.body.csrfToken;
}

const firstPage = async (h) => h.browser.pages()[0] ?? h.browser.newPage();

const siteOptions = () => ({ www: dir, requireWorker: false });

forEachEngine((engine, harness) => {
  const host = hosted(harness);

  test('a stopped worker launches the app offline from the site\'s own cache; an API write then is queued and replayed once',
    { skip: lacks(engine, 'stopWorkers') }, withDiagnostics(harness, async () => {
      const h = harness();
      const { origin } = host();
      const page = await openSite(await firstPage(h), origin, '/?sw=/pair-sw.js');
      await page.evaluate(() => window.site.client.controlled);
      await signIn(page, 'alice');
      assert.ok((await page.evaluate(() => caches.keys())).includes('site-shell-v1'), 'the site precached its shell');

      await h.stopWorkers();
      host().setDown(true);
      try {
        // The browser starts the worker for this navigation; the outbox leaves it to the
        // site's listener, whose cache answers (with the outbox taking it, the launch
        // failed: net::ERR_FAILED).
        const launched = await page.goto(`${origin}/?sw=/pair-sw.js`);
        if (engine === 'chromium') assert.equal(launched.fromServiceWorker(), true, 'answered by the worker');
        await page.waitForFunction(() => Boolean(window.site?.client));
        assert.equal(await page.evaluate(() => document.querySelector('h1').textContent), 'site shell');
        await page.evaluate(() => window.site.client.controlled);
        const write = await page.evaluate(() => window.site.json('POST', '/api/projects/p1/tasks', { title: 'made offline' }));
        assert.equal(write.status, 202, JSON.stringify(write));
        assert.equal(write.body.queued, true);
        assert.deepEqual(await h.applied(), []);
        host().setDown(false);
        const flushed = await page.evaluate(() => window.site.client.flush());
        assert.equal(flushed.ok, true, JSON.stringify(flushed));
        const applied = await eventually(async () => {
          const a = await h.applied();
          return a.length ? a : null;
        }, { what: 'the queued write applied' });
        assert.equal(applied.length, 1, JSON.stringify(applied));
        assert.equal(applied[0].key, write.body.idempotencyKey);
        assert.equal(applied[0].user, 'alice');
      } finally {
        host().setDown(false);
      }
    }));
}, { name: 'first load: beside another listener', setup: siteOptions });

forEachEngine((engine, harness) => {
  const host = hosted(harness);

  test('a write that arrives while the module cannot start is refused 503 and never sent; a read goes to the network; a command is refused with the reason',
    { skip: lacks(engine, 'stopWorkers') }, withDiagnostics(harness, async () => {
      const h = harness();
      const { origin } = host();
      const page = await openSite(await firstPage(h), origin);
      await page.evaluate(() => window.site.client.controlled);
      const csrf = await signIn(page, 'alice');

      // A newer version of the outbox's database (as a later release would make): the
      // running worker closes its connection for it, and a restarted one cannot open it.
      const upgraded = await page.evaluate((db) => new Promise((resolve) => {
        const open = indexedDB.open(db, 50);
        open.onsuccess = () => { open.result.close(); resolve(true); };
        open.onerror = () => resolve(String(open.error));
      }), DB);
      assert.equal(upgraded, true);
      await h.stopWorkers();

      const before = (await h.requests()).length;
      const write = await page.evaluate((t) => window.site.json('POST', '/api/projects/p1/tasks',
        { title: 'while the outbox cannot start' }, { 'X-CSRF-Token': t }), csrf);
      assert.equal(write.status, 503, JSON.stringify(write));
      assert.equal(write.body.queued, false);
      assert.match(write.body.error, /could not start/);
      const read = await page.evaluate(() => window.site.json('GET', '/api/projects/p1/tasks'));
      assert.equal(read.status, 200, `a read goes to the network: ${JSON.stringify(read)}`);
      const listed = await page.evaluate(() => window.site.client.list());
      assert.equal(listed.ok, false, JSON.stringify(listed));
      assert.match(listed.reason, /could not start/);
      // A command sent with a reply port is refused on that port, as the module answers.
      const viaPort = await page.evaluate(() => new Promise((resolve) => {
        const channel = new MessageChannel();
        channel.port1.onmessage = (e) => resolve(e.data);
        setTimeout(() => resolve('no answer on the port'), 10000);
        navigator.serviceWorker.controller.postMessage(
          { type: 'LIST_QUEUE', requestId: 'via-port' }, [channel.port2]);
      }));
      assert.equal(viaPort.type, 'COMMAND_RESULT', JSON.stringify(viaPort));
      assert.equal(viaPort.ok, false);
      assert.equal(viaPort.requestId, 'via-port');
      assert.match(viaPort.reason, /could not start/);
      const sent = (await h.requests()).slice(before).filter((r) => r.method === 'POST');
      assert.deepEqual(sent, [], 'the write never reached the server');
      assert.deepEqual(await h.applied(), []);

      // Pristine again for whatever runs next in this browser.
      await page.evaluate(async () => {
        for (const r of await navigator.serviceWorker.getRegistrations()) await r.unregister();
      });
      await page.evaluate((db) => new Promise((resolve) => {
        const del = indexedDB.deleteDatabase(db);
        del.onsuccess = del.onerror = del.onblocked = () => resolve();
      }), DB);
    }));
}, { name: 'first load: a module that cannot start', setup: siteOptions });

forEachEngine((engine, harness) => {
  const host = hosted(harness);

  test('the first install precaches the files the page just loaded without downloading them again',
    withDiagnostics(harness, async (t) => {
      const h = harness();
      const { origin } = host();
      const page = await openSite(await firstPage(h), origin, '/?sw=/shell-sw.js');
      await page.evaluate(() => window.site.client.controlled);
      const shell = ['/site.js', '/sw-outbox/outbox-client.js'];
      const cached = await page.evaluate(async () => {
        const urls = [];
        for (const n of await caches.keys()) for (const r of await (await caches.open(n)).keys()) urls.push(new URL(r.url).pathname);
        return urls;
      });
      for (const p of shell) assert.ok(cached.includes(p), `${p} precached: ${cached}`);
      // Each file's body came from the server once (the page's load); the install's copy
      // came from the HTTP cache, at most revalidated (304).
      const bodies = host().requests().filter((r) => shell.includes(r.path) && r.status === 200);
      if (engine === 'webkit') {
        // Observed: WebKitGTK's worker fetches without the page's HTTP cache (no
        // conditional request either), so there each file still comes twice.
        t.diagnostic(`webkit: ${bodies.length} downloads of ${shell.length} files (the worker does not share the page's HTTP cache)`);
        return;
      }
      assert.deepEqual(bodies.map((r) => r.path).sort(), [...shell].sort(), JSON.stringify(host().requests()));
    }));
}, { name: 'first load: one download per file', setup: siteOptions });

forEachEngine((engine, harness) => {
  const host = hosted(harness);

  test('a handle_fetch that throws: a write is refused 503 and never sent, an auth request goes to the network without the outbox\'s headers',
    withDiagnostics(harness, async () => {
      const h = harness();
      const { origin } = host();
      const page = await openSite(await firstPage(h), origin, '/?sw=/throw-sw.js');
      await page.evaluate(() => window.site.client.controlled);
      // The sign-in is an auth route: with the module's answer failing, the network's.
      const csrf = await signIn(page, 'alice');
      const tasks = '/api/projects/p1/tasks';
      /** A write now: refused, and nothing of it reaches the server. */
      const refused = async (what) => {
        const before = (await h.requests()).length;
        const write = await page.evaluate(([p, t, title]) => window.site.json('POST', p, { title }, { 'X-CSRF-Token': t }),
          [tasks, csrf, what]);
        assert.equal(write.status, 503, `${what}: ${JSON.stringify(write)}`);
        assert.equal(write.body.queued, false);
        assert.match(write.body.error, /handle_fetch threw/);
        const sent = (await h.requests()).slice(before).filter((r) => r.method === 'POST' && r.path === tasks);
        assert.deepEqual(sent, [], `${what}: never sent`);
      };
      await refused('with the module loaded');
      const auth = await page.evaluate(() => window.site.json('POST', '/api/auth/login', { userId: 'alice', password: 'alice' },
        { 'Idempotency-Key': 'a-key-an-auth-route-never-gets' }));
      assert.equal(auth.status, 200, JSON.stringify(auth));
      const login = (await h.requests()).filter((r) => r.path === '/api/auth/login').at(-1);
      assert.equal(login.key, null, `no outbox header on an auth route: ${JSON.stringify(login)}`);
      if (!lacks(engine, 'stopWorkers')) {
        // A cold worker: the write waits for the module's start, then gets the same answer.
        await h.stopWorkers();
        await refused('from a cold worker');
      }
      assert.deepEqual(await h.applied(), []);
    }));
}, { name: 'first load: a module whose handle_fetch throws', setup: siteOptions });

forEachEngine((engine, harness) => {
  const host = hosted(harness);

  test('registerOutbox resolves before the worker controls the page; commands wait for it; storage persistence is asked only when the site says so',
    withDiagnostics(harness, async () => {
      const h = harness();
      const { origin } = host();
      const page = await openSite(await firstPage(h), origin);
      const at = await page.evaluate(() => window.site.ready.then(() => window.site.atResolve));
      assert.deepEqual(at, { controlled: false, registered: false },
        'resolved at once: not waiting for the registration, nor for the install');
      // A command sent now waits for control, then is answered.
      const listed = await page.evaluate(() => window.site.client.list());
      assert.equal(listed.type, 'QUEUE_STATE', JSON.stringify(listed));
      assert.ok(await page.evaluate(() => navigator.serviceWorker.controller !== null));
      assert.equal(await page.evaluate(() => window.persistCalls), 0, 'not asked by default');
      await signIn(page, 'alice');

      // A page that asks on the first queued write.
      const asking = await openSite(page, origin, '/?persist=first-queued');
      await asking.evaluate(() => window.site.client.controlled);
      assert.equal(await asking.evaluate(() => window.persistCalls), 0, 'not asked on load');
      await h.setNetwork(false);
      try {
        for (const title of ['one', 'two']) {
          const w = await asking.evaluate((t) => window.site.json('POST', '/api/projects/p1/tasks', { title: t }), title);
          assert.equal(w.status, 202, JSON.stringify(w));
        }
        await asking.waitForFunction(() => window.persistCalls > 0);
        // Both reports have arrived once the worker answers a command sent after them.
        await asking.evaluate(() => window.site.client.list());
        assert.equal(await asking.evaluate(() => window.persistCalls), 1, 'asked once, on the first queued write');
      } finally {
        await h.setNetwork(true);
      }
    }));

  test('after a hard reload, commands say the page is not controlled', { skip: engine === 'webkit' ? 'webkit: WebKitWebDriver has no hard reload (a Refresh is an ordinary reload there)' : false },
    withDiagnostics(harness, async () => {
      const h = harness();
      const { origin } = host();
      const page = await openSite(await firstPage(h), origin);
      await page.evaluate(() => window.site.client.controlled);
      if (engine === 'chromium') {
        const cdp = await h.browser.context.newCDPSession(page);
        await cdp.send('Page.reload', { ignoreCache: true });
        await cdp.detach();
      } else {
        await page.run((d) => d.navigate().refresh());
      }
      await page.waitForFunction(() => Boolean(window.site?.client) && document.readyState === 'complete');
      assert.equal(await page.evaluate(() => navigator.serviceWorker.controller), null, 'the hard reload bypassed the worker');
      const command = await page.evaluate(() => window.site.client.list().then(() => 'answered', (e) => e.message));
      assert.match(command, /Shift\+Reload/);
      // An ordinary load is controlled again.
      await openSite(page, origin);
      const listed = await page.evaluate(() => window.site.client.list());
      assert.equal(listed.type, 'QUEUE_STATE', JSON.stringify(listed));
    }));
}, { name: 'first load: the page helper', setup: siteOptions });

// A browser of its own: no other registration of the origin controls the page.
forEachEngine((engine, harness) => {
  const host = hosted(harness);

  test('a page outside the worker\'s scope gets a clear answer instead of a wait', withDiagnostics(harness, async () => {
    const h = harness();
    const { origin } = host();
    const page = await openSite(await firstPage(h), origin, '/?scope=/elsewhere/');
    const outcome = await page.evaluate(() => window.site.client.controlled.then(() => 'controlled', (e) => e.message));
    assert.match(outcome, /not controlled/);
    const command = await page.evaluate(() => window.site.client.list().then(() => 'answered', (e) => e.message));
    assert.match(command, /not controlled/);
  }));

}, { name: 'first load: outside the scope', setup: siteOptions });

forEachEngine((engine, harness) => {
  const host = hosted(harness);

  test('with skipWaiting false a new version waits for the prompt, is not nudged by a restarted old worker, and takes over on applyUpdate',
    withDiagnostics(harness, async (t) => {
      const h = harness();
      const { origin } = host();
      const config = { dbName: `${DB}-update`, skipWaiting: false };
      await writeFile(join(dir, 'sw.js'), outboxWorker(config, 1));
      try {
        const page = await openSite(await firstPage(h), origin);
        await page.evaluate(() => window.site.client.controlled);

        await writeFile(join(dir, 'sw.js'), outboxWorker(config, 2));
        await page.evaluate(() => window.site.client.update());
        await page.waitForFunction(() => window.site.waitingSeen === 1, null, { timeout: 30000 });
        const state = () => page.evaluate(async () => {
          const reg = await navigator.serviceWorker.getRegistration();
          return {
            waiting: reg.waiting?.state ?? null,
            helperWaiting: window.site.client.waiting?.state ?? null,
            controlledByActive: navigator.serviceWorker.controller !== null && reg.active !== null,
            updatesTaken: window.site.controlling.filter((e) => e.isUpdate).length,
          };
        });
        const waitingState = { waiting: 'installed', helperWaiting: 'installed', controlledByActive: true, updatesTaken: 0 };
        await new Promise((r) => setTimeout(r, 3000));
        assert.deepEqual(await state(), waitingState, 'still waiting for the prompt');

        await t.test('a restarted old worker does not nudge it into taking over', { skip: lacks(engine, 'stopWorkers') }, async () => {
          await h.stopWorkers();
          // An event for the old worker starts it again; at its first event it nudges a
          // waiting worker, which renews only a skipWaiting() it made itself.
          const read = await page.evaluate(() => window.site.json('GET', '/api/projects/p1/tasks'));
          assert.ok(read.status > 0);
          await new Promise((r) => setTimeout(r, 3000));
          assert.deepEqual(await state(), waitingState, 'still waiting after the nudge');
        });

        const applied = await page.evaluate(() => window.site.client.applyUpdate());
        assert.equal(applied, true);
        // (The first install's claim may be recorded too, as not an update.)
        await page.waitForFunction(() => window.site.controlling.some((e) => e.isUpdate));
        assert.equal(await page.evaluate(() => window.site.controlling.filter((e) => e.isUpdate).length), 1);
        const after = await page.evaluate(async () => {
          const reg = await navigator.serviceWorker.getRegistration();
          return { waiting: reg.waiting, active: reg.active?.state, helperWaiting: window.site.client.waiting };
        });
        assert.deepEqual(after, { waiting: null, active: 'activated', helperWaiting: null });
        assert.equal(await page.evaluate(() => window.site.client.applyUpdate()), false, 'nothing waits any more');
        const listed = await page.evaluate(() => window.site.client.list());
        assert.equal(listed.type, 'QUEUE_STATE', 'the new version answers');
      } finally {
        await writeFile(join(dir, 'sw.js'), outboxWorker({ dbName: DB }));
      }
    }));
}, { name: 'first load: a prompt to update', setup: siteOptions });
