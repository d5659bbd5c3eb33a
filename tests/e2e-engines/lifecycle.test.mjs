// Every engine: real lifecycles (contract 2.8, 4.7, 6 and 8, r2): the page's abort is honoured, a clear
// fences the writes still on their first attempt, a hostile message costs the worker
// nothing, and a server that stalls an answer's body cannot hold the queue.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { lacks } from './engines.mjs';
import {
  apiCall, eventually, flush, forEachEngine, listQueue, openWith, queuedWrite, sentWithKey, signIn, withDiagnostics,
} from './outbox-helpers.mjs';


const P = (pid) => `/api/projects/${pid}/tasks`;

/** Sends a command through the page helper with a short answer timeout. */
const send = (page, message, timeoutMs = 15000) => page.evaluate(
  ([m, t]) => window.demo.client.send(m, { timeoutMs: t }).catch((e) => ({ error: e.message })), [message, timeoutMs]);

forEachEngine((engine, harness) => {
  // First in the file: in Firefox and WebKit a worker of an earlier test (unregistered,
  // default attemptTimeoutMs 15 s) was seen still flushing this origin's queue, which it
  // shares with the new version under one flush lock: this test's FLUSH_QUEUE then waited
  // behind that worker's own 15 s attempt at the stalled answer (19 s in all, seen).
  test('a server that sends headers and stalls the body holds neither a flush nor the queue',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await openWith(h, { attemptTimeoutMs: 2000 });
      await h.setNetwork(false);
      const w = await queuedWrite(page, P('p1'), { title: 'replayed past two stalled answers' });
      await h.control('faults', { rules: [{ path: '/api/auth/me', method: 'GET', kind: 'stall-body', status: 200, body: '{"user":' }] });
      await h.setNetwork(true);
      const stalledMe = await send(page, { type: 'FLUSH_QUEUE' });
      assert.equal(stalledMe.ok, false, `the identity check gave up: ${JSON.stringify(stalledMe)}`);
      const listed = await send(page, { type: 'LIST_QUEUE' });
      assert.equal(listed.type, 'QUEUE_STATE', JSON.stringify(listed));
      assert.equal(listed.records.length, 1, 'nothing was sent without an identity');

      await h.control('faults', { rules: [{ path: P('p1'), method: 'POST', kind: 'stall-body', status: 409, body: '{"detail":' }] });
      const stalledReplay = await send(page, { type: 'FLUSH_QUEUE' });
      assert.equal(stalledReplay.type, 'COMMAND_RESULT', `the flush came back: ${JSON.stringify(stalledReplay)}`);
      const rec = (await listQueue(page)).find((r) => r.id === w.id);
      assert.equal(rec?.state, 'queued', `a cut-off 409 leaves it queued: ${JSON.stringify(rec)}`);
      await h.control('faults', { rules: [] });
      await eventually(async () => (await listQueue(page)).length === 0 || ((await flush(page)) && false),
        { timeout: 20000, what: 'the record to be delivered' });
      assert.deepEqual((await h.applied()).map((x) => x.key), [w.key], 'applied once');
    }));

  test('a write the page aborts before it is stored is never queued, and saving again applies it once',
    withDiagnostics(harness, async (t) => {
      const h = harness();
      const timeout = 3000;
      const page = await openWith(h, { attemptTimeoutMs: timeout });
      await h.control('faults', { rules: [{ path: '/api/projects/*/tasks', method: 'POST', kind: 'hang' }] });
      const first = await page.evaluate(async (path) => {
        try {
          await window.demo.client.fetch(path, {
            method: 'POST',
            headers: { 'Content-Type': 'application/json', 'X-CSRF-Token': window.demo.state.csrf, 'Idempotency-Key': 'abort-me-1' },
            body: JSON.stringify({ title: 'given up on' }),
            signal: AbortSignal.timeout(800),
          });
          return 'resolved';
        } catch (e) {
          return e.name;
        }
      }, P('p1'));
      assert.equal(first, 'TimeoutError', 'the page saw its own abort');
      // Past the worker's own attempt timeout: an ignored abort would have queued it by now.
      await new Promise((r) => setTimeout(r, timeout + 1000));
      assert.deepEqual(await listQueue(page), [], 'nothing was queued');
      assert.ok((await sentWithKey(h, 'abort-me-1')).length >= 1, 'the first attempt had gone out');

      // The same without the helper (in another workspace, so it holds nothing back):
      // whether the browser forwards the page's signal to the worker decides (Chromium 156
      // does not, so the worker's own timeout queues it).
      const plain = await page.evaluate(async (path) => {
        try {
          await fetch(path, {
            method: 'POST',
            headers: { 'Content-Type': 'application/json', 'X-CSRF-Token': window.demo.state.csrf, 'Idempotency-Key': 'abort-me-2' },
            body: JSON.stringify({ title: 'plain fetch, aborted' }),
            signal: AbortSignal.timeout(800),
          });
          return 'resolved';
        } catch (e) {
          return e.name;
        }
      }, P('p2'));
      // WebKit's fetch rejects with an AbortError whatever the signal's reason (seen here);
      // Chromium and Firefox reject with the reason, the timeout's TimeoutError.
      assert.equal(plain, engine === 'webkit' ? 'AbortError' : 'TimeoutError', 'the page saw its own abort');
      await new Promise((r) => setTimeout(r, timeout + 1000));
      const forwarded = (await listQueue(page)).length === 0;
      t.diagnostic(`this browser ${forwarded ? 'forwards' : 'does not forward'} the page's AbortSignal to the worker`);

      await h.control('faults', { rules: [] });
      const again = await apiCall(page, 'POST', P('p1'), { title: 'saved again' });
      assert.equal(again.status, 201, JSON.stringify(again));
      const p1 = (await h.applied()).filter((x) => x.path === P('p1')).map((x) => JSON.parse(x.body).title);
      assert.deepEqual(p1, ['saved again'], 'applied once: the aborted write never was');
    }));

  test('CLEAR_DEVICE during a first attempt: the write is not stored afterwards, under anyone',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await openWith(h, { attemptTimeoutMs: 3000 });
      await h.control('faults', { rules: [{ path: P('p1'), method: 'POST', kind: 'hang' }] });
      await page.evaluate((path) => {
        window.__inFlight = window.demo.api('POST', path, { title: 'on its first attempt during the clear' });
      }, P('p1'));
      await eventually(async () => (await h.requests()).some((r) => r.path === P('p1') && r.status === null),
        { what: 'the first attempt to reach the server' });
      // Alice signs out and clears the shared device while her write hangs.
      const cleared = await page.evaluate(async () => {
        await window.demo.api('POST', '/api/auth/logout');
        await window.demo.client.authSession(null);
        return window.demo.client.clearDevice();
      });
      assert.equal(cleared.ok, true, JSON.stringify(cleared));
      const answer = await page.evaluate(() => window.__inFlight);
      assert.equal(answer.status, 503, `never claimed queued: ${JSON.stringify(answer)}`);
      assert.equal(answer.body.queued, false);
      assert.match(answer.body.error, /cleared/);
      await h.control('faults', { rules: [] });
      await page.reload();
      await page.waitForFunction(() => Boolean(window.demo?.client && navigator.serviceWorker.controller));
      await signIn(page, 'bob');
      assert.deepEqual(await listQueue(page), [], 'bob finds nothing of alice\'s on the device');
      assert.deepEqual(await h.applied(), []);
    }));

  test('a message of shared references is answered at once and the worker goes on serving',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await openWith(h, {});
      const answer = await page.evaluate(() => {
        let x = {};
        for (let i = 0; i < 40; i += 1) x = { a: x, b: x };
        return window.demo.client.send({ type: 'LIST_QUEUE', x }, { timeoutMs: 10000 })
          .catch((e) => ({ error: e.message }));
      });
      assert.equal(answer.type, 'QUEUE_STATE', `answered: ${JSON.stringify(answer)}`);
      const bad = await page.evaluate(() => {
        let x = {};
        for (let i = 0; i < 40; i += 1) x = { a: x, b: x };
        return window.demo.client.send({ type: 'RECOVER_RECORD', id: x, ownerId: 'alice', action: 'discard' }, { timeoutMs: 10000 })
          .catch((e) => ({ error: e.message }));
      });
      assert.equal(bad.ok, false, JSON.stringify(bad));
      assert.match(bad.reason, /\bid\b/);
      await h.setNetwork(false);
      const w = await queuedWrite(page, P('p1'), { title: 'after the hostile message' });
      assert.deepEqual((await listQueue(page)).map((r) => r.id), [w.id]);
      await h.setNetwork(true);
      // Delivered, so a later test never meets this write.
      await eventually(async () => (await listQueue(page)).length === 0 || ((await flush(page)) && false),
        { timeout: 20000, what: 'the write to be delivered' });
      assert.deepEqual((await h.applied()).map((x) => x.key), [w.key], 'applied once');
    }));

  /** Puts a personalised copy of `/` into the shell cache, as a page of alice's could. */
  const plant = (page) => page.evaluate(async () => {
    const name = (await caches.keys()).find((k) => k.startsWith('sw-outbox-'));
    const cache = await caches.open(name);
    await cache.put(new URL('/', location.href).href,
      new Response('<p>alice-private-shell</p>', { headers: { 'Content-Type': 'text/html' } }));
    return name;
  });
  /** The shell cache's copy of `/`, or null. */
  const shellText = (page) => page.evaluate(async () => {
    const name = (await caches.keys()).find((k) => k.startsWith('sw-outbox-'));
    const hit = await (await caches.open(name)).match(new URL('/', location.href).href);
    return hit ? hit.text() : null;
  });

  test('CLEAR_DEVICE refetches the app shell, so nothing cached under the previous account survives',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await openWith(h, {});
      await plant(page);
      assert.equal(await shellText(page), '<p>alice-private-shell</p>', 'a personalised copy is in the shell cache');
      const r = await page.evaluate(() => window.demo.client.clearDevice());
      assert.equal(r.ok, true, JSON.stringify(r));
      const fresh = await shellText(page);
      assert.ok(fresh && !fresh.includes('alice-private-shell') && fresh.includes('login-form'),
        `refetched from the server: ${String(fresh).slice(0, 80)}`);
    }));

  // Offline, the copy cannot be refetched: it is deleted, and the worker's next start
  // puts the shell back. (The server's network switch drops /api/ only: the shell's
  // refetch needs the browser itself offline.)
  // Firefox's offline mode answered a `cache: 'reload'` refetch from its HTTP cache (the
  // copy was replaced, not deleted); the worker refetches with `cache: 'no-store'`
  // (src/worker/shell.rs), which fails offline in every engine.
  test('CLEAR_DEVICE offline deletes the shell copy it cannot refetch, and the next worker start puts the shell back',
    { skip: lacks(engine, 'setOffline', 'stopWorkers') }, withDiagnostics(harness, async () => {
      const h = harness();
      const page = await openWith(h, {});
      await plant(page);
      assert.equal(await shellText(page), '<p>alice-private-shell</p>', 'a personalised copy is in the shell cache');
      await h.setOffline(true);
      try {
        const offline = await page.evaluate(() => window.demo.client.clearDevice());
        assert.equal(offline.ok, true, JSON.stringify(offline));
        assert.equal(await shellText(page), null, 'deleted rather than kept');
      } finally {
        await h.setOffline(false);
      }
      await h.stopWorkers();
      await page.reload();
      await page.waitForFunction(() => Boolean(window.demo?.client && navigator.serviceWorker.controller));
      const restored = await eventually(async () => { const t = await shellText(page); return t && t.includes('login-form') ? t : null; },
        { what: 'the shell to be put back at the next start' });
      assert.ok(!restored.includes('alice-private-shell'));
    }));
});
