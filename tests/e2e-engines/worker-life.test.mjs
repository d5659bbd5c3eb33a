// Worker life. Every engine that can stop a service worker from a test (Chromium through
// CDP, Firefox through its service-worker manager): the persisted session binds writes
// after the worker was stopped and started again, and a write queued before the stop is
// replayed once by the restarted worker, with the key of its 202. Every engine:
// FLUSH_QUEUEs asked for during a flush are coalesced into exactly one more flush (the
// exact count of flushes where the browser has Background Sync, see the test).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { lacks } from './engines.mjs';
import {
  apiCall, eventually, flush, forEachEngine, freshStart, lastSeq, listQueue, queuedWrite, signIn, withDiagnostics,
  writesIn,
} from './outbox-helpers.mjs';

/** A write from the page without the page's own expected-account header. */
function bareWrite(page, path, body) {
  return page.evaluate(async ([p, b]) => {
    const r = await fetch(p, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', 'X-CSRF-Token': window.demo.state.csrf ?? '' },
      body: JSON.stringify(b),
    });
    return { status: r.status, body: await r.json().catch(() => null) };
  }, [path, body]);
}

forEachEngine((engine, harness) => {
  test('AUTH_SESSION survives a worker stop and binds the next queued write', { skip: lacks(engine, 'stopWorkers') },
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await freshStart(h);
      await signIn(page, 'alice');
      const starts = await h.workerStarts();
      await h.stopWorkers();
      await h.setNetwork(false);
      const r = await bareWrite(page, '/api/projects/p1/tasks', { title: 'after restart' });
      assert.equal(r.status, 202, JSON.stringify(r));
      await eventually(async () => await h.workerStarts() > starts, { what: 'the write to start the stopped worker again' });
      const state = await page.evaluate(() => window.demo.client.list());
      const rec = state.records.find((x) => x.id === r.body.id);
      assert.ok(rec, `record ${r.body.id} listed: ${JSON.stringify(state)}`);
      assert.equal(rec.ownerId, 'alice', 'bound to the persisted session, not unknown');
      assert.equal(rec.workspace, 'p1');
      await h.setNetwork(true);
      const flushed = await page.evaluate(() => window.demo.client.flush());
      assert.equal(flushed.ok, true, JSON.stringify(flushed));
      const applied = await h.applied();
      assert.equal(applied.length, 1);
      assert.equal(applied[0].key, r.body.idempotencyKey);
    }));

  test('a write queued before a worker stop is replayed once by the restarted worker, with its key', { skip: lacks(engine, 'stopWorkers') },
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await freshStart(h);
      await signIn(page, 'alice');
      await h.setNetwork(false);
      const q = await queuedWrite(page, '/api/projects/p2/tasks', { title: 'queued, then the worker stopped' });
      const starts = await h.workerStarts();
      await h.stopWorkers();
      // The next message starts the worker again; its queue is read from IndexedDB. The
      // network stays down until the record is seen: the restarted worker's start flush
      // would otherwise replay it before the listing.
      const records = await listQueue(page);
      await eventually(async () => await h.workerStarts() > starts, { what: 'the command to start the stopped worker again' });
      assert.deepEqual(records.map((x) => [x.id, x.ownerId, x.state]), [[q.id, 'alice', 'queued']], 'the record survived the stop');
      await h.setNetwork(true);
      const flushed = await page.evaluate(() => window.demo.client.flush());
      assert.equal(flushed.ok, true, JSON.stringify(flushed));
      const applied = await eventually(async () => { const a = await h.applied(); return a.length ? a : null; }, { what: 'the replay' });
      assert.deepEqual(applied.map((a) => [a.user, a.key]), [['alice', q.key]], JSON.stringify(applied));
      assert.deepEqual(await listQueue(page), []);
    }));

  // Issue 36: a worker of an installed version, started again for a page's navigation and
  // files, imports the module's scripts (half a megabyte of script text) only when an
  // event first needs the module, and then starts it from them, offline too. The worker's
  // own User Timing marks say when the import happened: after its first fetch event (the
  // navigation), not during its first evaluation. Chromium only: Playwright evaluates
  // in a service worker there.
  test('a restarted worker imports the module\'s scripts when an event first needs them', { skip: engine !== 'chromium' && 'Playwright evaluates in service workers in Chromium only' },
    withDiagnostics(harness, async () => {
      const h = harness();
      let page = await freshStart(h);
      await signIn(page, 'alice');
      const context = h.browser.context;
      const starts = await h.workerStarts();
      await h.stopWorkers();
      page = await h.openDemo({ page });
      await eventually(async () => await h.workerStarts() > starts, { what: 'the navigation to start the stopped worker' });
      const marks = () => eventually(async () => {
        for (const w of context.serviceWorkers()) {
          const m = await w.evaluate(() => Object.fromEntries(performance.getEntriesByType('mark')
            .map((x) => [x.name.replace('sw-outbox:', ''), x.startTime]))).catch(() => null);
          if (m && 'first-fetch' in m) return m;
        }
        return null;
      }, { what: 'the restarted worker\'s marks' });
      const atStart = await marks();
      assert.ok('glue' in atStart, JSON.stringify(atStart));
      assert.ok(!('module-scripts' in atStart) || atStart['module-scripts'] > atStart['first-fetch'],
        `not imported during the first evaluation: ${JSON.stringify(atStart)}`);
      await h.setNetwork(false);
      const r = await bareWrite(page, '/api/projects/p1/tasks', { title: 'after a restart, offline' });
      assert.equal(r.status, 202, JSON.stringify(r));
      const after = await marks();
      assert.ok(after['module-scripts'] > after['first-fetch'] && after.started > after['module-scripts'],
        `imported when needed, then started: ${JSON.stringify(after)}`);
      await h.setNetwork(true);
      const flushed = await page.evaluate(() => window.demo.client.flush());
      assert.equal(flushed.ok, true, JSON.stringify(flushed));
      const applied = await h.applied();
      assert.deepEqual(applied.map((a) => [a.user, a.key]), [['alice', r.body.idempotencyKey]]);
    }));

  // Issue 36: a worker started by an online write decides it on the view read at its
  // start. The write sees the records of its lane left in the queue and queues behind
  // them, unsent; a write of another workspace goes through; the lane then applies in
  // issue order.
  test('the online write that starts a stopped worker still queues behind the queued records of its lane', { skip: lacks(engine, 'stopWorkers') },
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await freshStart(h);
      await signIn(page, 'alice');
      await h.setNetwork(false);
      const a = await queuedWrite(page, '/api/projects/p1/tasks', { title: 'A: queued, then the worker stopped' });
      // Any replay of p1 answers 503 with a short Retry-After, so A stays queued whenever
      // the start flush runs and the test decides when the lane moves.
      await h.control('faults', { rules: [{ path: '/api/projects/p1/tasks', method: 'POST', kind: 'status', status: 503, retryAfter: '1' }] });
      await h.setNetwork(true);
      const starts = await h.workerStarts();
      await h.stopWorkers();
      const since = await lastSeq(h);
      const b = await apiCall(page, 'POST', '/api/projects/p1/tasks', { title: 'B: online, starts the worker' });
      await eventually(async () => await h.workerStarts() > starts, { what: 'the write to start the stopped worker again' });
      assert.equal(b.status, 202, `B is queued behind A, not sent: ${JSON.stringify(b)}`);
      assert.equal(b.body.queued, true, JSON.stringify(b));
      const c = await apiCall(page, 'POST', '/api/projects/p2/tasks', { title: 'C: another workspace' });
      assert.equal(c.status, 201, `C has nothing ahead of it: ${JSON.stringify(c)}`);
      const sentB = writesIn(await h.requests(), since).filter((r) => r.key === b.body.idempotencyKey);
      assert.deepEqual(sentB, [], 'B was not sent while A was queued');
      await h.control('faults', { rules: [] });
      await eventually(async () => {
        const r = await flush(page);
        return r.ok && (await listQueue(page)).length === 0;
      }, { timeout: 20000, interval: 500, what: 'the queue to drain once the fault is gone' });
      const applied = (await h.applied()).map((x) => x.key).filter((k) => k === a.key || k === b.body.idempotencyKey);
      assert.deepEqual(applied, [a.key, b.body.idempotencyKey], 'A then B, once each');
    }));

  test('FLUSH_QUEUEs during a flush run exactly one more flush, not one each', withDiagnostics(harness, async () => {
    const h = harness();
    const page = await freshStart(h);
    await signIn(page, 'alice');
    await h.setNetwork(false);
    const n = 40;
    for (let i = 0; i < n; i += 1) {
      const r = await bareWrite(page, `/api/projects/p${i % 2}/tasks`, { title: `t${i}` });
      assert.equal(r.status, 202);
    }
    // The worker retries a stopped flush on its own in every engine (r3, contract 4.8):
    // quieted first, so the identity checks counted below are the test's flushes'. While
    // /auth/me answers 401, a flush stops signed out, which arms no retry and disarms the
    // one pending (and its answer ends the offline probe); then every trigger of the
    // worker's own is minutes away (Chromium's sync retry) or absent.
    await h.control('faults', { rules: [{ path: '/api/auth/me', method: 'GET', kind: 'status', status: 401 }] });
    await h.setNetwork(true);
    const quiet = await page.evaluate(() => window.demo.client.flush());
    assert.equal(quiet.ok, true, JSON.stringify(quiet));
    await new Promise((r) => setTimeout(r, 1000)); // a flush already under way meets the 401 too
    await h.control('faults', { rules: [] });
    const before = (await h.requests()).filter((r) => r.path === '/api/auth/me').length;
    const results = await page.evaluate(async () => {
      const c = window.demo.client;
      const first = c.flush();
      const more = [c.flush(), c.flush(), c.flush()];
      return Promise.all([first, ...more]);
    });
    for (const r of results) assert.equal(r.ok, true, JSON.stringify(results));
    if (lacks(engine, 'backgroundSync')) {
      // Without Background Sync the worker's own retry timer, its offline probe and the
      // page helper's retries (contract 2.4, 2.6) also flush, on their own schedule: the
      // first flush may be one of theirs (the test's first FLUSH_QUEUE then shares the
      // rerun), and a timer may add an identity check after the rerun. What holds: each
      // write went once, and no caller is told of more than the queue held.
      assert.ok(results[0].affected <= n, `the first FLUSH_QUEUE ran the flush or joined it: ${JSON.stringify(results)}`);
    } else {
      assert.equal(results[0].affected, n, 'the first flush replays the whole queue');
      const identityChecks = (await h.requests()).filter((r) => r.path === '/api/auth/me').length - before;
      assert.equal(identityChecks, 2, 'one flush plus exactly one coalesced rerun');
    }
    // A FLUSH_QUEUE that joins a flush under way is answered what the rerun delivered plus
    // what the running flush delivered after it asked (docs/PROTOCOL.md, FLUSH_QUEUE): the
    // three, asked in this order, see the same flush from later and later points.
    const joined = results.slice(1).map((r) => r.affected);
    assert.ok(joined.every((a) => a >= 0 && a <= n), `each joined caller counts at most the queue: ${JSON.stringify(results)}`);
    assert.ok(joined[0] >= joined[1] && joined[1] >= joined[2], `a caller that asked later is told no more: ${JSON.stringify(results)}`);
    assert.equal((await h.applied()).length, n, 'each write applied once');
    const keys = new Set((await h.applied()).map((a) => a.key));
    assert.equal(keys.size, n);
  }));
});
