// Every engine: which account a window is on outlives the worker (contract 5, r4; issue
// 34, items 4 and 8a), with an app written from the contract that keeps its bearer token
// per tab (no cookie at all: the reference server's `--auth bearer`), so two tabs of one
// browser are on two accounts. Raw pages (tab.html), no page helper: each tab signs in
// with its own token, names its account with AUTH_SESSION, sets X-PM-Expected-Account on
// its writes, and answers AUTH_NEEDED for its own account only.
// - Tab A on alice, tab B on bob (B's AUTH_SESSION last), tab C never named one: each
//   write's MUTATION_QUEUED reaches its account's tab only; after the browser stops the
//   worker (engines that can) the next flush asks bob's credential from tab B only, and
//   bob's MUTATION_SETTLED reaches tab B only; after a second stop, alice's reaches tab A
//   only. No tab ever receives another account's results or its records' details, before
//   and after the restarts, and tab C receives none.
// - A write answered while only another account's window is open: its MUTATION_SETTLED is
//   kept and given to a window of its account when one opens and names it.
// - Offline, the app's sign-in (/api/login) and token refresh (/api/refresh) are never
//   queued (the default authRoutePattern, r4): no password or refresh token in IndexedDB.
import assert from 'node:assert/strict';
import { cp, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { test } from 'node:test';
import { lacks } from './engines.mjs';
import { repoRoot } from './harness.mjs';
import { eventually, forEachEngine, pristine, withDiagnostics } from './outbox-helpers.mjs';

const TAB = '<!doctype html><html><head><meta charset="utf-8"><title>tab</title></head><body>a tab of a bearer app</body></html>\n';
const copies = new Map();

/** The tab's own helpers (`window.t`): its token, its account, every report it got. */
async function openTab(h, page) {
  await page.goto(`${h.baseUrl}/tab.html`);
  await page.evaluate(() => {
    window.t = {
      me: null,
      auth: null,
      msgs: [],
      async register() {
        const config = encodeURIComponent(JSON.stringify({ precache: [] }));
        const reg = await navigator.serviceWorker.register(`/sw.js?config=${config}`, { scope: '/' });
        const w = reg.installing || reg.waiting || reg.active;
        if (w.state !== 'activated') {
          await new Promise((res) => w.addEventListener('statechange', () => { if (w.state === 'activated') res(); }));
        }
      },
      command(message) {
        return new Promise((res, rej) => {
          const channel = new MessageChannel();
          const timer = setTimeout(() => rej(new Error(`no answer to ${message.type}`)), 30000);
          channel.port1.onmessage = (e) => { clearTimeout(timer); res(e.data); };
          navigator.serviceWorker.controller.postMessage(message, [channel.port2]);
        });
      },
      /** This tab names its account (with its own token). */
      name() {
        return window.t.command({ type: 'AUTH_SESSION', userId: window.t.me, authorization: window.t.auth });
      },
      async login(user) {
        const r = await fetch('/api/auth/login', {
          method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ userId: user, password: user }),
        });
        const body = await r.json();
        window.t.me = user;
        window.t.auth = `Bearer ${body.accessToken}`;
        return window.t.name();
      },
      async write(title) {
        const r = await fetch(`/api/projects/p-${window.t.me}/tasks`, {
          method: 'POST',
          headers: {
            'Content-Type': 'application/json', Authorization: window.t.auth, 'X-PM-Expected-Account': window.t.me,
          },
          body: JSON.stringify({ title }),
        });
        return { status: r.status, body: await r.json().catch(() => null) };
      },
    };
    navigator.serviceWorker.addEventListener('message', (e) => {
      const m = e.data;
      window.t.msgs.push(JSON.parse(JSON.stringify(m)));
      // A bearer app answers the worker's request for its own account's credential.
      if (m && m.type === 'AUTH_NEEDED' && m.userId === window.t.me) window.t.name();
    });
    navigator.serviceWorker.startMessages();
  });
  return page;
}

/** A tab's messages that belong to another account than its own (`me`; null: none). */
async function foreign(page) {
  return page.evaluate(() => {
    const me = window.t.me;
    const mine = (owner) => owner === null || owner === undefined || owner === me;
    return window.t.msgs.filter((m) => {
      switch (m.type) {
        case 'MUTATION_QUEUED':
        case 'MUTATION_SETTLED':
          return !mine(m.ownerId);
        case 'AUTH_NEEDED':
          return m.userId !== me;
        case 'MUTATIONS_BLOCKED':
          return m.blocked.some((b) => !mine(b.ownerId) && (b.method || b.path || b.workspace));
        default:
          return false;
      }
    });
  });
}

const received = (page, type, id) => page.evaluate(([ty, i]) => window.t.msgs.filter((m) => m.type === ty && (i === undefined || m.id === i)), [type, id]);

