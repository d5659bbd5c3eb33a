// Every engine: the origin's caches lock (`sw-outbox:caches`, under which every
// registration's activation deletes older builds' caches) is held only while caches are
// touched, never across a fetch (issue 34, item 8e):
// - CLEAR_DEVICE's shell refresh writes the cache under that lock: while another holder
//   (here the page, standing in for an activation's cleanup) has it, the refresh changes
//   nothing, and it writes the fresh copies once the lock is free;
// - a restarted worker's restoreShell fetches a missing precache entry outside the lock,
//   within `attemptTimeoutMs`: an entry whose server never answers neither holds the
//   lock nor keeps its request open for good (engines that can stop a worker).
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { test } from 'node:test';
import { lacks } from './engines.mjs';
import { eventually, freshStart, openWith, withDiagnostics, forEachEngine } from './outbox-helpers.mjs';

/** The build's cache name, from the page. */
const buildCache = (page) => page.evaluate(async () => (await caches.keys()).find((k) => k.startsWith('sw-outbox-')));

forEachEngine((engine, harness) => {
  test('CLEAR_DEVICE\'s shell refresh writes the cache only under the caches lock', withDiagnostics(harness, async () => {
    const h = harness();
    const page = await freshStart(h);
    const cache = await buildCache(page);
    assert.ok(cache, 'the build cache exists');
    const url = `${h.baseUrl}/app.css`;
    await page.evaluate(async ([name, u]) => {
      await (await caches.open(name)).put(u, new Response('/* a copy from before the clear */', { headers: { 'Content-Type': 'text/css' } }));
      // The page takes the lock, as another registration's activation would.
      window.__release = await new Promise((granted) => {
        navigator.locks.request('sw-outbox:caches', () => new Promise((release) => granted(release)));
      });
      window.__cleared = null;
      window.demo.client.clearDevice().then((r) => { window.__cleared = r; }, (e) => { window.__cleared = { error: String(e) }; });
    }, [cache, url]);
    // Without the lock the refresh would have written by now (it answers after it did);
    // with it, it waits.
    const early = await eventually(() => page.evaluate(() => window.__cleared), { timeout: 5000, what: 'nothing' }).catch(() => null);
    const held = await page.evaluate(async ([name, u]) => (await (await caches.open(name)).match(u))?.text(), [cache, url]);
    assert.equal(held, '/* a copy from before the clear */', `the cache was written while another held the lock (CLEAR_DEVICE answered: ${JSON.stringify(early)})`);
    await page.evaluate(() => window.__release());
    const cleared = await eventually(() => page.evaluate(() => window.__cleared), { timeout: 30000, what: 'CLEAR_DEVICE\'s answer' });
    assert.equal(cleared.ok, true, JSON.stringify(cleared));
    const after = await page.evaluate(async ([name, u]) => (await (await caches.open(name)).match(u))?.text(), [cache, url]);
    assert.notEqual(after, '/* a copy from before the clear */', 'refreshed once the lock was free');
    assert.ok(after && after.length > 0, 'the fresh copy');
  }));

  test('a restarted worker restores a missing shell entry without holding the caches lock across its fetch, within attemptTimeoutMs',
    { skip: lacks(engine, 'stopWorkers') }, withDiagnostics(harness, async () => {
      const h = harness();
      // Another origin's file, served with CORS, that stops answering on demand.
      let hang = false;
      const requests = [];
      const slow = createServer((req, res) => {
        const entry = { at: Date.now(), closed: false };
        requests.push(entry);
        req.on('close', () => { entry.closed = true; });
        res.on('close', () => { entry.closed = true; });
        if (hang) return;
        res.writeHead(200, { 'Content-Type': 'text/css', 'Access-Control-Allow-Origin': '*', 'Cache-Control': 'no-store' });
        res.end('/* slow */');
      });
      await new Promise((r) => slow.listen(0, '127.0.0.1', r));
      const slowUrl = `http://127.0.0.1:${slow.address().port}/slow.css`;
      try {
        const page = await openWith(h, { precache: ['./', slowUrl], attemptTimeoutMs: 3000 }, { user: null });
        const cache = await buildCache(page);
        assert.ok(await page.evaluate(async ([name, u]) => Boolean(await (await caches.open(name)).match(u)), [cache, slowUrl]),
          'precached at install');
        await page.evaluate(async ([name, u]) => (await caches.open(name)).delete(u), [cache, slowUrl]);
        hang = true;
        const before = requests.length;
        await h.stopWorkers();
        // Any event starts the worker again; its start restores the shell.
        await page.evaluate(() => window.demo.client.list());
        await eventually(() => requests.length > before, { timeout: 20000, what: 'the restore\'s request' });
        const restore = requests[requests.length - 1];
        const held = await page.evaluate(async () => (await navigator.locks.query()).held.map((l) => l.name));
        assert.ok(!held.includes('sw-outbox:caches'), `the caches lock is held across a fetch: ${JSON.stringify(held)}`);
        await eventually(() => restore.closed, { timeout: 20000, what: 'the hung request to be given up' });
        assert.ok(!(await page.evaluate(async () => (await navigator.locks.query()).held.map((l) => l.name))).includes('sw-outbox:caches'));
      } finally {
        hang = false;
        slow.closeAllConnections();
        await new Promise((r) => slow.close(r));
      }
    }));
}, { name: 'caches lock' });
