// Every engine: a write made while an earlier write of its lane is still unresolved is
// queued behind it, unsent, instead of overtaking it (docs/PROTOCOL.md section 2,
// `core::lanes`): the stale edit queued offline is never applied after the newer one
// made online.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  apiCall, eventually, flush, forEachEngine, freshStart, lastSeq, listQueue, queuedWrite, signIn,
  reconnectAs, signOutThroughUi, withDiagnostics, writesIn,
} from './outbox-helpers.mjs';

const P = (pid) => `/api/projects/${pid}/tasks`;

forEachEngine((engine, harness) => {
  test('online writes queue behind an unresolved write of their lane, others go through, and all apply in issue order', withDiagnostics(harness, async () => {
    const h = harness();
    const page = await freshStart(h);
    await signIn(page, 'alice');

    // A is queued offline; while the server is back, any replay of p1 answers 503 with a
    // short Retry-After, so A stays queued and the test decides when the lane may move.
    await h.setNetwork(false);
    const a = await queuedWrite(page, P('p1'), { title: 'A: written offline' });
    await h.control('faults', { rules: [{ path: P('p1'), method: 'POST', kind: 'status', status: 503, retryAfter: '1' }] });
    await h.setNetwork(true);
    const since = await lastSeq(h);

    // B (same lane) would get the fault's 503 if it were sent; it is queued behind A.
    const b = await apiCall(page, 'POST', P('p1'), { title: 'B: written online after A' });
    assert.equal(b.status, 202, `B is queued behind A, not sent: ${JSON.stringify(b)}`);
    assert.equal(b.body.queued, true);
    // An account-level write is a barrier: it stays behind A too.
    const n = await apiCall(page, 'POST', '/api/notes', { text: 'N: a note after A' });
    assert.equal(n.status, 202, `the note is queued behind A: ${JSON.stringify(n)}`);
    // Another workspace of the same account is independent of p1... but not of the queued
    // note, which is a barrier for every workspace.
    const c = await apiCall(page, 'POST', P('p2'), { title: 'C: p2, after the note' });
    assert.equal(c.status, 202, `C follows the queued note: ${JSON.stringify(c)}`);

    const sentB = writesIn(await h.requests(), since).filter((r) => r.key === b.body.idempotencyKey);
    assert.deepEqual(sentB, [], 'B was not sent while A was unresolved');
    assert.deepEqual((await listQueue(page)).map((q) => q.id), [a.id, b.body.id, n.body.id, c.body.id],
      'queued in issue order');

    // The lane moves: everything applies once, in issue order.
    await h.control('faults', { rules: [] });
    await eventually(async () => {
      const r = await flush(page);
      return r.ok && (await listQueue(page)).length === 0;
    }, { timeout: 20000, interval: 500, what: 'the queue to drain once the fault is gone' });
    const applied = (await h.applied()).map((x) => x.key);
    assert.deepEqual(applied, [a.key, b.body.idempotencyKey, n.body.idempotencyKey, c.body.idempotencyKey],
      'applied once each, in issue order');

    // With nothing ahead, the next write goes straight through again.
    const d = await apiCall(page, 'POST', P('p1'), { title: 'D: nothing ahead' });
    assert.equal(d.status, 201, `D is sent: ${JSON.stringify(d)}`);
  }));

  test('another account\'s queued write holds nothing back', withDiagnostics(harness, async () => {
    const h = harness();
    const page = await freshStart(h);
    await signIn(page, 'alice');
    await h.setNetwork(false);
    const a = await queuedWrite(page, P('p1'), { title: 'alice, offline' });
    // Signed out while still offline: the worker's own retries (contract 4.8) would
    // otherwise deliver alice's record, as alice, as soon as the server answers again.
    await signOutThroughUi(page);
    await reconnectAs(h, page, 'bob');
    await signIn(page, 'bob');
    const b = await apiCall(page, 'POST', P('p1'), { title: 'bob, online' });
    assert.equal(b.status, 201, `bob's write goes through: ${JSON.stringify(b)}`);
    const q = await listQueue(page);
    assert.deepEqual(q.map((r) => [r.id, r.ownerId]), [[a.id, 'alice']], 'alice\'s record waits for alice');
  }));
});
