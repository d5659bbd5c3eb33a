// Every engine: the known-offline fast path (docs/PROTOCOL.md section 2.4). Once the
// network failed under a write, later writes are queued without an attempt that can only
// fail, and once a probe sees the network answer again (every offlineProbeMs), writes go through again
// and the queue is replayed: a write made after the network came back waits at most
// about one probe interval.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  apiCall, eventually, forEachEngine, listQueue, openWith, queuedWrite, sentWithKey, storedRecord, withDiagnostics,
} from './outbox-helpers.mjs';

const P = (pid) => `/api/projects/${pid}/tasks`;
const PROBE_MS = 500;

forEachEngine((engine, harness) => {
  test('after a network failure writes are queued without an attempt, and go through again once a probe answers',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await openWith(h, { offlineProbeMs: PROBE_MS });
      await h.setNetwork(false);
      const first = await queuedWrite(page, P('p1'), { title: 'its attempt fails' });
      const second = await queuedWrite(page, P('p2'), { title: 'queued without an attempt' });
      assert.ok((await sentWithKey(h, first.key)).length >= 1, 'the first write was attempted');
      assert.deepEqual(await sentWithKey(h, second.key), [], 'the second never reached the server');
      const stored = await storedRecord(page, second.id);
      assert.equal(stored.firstSentAt, null, 'it never left the worker: no key window applies to it');

      await h.setNetwork(true);
      // Within about one probe interval the worker sees the network again and replays.
      await eventually(async () => (await listQueue(page)).length === 0,
        { timeout: 20000, interval: 100, what: 'the queue to be replayed after a probe' });
      const online = await apiCall(page, 'POST', P('p3'), { title: 'after the network came back' });
      assert.equal(online.status, 201, `sent, not queued: ${JSON.stringify(online)}`);
      assert.deepEqual((await h.applied()).map((a) => JSON.parse(a.body).title).sort(),
        ['after the network came back', 'its attempt fails', 'queued without an attempt'].sort());
    }));
});
