// Every engine: policy under a site's configuration: retention (`expired`, never deleted), the flush
// budget (stops between records, MUTATIONS_PARTIAL, continues next time), and the
// Background Sync registration made when a write is queued.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { lacks } from './engines.mjs';
import {
  clearReports, eventually, flush, forEachEngine, lastSeq, listQueue, queuedWrite, signIn,
  waitForFlushReports, withDiagnostics, writesIn,
} from './outbox-helpers.mjs';


/** Opens the demo with a worker configured by `config` (sw.js?config=…), signed in. */
async function openConfigured(h, config) {
  await h.reset();
  const page = h.browser.pages()[0] ?? await h.browser.newPage();
  // A different script URL is a different worker: unregister the previous one first.
  if ((await page.url()).startsWith(h.baseUrl)) {
    await page.evaluate(async () => {
      for (const r of await navigator.serviceWorker.getRegistrations()) await r.unregister();
      for (const k of await caches.keys()) await caches.delete(k);
      await new Promise((res) => { const d = indexedDB.deleteDatabase('sw-outbox'); d.onsuccess = d.onerror = d.onblocked = res; });
    });
  }
  await h.openDemo({ page, path: `/?swconfig=${encodeURIComponent(JSON.stringify(config))}` });
  await signIn(page, 'alice');
  return page;
}

forEachEngine((engine, harness) => {
  test('a record older than maxRetentionMs needs attention as expired and is never deleted or sent',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await openConfigured(h, { maxRetentionMs: 1 });
      await h.setNetwork(false);
      const w = await queuedWrite(page, '/api/projects/p1/tasks', { title: 'too old' });
      await new Promise((r) => setTimeout(r, 20));
      await h.setNetwork(true);
      const seq = await lastSeq(h); // the first attempt, dropped, is in the log already
      await clearReports(page);
      const r = await flush(page);
      assert.equal(r.ok, true, JSON.stringify(r));
      const { blocked, summary } = await waitForFlushReports(page);
      assert.deepEqual(blocked.blocked.map((b) => [b.id, b.reason]), [[w.id, 'expired']]);
      assert.equal(summary.type, 'MUTATIONS_PARTIAL');
      assert.equal(summary.remaining, 1);
      assert.equal(writesIn(await h.requests(), seq).length, 0, 'an expired record is not sent');
      const [rec] = await listQueue(page);
      assert.equal(rec.state, 'needs-attention');
      assert.equal(rec.attentionReason, 'expired');
      // Retry as new puts it back in the queue with a fresh key and a fresh timestamp.
      const retried = await page.evaluate((id) => window.demo.client.retry(id, 'alice'), w.id);
      assert.equal(retried.ok, true, JSON.stringify(retried));
      const requeued = (await listQueue(page)).find((x) => x.id === w.id);
      assert.ok(requeued, 'still the same record');
      assert.ok(requeued.timestamp > rec.timestamp, 'its retention clock restarted');
    }));

  test('a flush stops between records when its budget is spent and the next flush continues',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await openConfigured(h, { flushBudgetMs: 400 });
      await h.setNetwork(false);
      const writes = [];
      for (let i = 0; i < 4; i += 1) writes.push(await queuedWrite(page, '/api/projects/p1/tasks', { title: `slow ${i}` }));
      await h.setNetwork(true);
      // Each write takes 300 ms to answer: four cannot fit in a 400 ms budget.
      await h.control('faults', { rules: [{ path: '/api/projects/p1/tasks', kind: 'delay', delayMs: 300 }] });
      await clearReports(page);
      const first = await flush(page);
      assert.equal(first.ok, true, JSON.stringify(first));
      const { summary } = await waitForFlushReports(page);
      assert.equal(summary.type, 'MUTATIONS_PARTIAL', JSON.stringify(summary));
      assert.ok(summary.replayed < 4, `the budget stopped the flush: ${JSON.stringify(summary)}`);
      assert.equal(summary.stoppedBy, 'budget', `the stop is reported (r3): ${JSON.stringify(summary)}`);
      assert.equal(typeof summary.retryAt, 'number', 'and continued by the worker soon');
      assert.equal(summary.remaining, 4 - summary.replayed);
      assert.equal(first.affected, summary.replayed);
      // Nothing half-settled: what was applied is exactly what left the queue.
      assert.equal((await h.applied()).length, summary.replayed);
      assert.equal((await listQueue(page)).length, 4 - summary.replayed);
      // Later flushes continue where it stopped, in order, each applied once.
      await eventually(async () => {
        await flush(page);
        return (await listQueue(page)).length === 0;
      }, { timeout: 30000, what: 'the queue to drain over later flushes' });
      const applied = await h.applied();
      assert.deepEqual(applied.map((a) => a.key), writes.map((w) => w.key), 'each once, in issue order');
    }));

  test('queuing a write registers a Background Sync with the configured tag (Chromium)',
    { skip: lacks(engine, 'backgroundSync') }, withDiagnostics(harness, async () => {
      const h = harness();
      const page = await openConfigured(h, { syncTag: 'outbox-e2e' });
      await h.setNetwork(false);
      await queuedWrite(page, '/api/notes', { text: 'sync me' });
      // The registration follows the 202 (the answer waits only for the commit).
      const readTags = () => page.evaluate(async () => {
        const reg = await navigator.serviceWorker.ready;
        return reg.sync ? reg.sync.getTags() : null;
      });
      assert.ok(Array.isArray(await readTags()), 'Chromium has the Background Sync API');
      const tags = await eventually(async () => {
        const t = await readTags();
        return t.includes('outbox-e2e') ? t : null;
      }, { timeout: 5000, interval: 50, what: 'the sync tag to be registered' });
      assert.ok(tags.includes('outbox-e2e'), `registered tags: ${JSON.stringify(tags)}`);
      await h.setNetwork(true);
    }));
});
