// Every engine: the sign-in barrier belongs to the origin (contract 4.5, r4; issue 34,
// item 2), against a server that does not check X-PM-Expected-Account: the Express +
// express-idempotency app of tests/interop, with CSRF tokens that belong to the browser
// (`device` mode) and every write held a little (`hold`).
//
// Two registrations of one origin, each with its own worker and database, as a site with
// an app beside its admin would have:
//   /app/sw.js    scope /app/    /app/index.html
//   /admin/sw.js  scope /admin/  /admin/index.html
// Each run: alice queues RECORDS writes offline through /app/, the network comes back and
// /app/'s flush starts; once the server holds the first replay, after a random part of
// the flush's length, the /admin/ page signs in as bob (POST /api/auth/login through the
// /admin/ worker, then AUTH_SESSION to it). The /app/ worker never sees that request.
// Without the origin-wide barrier the records /app/ sends after it carry bob's cookie and
// the browser's CSRF token, and the server applies them as bob (measured before: 26–30 of
// alice's writes applied as bob in 8–9 of 20 runs). The check, over every run: no write of
// alice's is ever applied under another account. Runs where bob's sign-in landed with
// some of alice's writes applied and some not are counted: the race must have been met.
//
// Also: a sign-in outside apiPrefix (a GET navigation to /login, in the scope of a third
// registration at / which only observes it: no respondWith) makes the /app/ worker name
// the account again before its next replay.
//
//   RACE_RUNS=<n> (default 20) runs per engine; E2E_ENGINES as for the other suites.
import assert from 'node:assert/strict';
import { cp, mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { describe, after, before, test } from 'node:test';
import { launchEngine, selectedEngines } from './engines.mjs';
import { repoRoot } from './harness.mjs';
import { startInteropServer } from '../interop/harness.mjs';
import { atProcessEnd } from './processes.mjs';

const RUNS = Number(process.env.RACE_RUNS || 20);
const RECORDS = 4;
const HOLD_MS = 150;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function eventually(fn, what, timeout = 30000, interval = 20) {
  const end = Date.now() + timeout;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out after ${timeout} ms waiting for ${what}`);
    await sleep(interval);
  }
}

/** A site worker script for one scope, importing the outbox's sw.js. */
const siteWorker = `self.SW_OUTBOX_BASE = '/';
self.SW_OUTBOX_CONFIG = { precache: [], attemptTimeoutMs: 3000 };
importScripts('/sw.js');
`;
const PLAIN = '<!doctype html><html><head><meta charset="utf-8"><title>a page of the origin</title></head><body>page</body></html>\n';

/** In-page helpers (`window.t`), raw as a site of its own would write them. */
function installHelpers(page) {
  return page.evaluate(() => {
    window.t = {
      async register(script, scope) {
        const reg = await navigator.serviceWorker.register(script, { scope });
        const w = reg.installing || reg.waiting || reg.active;
        if (w.state !== 'activated') {
          await new Promise((res) => w.addEventListener('statechange', () => { if (w.state === 'activated') res(); }));
        }
        return reg.scope;
      },
      command(message) {
        return new Promise((res, rej) => {
          const channel = new MessageChannel();
          const timer = setTimeout(() => rej(new Error(`no answer to ${message.type}`)), 30000);
          channel.port1.onmessage = (e) => { clearTimeout(timer); res(e.data); };
          navigator.serviceWorker.controller.postMessage(message, [channel.port2]);
        });
      },
      async signIn(user) {
        const r = await fetch('/api/auth/login', {
          method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ userId: user, password: user }),
        });
        const body = await r.json().catch(() => null);
        if (r.ok) window.t.csrf = body.csrfToken;
        const session = r.ok ? await window.t.command({ type: 'AUTH_SESSION', userId: user }) : null;
        return { status: r.status, session };
      },
      async write(title) {
        const r = await fetch('/api/projects/p1/tasks', {
          method: 'POST',
          headers: { 'Content-Type': 'application/json', 'X-CSRF-Token': window.t.csrf || '' },
          body: JSON.stringify({ title }),
        });
        return { status: r.status, body: await r.json().catch(() => null) };
      },
    };
  });
}

/** Opens `path` in `page`, helpers installed, and waits until `script` controls it. */
async function openAt(page, base, path, script) {
  await page.goto(`${base}${path}`);
  await installHelpers(page);
  if (script) {
    await page.waitForFunction((s) => (navigator.serviceWorker.controller?.scriptURL ?? '').includes(s), script, { timeout: 30000 });
  }
  return page;
}

for (const engine of selectedEngines()) {
  describe(`${engine}: the sign-in barrier across an origin's workers`, () => {
    let server;
    let browser;
    let www;
    let unhook = () => {};
    let app;
    let admin;
    before(async () => {
      www = await mkdtemp(join(tmpdir(), `sw-outbox-www-origin-${engine}-`));
      await cp(resolve(repoRoot, process.env.SW_OUTBOX_WWW || 'www'), www, { recursive: true });
      for (const dir of ['app', 'admin']) {
        await mkdir(join(www, dir), { recursive: true });
        await writeFile(join(www, dir, 'index.html'), PLAIN);
        await writeFile(join(www, dir, 'sw.js'), siteWorker);
      }
      await writeFile(join(www, 'plain.html'), PLAIN);
      await writeFile(join(www, 'root-sw.js'), siteWorker);
      server = await startInteropServer({ www });
      unhook = atProcessEnd(() => server.stop());
      browser = await launchEngine(engine);
      // Both registrations, /app/ first (it claims the default database).
      app = browser.pages()[0] ?? await browser.newPage();
      await openAt(app, server.baseUrl, '/app/index.html');
      await app.evaluate(() => window.t.register('/app/sw.js', '/app/'));
      await openAt(app, server.baseUrl, '/app/index.html', '/app/sw.js');
      // A third, at the root: the scope of /login.
      await openAt(app, server.baseUrl, '/plain.html');
      await app.evaluate(() => window.t.register('/root-sw.js', '/'));
      await openAt(app, server.baseUrl, '/app/index.html', '/app/sw.js');
      admin = await browser.newPage();
      await openAt(admin, server.baseUrl, '/admin/index.html');
      await admin.evaluate(() => window.t.register('/admin/sw.js', '/admin/'));
      await openAt(admin, server.baseUrl, '/admin/index.html', '/admin/sw.js');
    });
    after(async () => {
      await browser?.close().catch(() => {});
      await server?.stop().catch(() => {});
      if (www) await rm(www, { recursive: true, force: true });
      unhook();
    });

    /** Both devices cleared, the server reset, alice signed in through both apps. */
    async function cleanStart() {
      for (const p of [app, admin]) {
        const cleared = await p.evaluate(() => window.t.command({ type: 'CLEAR_DEVICE' }));
        assert.equal(cleared.ok, true, `CLEAR_DEVICE: ${JSON.stringify(cleared)}`);
      }
      await server.reset();
      await server.csrfMode('device');
      const alice = await app.evaluate(() => window.t.signIn('alice'));
      assert.equal(alice.status, 200, `alice signs in: ${JSON.stringify(alice)}`);
      assert.equal(alice.session?.ok, true, JSON.stringify(alice.session));
      const there = await admin.evaluate(() => window.t.command({ type: 'AUTH_SESSION', userId: 'alice' }));
      assert.equal(there.ok, true, JSON.stringify(there));
    }

    /** Alice's writes queued offline through /app/; their keys. */
    async function queueAlices(run) {
      await server.setNetwork(false);
      const keys = [];
      for (let i = 0; i < RECORDS; i += 1) {
        const r = await app.evaluate((title) => window.t.write(title), `run ${run} #${i}`);
        assert.equal(r.status, 202, `queued: ${JSON.stringify(r)}`);
        keys.push(r.body.idempotencyKey);
      }
      return keys;
    }

    /** Waits until no write has run for a while (the flushes settled). */
    async function quiet() {
      let still = 0;
      await eventually(async () => {
        still = (await server.running()) === 0 ? still + 1 : 0;
        return still >= 10;
      }, 'the flushes to settle', 60000, 50);
    }

    test(`a sign-in through another registration never gets the replaying one's writes applied as its account (${RUNS} runs)`,
      { timeout: RUNS * 60000 + 60000 },
      async (t) => {
        const violations = [];
        let raced = 0;
        const outcomes = [];
        for (let run = 0; run < RUNS; run += 1) {
          await cleanStart();
          const keys = await queueAlices(run);
          await server.hold(HOLD_MS);
          await server.setNetwork(true);
          await app.evaluate(() => { window.__flush = window.t.command({ type: 'FLUSH_QUEUE' }); return true; });
          await eventually(async () => (await server.running()) > 0, 'the first replay to reach the server');
          await sleep(Math.floor(Math.random() * HOLD_MS * (RECORDS - 1)));
          const bob = await admin.evaluate(() => window.t.signIn('bob'));
          assert.equal(bob.status, 200, `bob signs in through /admin/: ${JSON.stringify(bob)}`);
          await quiet();
          await server.hold(0);

          const applied = await server.applied();
          for (const a of applied) {
            if (!keys.includes(a.key) || a.account !== 'alice') violations.push({ run, ...a });
          }
          const alices = applied.filter((a) => keys.includes(a.key) && a.account === 'alice').length;
          outcomes.push(alices);
          if (alices > 0 && alices < RECORDS) raced += 1;
        }
        assert.deepEqual(violations, [], `writes applied under another account than alice's (runs: ${RUNS}, alice's applied per run: ${outcomes.join(',')})`);
        assert.ok(raced >= Math.max(1, Math.floor(RUNS / 5)),
          `bob's sign-in landed mid-flush in only ${raced} of ${RUNS} runs (alice's applied per run: ${outcomes.join(',')}): the race was not exercised`);
        t.diagnostic(`sign-in landed mid-flush in ${raced} of ${RUNS} runs; alice's applied per run: ${outcomes.join(',')}`);
      });

    test('a sign-in outside apiPrefix (observed, not answered) makes the replaying worker name the account again', async () => {
      await cleanStart();
      const keys = await queueAlices('observed');
      const before = (await server.requests()).length;
      // Long enough for the root worker to start and load its module meanwhile.
      await server.hold(1500);
      await server.setNetwork(true);
      await app.evaluate(() => { window.__flush = window.t.command({ type: 'FLUSH_QUEUE' }); return true; });
      await eventually(async () => (await server.running()) > 0, 'the first replay to reach the server');
      // A navigation to the site's sign-in page: the root registration's worker sees it
      // (the /app/ worker does not), leaves it to the network, and raises the barrier.
      const tab = await browser.newPage();
      try {
        await tab.goto(`${server.baseUrl}/login?from=test`);
      } finally {
        await tab.close();
      }
      await quiet();
      await server.hold(0);
      await eventually(async () => (await server.applied()).length === RECORDS, 'every write applied', 30000, 100);
      const rs = (await server.requests()).slice(before);
      // Each replay with its place among the identity checks.
      const firstWrite = rs.findIndex((r) => keys.includes(r.key));
      const later = rs.slice(firstWrite + 1);
      const nextWrite = later.findIndex((r) => keys.includes(r.key));
      assert.ok(nextWrite >= 0, `a second replay: ${JSON.stringify(rs)}`);
      assert.ok(later.slice(0, nextWrite).some((r) => r.path === '/api/auth/me'),
        `the account was named again between the replay under way at the sign-in and the next: ${JSON.stringify(rs.map((r) => `${r.method} ${r.path} ${r.key ?? ''}`))}`);
      const applied = await server.applied();
      assert.deepEqual(applied.map((a) => a.account), Array(RECORDS).fill('alice'));
    });
  });
}