/** A pristine origin, the worker registered, `n` tabs open on tab.html. */
async function tabs(h, n) {
  const first = await pristine(h);
  const out = [await openTab(h, first)];
  await first.evaluate(() => window.t.register());
  await first.waitForFunction(() => navigator.serviceWorker.controller !== null, null, { timeout: 30000 });
  for (let i = 1; i < n; i += 1) {
    const p = await openTab(h, await h.browser.newPage());
    await p.waitForFunction(() => navigator.serviceWorker.controller !== null, null, { timeout: 30000 });
    out.push(p);
  }
  return out;
}

forEachEngine((engine, harness) => {
  test('two tabs on two accounts: no tab ever receives the other account\'s reports, before and after the worker restarts',
    withDiagnostics(harness, async () => {
      const h = harness();
      const [a, b, c] = await tabs(h, 3);
      try {
        assert.equal((await a.evaluate(() => window.t.login('alice'))).ok, true);
        assert.equal((await b.evaluate(() => window.t.login('bob'))).ok, true);
        await h.setNetwork(false);
        const wa = await a.evaluate(() => window.t.write('alice offline'));
        const wb = await b.evaluate(() => window.t.write('bob offline'));
        assert.equal(wa.status, 202, JSON.stringify(wa));
        assert.equal(wb.status, 202, JSON.stringify(wb));
        await eventually(async () => (await received(a, 'MUTATION_QUEUED', wa.body.id)).length === 1
          && (await received(b, 'MUTATION_QUEUED', wb.body.id)).length === 1, { what: 'each tab told of its own write' });
        const restarts = !lacks(engine, 'stopWorkers');
        if (restarts) await h.stopWorkers();
        await h.setNetwork(true);
        // Tab A asks for a flush; the session is bob's (B named it last): bob's credential
        // is asked of tab B (a restarted worker holds none), and bob's write replayed.
        const flushed = await a.evaluate(() => window.t.command({ type: 'FLUSH_QUEUE' }));
        assert.equal(flushed.type, 'COMMAND_RESULT', JSON.stringify(flushed));
        await eventually(async () => (await h.applied()).some((x) => x.key === wb.body.idempotencyKey),
          { timeout: 30000, what: 'bob\'s write replayed' });
        await eventually(async () => (await received(b, 'MUTATION_SETTLED', wb.body.id)).length === 1,
          { what: 'tab B told what its write answered' });
        if (restarts) await h.stopWorkers();
        // Tab A names alice again (its token), and her write goes.
        assert.equal((await a.evaluate(() => window.t.name())).ok, true);
        await a.evaluate(() => window.t.command({ type: 'FLUSH_QUEUE' }));
        await eventually(async () => (await h.applied()).some((x) => x.key === wa.body.idempotencyKey),
          { timeout: 30000, what: 'alice\'s write replayed' });
        const settled = await eventually(async () => (await received(a, 'MUTATION_SETTLED', wa.body.id))[0],
          { what: 'tab A told what its write answered' });
        assert.equal(JSON.parse(settled.body).title, 'alice offline', 'the created entity, to its own tab');
        // A last report round for every tab to have heard everything sent.
        await b.evaluate(() => window.t.command({ type: 'FLUSH_QUEUE' }));
        assert.deepEqual(await foreign(a), [], 'tab A (alice) got nothing of bob\'s');
        assert.deepEqual(await foreign(b), [], 'tab B (bob) got nothing of alice\'s');
        assert.deepEqual(await foreign(c), [], 'tab C (no account named) got nobody\'s');
        assert.deepEqual(await c.evaluate(() => window.t.msgs.filter((m) => ['MUTATION_QUEUED', 'MUTATION_SETTLED', 'AUTH_NEEDED'].includes(m.type))), [],
          'a window of no known account gets another account\'s treatment');
        const applied = await h.applied();
        assert.deepEqual(applied.map((x) => [x.key, x.user]).sort(),
          [[wa.body.idempotencyKey, 'alice'], [wb.body.idempotencyKey, 'bob']].sort(), 'each once, as its account');
      } finally {
        await b.close();
        await c.close();
      }
    }));

  test('a write answered while only another account\'s window is open: its MUTATION_SETTLED waits for a window of its account',
    withDiagnostics(harness, async () => {
      const h = harness();
      const [a, b] = await tabs(h, 2);
      let a2;
      try {
        assert.equal((await b.evaluate(() => window.t.login('bob'))).ok, true);
        assert.equal((await a.evaluate(() => window.t.login('alice'))).ok, true);
        const token = await a.evaluate(() => window.t.auth);
        await h.setNetwork(false);
        const wa = await a.evaluate(() => window.t.write('answered while away'));
        assert.equal(wa.status, 202, JSON.stringify(wa));
        await a.close();
        // The closed tab leaves the worker's client list (not a time the test measures).
        await new Promise((r) => setTimeout(r, 500));
        await h.setNetwork(true);
        // Bob's tab asks for a flush: the session (alice's, named last) replays her write.
        await b.evaluate(() => window.t.command({ type: 'FLUSH_QUEUE' }));
        await eventually(async () => (await h.applied()).some((x) => x.key === wa.body.idempotencyKey),
          { timeout: 30000, what: 'alice\'s write replayed' });
        await b.evaluate(() => window.t.command({ type: 'FLUSH_QUEUE' }));
        assert.deepEqual(await foreign(b), [], 'bob\'s tab got nothing of alice\'s');
        // Alice opens the app again and names her account: the answer is hers.
        a2 = await openTab(h, await h.browser.newPage());
        await a2.waitForFunction(() => navigator.serviceWorker.controller !== null, null, { timeout: 30000 });
        await a2.evaluate((auth) => { window.t.me = 'alice'; window.t.auth = auth; }, token);
        assert.equal((await a2.evaluate(() => window.t.name())).ok, true);
        const settled = await eventually(async () => (await received(a2, 'MUTATION_SETTLED', wa.body.id))[0],
          { what: 'the kept MUTATION_SETTLED' });
        assert.equal(settled.ownerId, 'alice');
        assert.equal(settled.idempotencyKey, wa.body.idempotencyKey);
        assert.equal(JSON.parse(settled.body).title, 'answered while away');
        assert.deepEqual(await foreign(a2), []);
        // Given once: the next window of hers does not get it again.
        await a2.evaluate(() => window.t.name());
        await a2.evaluate(() => window.t.command({ type: 'FLUSH_QUEUE' }));
        assert.equal((await received(a2, 'MUTATION_SETTLED', wa.body.id)).length, 1);
      } finally {
        await b.close();
      }
    }));

  // Issue 34, item 3: the contract's bearer app signs in at /api/login and refreshes at
  // /api/refresh, with the default authRoutePattern.
  test('a sign-in and a token refresh under /api are never queued: offline, no password or refresh token is stored',
    withDiagnostics(harness, async () => {
      const h = harness();
      const [page] = await tabs(h, 1);
      await h.setNetwork(false);
      const answers = await page.evaluate(async () => {
        const post = async (path, body) => {
          const r = await fetch(path, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
          return { path, status: r.status, body: await r.json().catch(() => null) };
        };
        return [
          await post('/api/login', { userId: 'alice', password: 'pw-secret-4711' }),
          await post('/api/refresh', { refreshToken: 'rt-secret-0815' }),
          await post('/api/sessions', { userId: 'alice', password: 'pw-secret-4711' }),
        ];
      });
      for (const a of answers) {
        assert.equal(a.status, 503, `${a.path} goes to the network only: ${JSON.stringify(a)}`);
        assert.deepEqual(a.body, { error: 'offline' }, `${a.path}: never claimed queued`);
      }
      const listed = await page.evaluate(() => window.t.command({ type: 'LIST_QUEUE' }));
      assert.deepEqual(listed.records, [], 'nothing queued');
      // Every value of every database of the origin, bodies decoded: no secret anywhere.
      const dump = await page.evaluate(async () => {
        const text = (v) => {
          if (v instanceof ArrayBuffer || ArrayBuffer.isView(v)) return new TextDecoder().decode(v);
          if (v && typeof v === 'object') return Object.values(v).map(text).join(' ');
          return String(v);
        };
        const names = (await indexedDB.databases()).map((d) => d.name);
        let out = '';
        for (const name of names) {
          const db = await new Promise((res, rej) => { const o = indexedDB.open(name); o.onsuccess = () => res(o.result); o.onerror = () => rej(o.error); });
          for (const store of db.objectStoreNames) {
            const all = await new Promise((res, rej) => {
              const r = db.transaction(store).objectStore(store).getAll();
              r.onsuccess = () => res(r.result);
              r.onerror = () => rej(r.error);
            });
            out += `${name}/${store}: ${all.map(text).join(' ')}\n`;
          }
          db.close();
        }
        return out;
      });
      assert.ok(dump.includes('sw-outbox'), `the outbox's database was read: ${dump}`);
      assert.ok(!dump.includes('pw-secret-4711') && !dump.includes('rt-secret-0815'), `a secret was stored: ${dump}`);
      await h.setNetwork(true);
    }));
}, {
  name: 'window accounts',
  async setup(engine) {
    const www = await mkdtemp(join(tmpdir(), `sw-outbox-www-tabs-${engine}-`));
    await cp(resolve(repoRoot, process.env.SW_OUTBOX_WWW || 'www'), www, { recursive: true });
    await writeFile(join(www, 'tab.html'), TAB);
    copies.set(engine, www);
    return { www, serverArgs: ['--auth', 'bearer'] };
  },
  async teardown(engine) {
    const www = copies.get(engine);
    if (www) await rm(www, { recursive: true, force: true });
  },
});
