// Background Sync and the worker's wake-ups (Chromium, the engine with Background Sync):
// a sync event costs a worker start when the worker is stopped, so none is caused for
// nothing. Its own file, so its browser has no sync of an earlier test pending.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { lacks } from './engines.mjs';
import { signInThroughUi } from './harness.mjs';
import { eventually, forEachEngine, freshStart, queuedWrite, withDiagnostics } from './outbox-helpers.mjs';

forEachEngine((engine, harness) => {
  test('writes queued while a sync event fails do not make the browser fire it again at once', { skip: lacks(engine, 'watchBackgroundSync') },
    withDiagnostics(harness, async () => {
      // The browser thinks it is online while the server is down: the first queued write's
      // sync fires at once, fails, and stays open for the worker's own retry. A sync
      // registered while one fires is fired again as soon as that one ends, waking the
      // worker (a stopped one too) for nothing: by then the retry delivered the queue (or
      // met the same network, and the failed event's rejection has the browser retry it).
      const h = harness();
      const page = await freshStart(h);
      await signInThroughUi(page, 'alice');
      await page.waitForFunction(() => window.demo.sessionSynced === true);
      // This file's browser is its own: no sync of an earlier test waits out a backoff
      // (a registration pending already is not fired again by registering it).
      const pending = await page.evaluate(async () => (await navigator.serviceWorker.ready).sync.getTags());
      assert.deepEqual(pending, [], 'no sync pending before the test');
      const sync = await h.browser.watchBackgroundSync();
      try {
        await h.setNetwork(false);
        const first = await queuedWrite(page, '/api/projects/p1/tasks', { title: 'first' });
        const dispatched = () => sync.events.filter((e) => e.name === 'Dispatched sync event');
        const ended = () => sync.events.filter((e) => /^(Sync completed|sync event failed)$/.test(e.name));
        await eventually(async () => dispatched().length >= 1, { what: 'the first write\'s sync to fire' });
        const more = [];
        for (let i = 0; i < 3; i += 1) more.push(await queuedWrite(page, '/api/projects/p1/tasks', { title: `while it fires ${i}` }));
        assert.equal(ended().length, 0, `the writes were queued while the sync fired: ${JSON.stringify(sync.events)}`);
        for (const w of more) assert.equal(w.background, true, 'a sync will still deliver it');
        // The network comes back: the worker's own retry delivers the four, once each, and
        // the sync event it kept open ends.
        await h.setNetwork(true);
        const applied = await eventually(async () => { const a = await h.applied(); return a.length >= 4 ? a : null; }, { what: 'the replay', timeout: 30000 });
        assert.deepEqual(applied.map((a) => a.key), [first, ...more].map((w) => w.key));
        await eventually(async () => ended().length + dispatched().length >= 2, { what: `the sync event to end: ${JSON.stringify(sync.events)}`, timeout: 30000 });
        await new Promise((r) => setTimeout(r, 1500));
        assert.equal(dispatched().length, 1, `one sync event, not one more at its end: ${JSON.stringify(sync.events)}`);
        // Nor one minutes later: the queue it was fired for was delivered while it was open.
        assert.deepEqual(ended().map((e) => e.name), ['Sync completed'], `the event succeeded (no retry scheduled): ${JSON.stringify(sync.events)}`);
      } finally {
        await sync.stop();
      }
    }));
});
