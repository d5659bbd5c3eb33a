// Every engine: two registrations (two scopes) of one origin (issue 27, 6; contract 3 and
// 8, r3). A copy of www gets two plain pages and two site worker scripts that import the
// outbox's sw.js, as a site with an app at / and another at /two/ would:
//   /site-sw.js  scope /      /plain.html       (no page helper: raw fetches and messages)
//   /two/sw.js   scope /two/  /two/index.html
// - by default they never share a database: the first registration keeps `sw-outbox` (an
//   existing install keeps its queue), the second gets `sw-outbox:/two/`; each replays
//   its own records;
// - configured to share one (the same `dbName` in both), the view rule holds between
//   them: a header-less write through one worker is bound to the account the other
//   persisted last;
// - a new version of one registration does not delete the cache the other still uses.
import assert from 'node:assert/strict';
import { cp, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { repoRoot } from './harness.mjs';
import { eventually, forEachEngine, pristine, withDiagnostics } from './outbox-helpers.mjs';

const copies = new Map();
const P1 = '/api/projects/p1/tasks';

/** A site worker script importing the outbox's, with its own shell build id and a shell
 * of one file (without a shell the outbox makes no cache: its runtime is not in Cache
 * Storage). */
const siteWorker = (shellBuild) => `self.SW_OUTBOX_BASE = '/';
self.SW_OUTBOX_CONFIG = { precache: ['/plain.html'] };
self.SW_OUTBOX_SHELL_BUILD = ${JSON.stringify(shellBuild)};
importScripts('/sw.js');
`;

const PLAIN = '<!doctype html><html><head><meta charset="utf-8"><title>plain page</title></head><body>a page of the origin</body></html>\n';

/**
 * In-page helpers (installed on `window.t`): register, sign in, command, write, read a
 * database. Everything raw, without the page helper, as a site of its own would do.
 */
async function install(page) {
  await page.evaluate(() => {
    window.t = {
      async register(script, scope) {
        const reg = await navigator.serviceWorker.register(script, { scope });
        const w = reg.installing || reg.waiting || reg.active;
        if (w.state !== 'activated') {
          await new Promise((res) => w.addEventListener('statechange', () => { if (w.state === 'activated') res(); }));
        }
        return reg.scope;
      },
      controlled: () => (navigator.serviceWorker.controller ? navigator.serviceWorker.controller.scriptURL : null),
      async login(user) {
        const r = await fetch('/api/auth/login', {
          method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ userId: user, password: user }),
        });
        window.t.csrf = (await r.json()).csrfToken;
        return r.status;
      },
      command(message) {
        return new Promise((res, rej) => {
          const channel = new MessageChannel();
          const timer = setTimeout(() => rej(new Error(`no answer to ${message.type}`)), 30000);
          channel.port1.onmessage = (e) => { clearTimeout(timer); res(e.data); };
          navigator.serviceWorker.controller.postMessage(message, [channel.port2]);
        });
      },
      async write(path, title) {
        const r = await fetch(path, {
          method: 'POST',
          headers: { 'Content-Type': 'application/json', 'X-CSRF-Token': window.t.csrf || '' },
          body: JSON.stringify({ title }),
        });
        return { status: r.status, body: await r.json().catch(() => null) };
      },
      count(db) {
        return new Promise((res, rej) => {
          const open = indexedDB.open(db);
          open.onerror = () => rej(open.error);
          open.onsuccess = () => {
            const d = open.result;
            if (!d.objectStoreNames.contains('mutations')) { d.close(); res(null); return; }
            const req = d.transaction('mutations').objectStore('mutations').count();
            req.onsuccess = () => { d.close(); res(req.result); };
            req.onerror = () => rej(req.error);
          };
        });
      },
      deleteDb(db) {
        return new Promise((res) => {
          const d = indexedDB.deleteDatabase(db);
          d.onsuccess = () => res(true);
          d.onerror = () => res(false);
        });
      },
      async caches() { return (await caches.keys()).filter((k) => k.startsWith('sw-outbox')); },
    };
  });
}

/** A tab on `path`, helpers installed, waiting for `script` (a part of its URL) to control it. */
async function openAt(h, page, path, script) {
  await page.goto(`${h.baseUrl}${path}`);
  await install(page);
  if (script) {
    await page.waitForFunction((s) => (navigator.serviceWorker.controller?.scriptURL ?? '').includes(s), script, { timeout: 20000 });
  }
  return page;
}

/** Both registrations, on a pristine origin: root first (so it claims `sw-outbox`). */
async function twoRegistrations(h, config = null) {
  const q = config ? `?config=${encodeURIComponent(JSON.stringify(config))}` : '';
  const root = await pristine(h);
  await openAt(h, root, '/plain.html');
  for (const db of ['sw-outbox:/two/', 'shared-e2e']) await root.evaluate((d) => window.t.deleteDb(d), db);
  await root.evaluate(([s]) => window.t.register(s, '/'), [`/site-sw.js${q}`]);
  await openAt(h, root, '/plain.html', '/site-sw.js');
  const two = await h.browser.newPage();
  await openAt(h, two, '/two/index.html', '/site-sw.js');
  await two.evaluate(([s]) => window.t.register(s, '/two/'), [`/two/sw.js${q}`]);
  await openAt(h, two, '/two/index.html', '/two/sw.js');
  return { root, two };
}

