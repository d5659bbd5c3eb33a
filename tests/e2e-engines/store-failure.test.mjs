// The worker's database fails under a flush. A real failure, not a mock: another
// connection asks for a newer version of the database while a replay is on the wire (as
// a later release's worker does when it installs with a new schema), so the worker
// closes its connection (it lets a newer version's upgrade go ahead) and every
// transaction it starts afterwards fails.
//
// Checked, in each engine: the replay on the wire is applied once by the server; the
// outcome the worker could not store stops the flush, so nothing later in the lane is
// sent (the group commit's rule: nothing is sent after a record whose new state was not
// stored); every record is still in the database; a write made afterwards, which cannot
// be stored, is never answered as queued; and the worker answers commands all along.
// The origin is left pristine for whatever runs next. (With the connection closed every
// later transaction fails on its own, so this shows the guarantee end to end, not the
// group commit's own rule that a failed step fails every later one of the flush.)
import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  forEachEngine, lastSeq, openWith, pristine, queuedWrite, readMutations, send, withDiagnostics, writesIn,
} from './outbox-helpers.mjs';

const TASKS = '/api/projects/p1/tasks';

forEachEngine((engine, harness) => {
  test('a database that closes under a flush stops it after the record on the wire, loses nothing and claims no write queued',
    withDiagnostics(harness, async (t) => {
      const h = harness();
      const page = await openWith(h, {});
      await h.setNetwork(false);
      const writes = [];
      for (const title of ['a', 'b', 'c']) writes.push(await queuedWrite(page, TASKS, { title }));
      const [a, b, c] = writes;

      // The server holds a's replay 3 s; 0.5 s into it the page asks for the next version.
      await h.control('faults', { rules: [{ path: TASKS, method: 'POST', kind: 'delay', delayMs: 3000, times: 1 }] });
      const since = await lastSeq(h);
      await h.setNetwork(true);
      // All in one script: a WebDriver session runs one at a time.
      const { flushed, upgraded } = await page.evaluate(async (key) => {
        const flushing = window.demo.client.flush();
        for (let i = 0; i < 100; i += 1) {
          const { requests } = await (await fetch('/__control/requests', { cache: 'no-store' })).json();
          if (requests.some((r) => r.key === key)) break;
          await new Promise((r) => setTimeout(r, 50));
        }
        await new Promise((r) => setTimeout(r, 500));
        const upgradedTo = await new Promise((resolve, reject) => {
          const probe = indexedDB.open('sw-outbox');
          probe.onerror = () => reject(probe.error);
          probe.onsuccess = () => {
            const next = probe.result.version + 1;
            probe.result.close();
            const open = indexedDB.open('sw-outbox', next);
            open.onerror = () => reject(open.error);
            open.onsuccess = () => { open.result.close(); resolve(next); };
          };
        });
        return { flushed: await flushing, upgraded: upgradedTo };
      }, a.key);
      assert.equal(flushed.type, 'COMMAND_RESULT', `the worker answered the flush: ${JSON.stringify(flushed)}`);
      assert.ok(upgraded > 1, 'the database went to a newer version while a was on the wire');

      const sent = writesIn(await h.requests(), since).map((r) => [r.key, r.status]);
      assert.deepEqual(sent, [[a.key, 201]], `a was applied; nothing after it was sent: ${JSON.stringify(sent)}`);
      assert.deepEqual((await h.applied()).map((x) => x.key), [a.key]);

      // Every record is still there (a included: its delete was never stored, so a later
      // worker replays it with its key and gets the stored answer).
      const kept = await readMutations(page, 'getAllKeys');
      assert.deepEqual(kept, [a.id, b.id, c.id], 'nothing lost');

      // A write now cannot be stored: it is never answered 202.
      await h.setNetwork(false);
      const late = await page.evaluate((path) => window.demo.api('POST', path, { title: 'd' }), TASKS);
      assert.notEqual(late.status, 202, `a write that could not be stored is not claimed queued: ${JSON.stringify(late)}`);
      assert.notEqual(late.body?.queued, true, JSON.stringify(late));
      const listed = await send(page, { type: 'LIST_QUEUE' });
      assert.equal(listed.type, 'COMMAND_RESULT', `the worker still answers: ${JSON.stringify(listed)}`);
      assert.equal(listed.ok, false, `its store is gone, and it says so: ${JSON.stringify(listed)}`);
      t.diagnostic(`flush: ${JSON.stringify(flushed)}; late write: ${late.status} ${JSON.stringify(late.body)}; LIST_QUEUE: ${JSON.stringify(listed)}`);

      await h.setNetwork(true);
      await pristine(h);
    }));
});