forEachEngine((engine, harness) => {
  test('by default two scopes keep two databases, and each replays its own records', withDiagnostics(harness, async () => {
    const h = harness();
    const { root, two } = await twoRegistrations(h);
    assert.equal(await root.evaluate(() => window.t.login('alice')), 200);
    for (const p of [root, two]) {
      const s = await p.evaluate(() => window.t.command({ type: 'AUTH_SESSION', userId: 'alice' }));
      assert.equal(s.ok, true, JSON.stringify(s));
    }
    await two.evaluate((c) => { window.t.csrf = c; }, await root.evaluate(() => window.t.csrf));
    await h.setNetwork(false);
    const a = await root.evaluate((p) => window.t.write(p, 'from the root app'), P1);
    const b = await two.evaluate((p) => window.t.write(p, 'from the /two/ app'), P1);
    assert.equal(a.status, 202, JSON.stringify(a));
    assert.equal(b.status, 202, JSON.stringify(b));
    assert.equal(await root.evaluate(() => window.t.count('sw-outbox')), 1, 'the root app\'s write only');
    assert.equal(await root.evaluate(() => window.t.count('sw-outbox:/two/')), 1, 'the /two/ app\'s write, in its own database');

    await h.setNetwork(true);
    for (const p of [root, two]) {
      const r = await p.evaluate(() => window.t.command({ type: 'FLUSH_QUEUE' }));
      assert.equal(r.ok, true, JSON.stringify(r));
    }
    await eventually(async () => (await h.applied()).length === 2, { what: 'both writes applied' });
    const applied = await h.applied();
    assert.deepEqual(applied.map((x) => x.key).sort(), [a.body.idempotencyKey, b.body.idempotencyKey].sort(), 'each applied once');
    assert.equal(await root.evaluate(() => window.t.count('sw-outbox')), 0);
    assert.equal(await root.evaluate(() => window.t.count('sw-outbox:/two/')), 0);
    await two.close();
  }));

  test('configured to share one database, a write is bound to the account the other registration persisted last',
    withDiagnostics(harness, async () => {
      const h = harness();
      const { root, two } = await twoRegistrations(h, { dbName: 'shared-e2e' });
      assert.equal(await root.evaluate(() => window.t.login('alice')), 200);
      const s1 = await root.evaluate(() => window.t.command({ type: 'AUTH_SESSION', userId: 'alice' }));
      assert.equal(s1.ok, true, JSON.stringify(s1));
      // The other app's worker persists another account (a sign-in there).
      const s2 = await two.evaluate(() => window.t.command({ type: 'AUTH_SESSION', userId: 'bob' }));
      assert.equal(s2.ok, true, JSON.stringify(s2));
      await h.setNetwork(false);
      const w = await root.evaluate((p) => window.t.write(p, 'no expected-account header'), P1);
      assert.equal(w.status, 202, JSON.stringify(w));
      const listed = await root.evaluate(() => window.t.command({ type: 'LIST_QUEUE' }));
      assert.deepEqual(listed.records.map((r) => [r.id, r.ownerId]), [[w.body.id, 'bob']],
        'bound to the session as the database holds it, never to a stale copy');
      await h.setNetwork(true);
      await two.close();
    }));

  test('a new version of one registration keeps the cache the other still uses', withDiagnostics(harness, async () => {
    const h = harness();
    const www = copies.get(engine);
    const { root, two } = await twoRegistrations(h);
    const build = /SW_OUTBOX_BUILD = "([^"]+)"/.exec(await readFile(join(www, 'pkg/build.js'), 'utf8'))[1];
    const shared = `sw-outbox-${build}-v1`;
    assert.deepEqual(await root.evaluate(() => window.t.caches()), [shared], 'one cache, both registrations');
    // The root app deploys a new shell build; the /two/ app does not.
    await writeFile(join(www, 'site-sw.js'), siteWorker('v2-next'));
    await root.evaluate(async () => (await navigator.serviceWorker.getRegistration('/')).update());
    const next = `sw-outbox-${build}-v2-next`;
    await eventually(async () => {
      const reg = await root.evaluate(async () => {
        const r = await navigator.serviceWorker.getRegistration('/');
        return { active: r.active?.state, installing: Boolean(r.installing), waiting: Boolean(r.waiting) };
      });
      return reg.active === 'activated' && !reg.installing && !reg.waiting
        && (await root.evaluate(() => window.t.caches())).includes(next);
    }, { timeout: 30000, what: 'the root registration to activate its new version' });
    // Activated: its cleanup (in activation's waitUntil) is over.
    const left = (await root.evaluate(() => window.t.caches())).sort();
    assert.deepEqual(left, [shared, next].sort(), 'the /two/ registration\'s cache is kept');
    await writeFile(join(www, 'site-sw.js'), siteWorker('v1'));
    await two.close();
  }));
}, {
  name: 'two registrations',
  async setup(engine) {
    const www = await mkdtemp(join(tmpdir(), `sw-outbox-www-two-${engine}-`));
    await cp(join(repoRoot, process.env.SW_OUTBOX_WWW || 'www'), www, { recursive: true });
    await writeFile(join(www, 'plain.html'), PLAIN);
    await mkdir(join(www, 'two'), { recursive: true });
    await writeFile(join(www, 'two/index.html'), PLAIN);
    await writeFile(join(www, 'site-sw.js'), siteWorker('v1'));
    await writeFile(join(www, 'two/sw.js'), siteWorker('v1'));
    copies.set(engine, www);
    return { www };
  },
  async teardown(engine) {
    const www = copies.get(engine);
    if (www) await rm(www, { recursive: true, force: true });
  },
});
