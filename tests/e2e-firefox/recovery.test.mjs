// Firefox: recovery commands (contract section 6) — REBIND_RECORDS adopts a record queued
// while signed out, only after the server confirms the account; RECOVER_RECORD retries a
// needs-attention record under a new key or discards it.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import {
  clearReports, eventually, flush, freshStart, lastSeq, listQueue, queuedWrite, signIn,
  startHarness, waitForFlushReports, withDiagnostics, writesIn,
} from './harness.mjs';

let h;
before(async () => { h = await startHarness(); });
after(async () => { await h?.close(); });

const P = (pid) => `/api/projects/${pid}/tasks`;

test('a record queued while signed out is blocked unknown-owner, then adopted and applied once under alice', withDiagnostics(() => h, async () => {
  await freshStart(h);
  await h.setNetwork(false);
  const q = await queuedWrite(h, P('p1'), { title: 'written while signed out' });
  assert.deepEqual((await listQueue(h)).map((r) => [r.id, r.ownerId]), [[q.id, null]], 'queued with no owner');

  await h.setNetwork(true);
  const queuedAt = await lastSeq(h);
  await clearReports(h);
  await signIn(h, 'alice'); // its flush reports the record, sends nothing
  const { blocked } = await waitForFlushReports(h);
  assert.deepEqual(blocked?.blocked.map((b) => [b.id, b.reason]), [[q.id, 'unknown-owner']]);
  assert.deepEqual(await h.applied(), []);

  // The identity check: adopting for an account that is not the signed-in one is refused.
  const asBob = await h.evaluate(() => window.demo.client.adopt('bob'));
  assert.equal(asBob.command, 'REBIND_RECORDS');
  assert.equal(asBob.ok, false, `REBIND for bob while alice is signed in: ${JSON.stringify(asBob)}`);
  assert.equal(typeof asBob.reason, 'string');
  const meChecks = (await h.requests()).filter((r) => r.seq > queuedAt && r.method === 'GET' && r.path === '/api/auth/me' && r.expectedAccount === 'bob');
  assert.deepEqual(meChecks.map((r) => [r.user, r.status]), [['alice', 409]],
    'the refusal rests on a fresh /api/auth/me naming bob, which the server answered 409');
  assert.deepEqual((await listQueue(h)).map((r) => [r.id, r.ownerId]), [[q.id, null]], 'nothing changed');

  const adopted = await h.evaluate(() => window.demo.client.adopt('alice'));
  assert.equal(adopted.ok, true, JSON.stringify(adopted));
  assert.equal(adopted.affected, 1);
  const applied = await eventually(async () => { const a = await h.applied(); return a.length ? a : null; },
    { what: 'the adopted record to be applied' });
  assert.deepEqual(applied.map((a) => [a.user, a.key, a.path]), [['alice', q.key, P('p1')]], 'applied with the key its 202 named');
  await eventually(async () => (await listQueue(h)).length === 0, { what: 'the queue to be empty' });
  const sent = writesIn(await h.requests(), queuedAt).filter((r) => r.key === q.key);
  assert.deepEqual(sent.map((r) => [r.expectedAccount, r.status]), [['alice', 201]], 'replayed once, as alice');
}));

test('needs-attention records: retry-new applies under a new key, discard removes without sending', withDiagnostics(() => h, async () => {
  await freshStart(h);
  await signIn(h, 'alice');
  await h.setNetwork(false);
  const x = await queuedWrite(h, P('p1'), { title: 'retry me' });
  const y = await queuedWrite(h, P('p2'), { title: 'discard me' });
  await h.setNetwork(true);
  await h.control('faults', {
    rules: [
      { path: P('p1'), kind: 'outcome-unknown', times: 1 },
      { path: P('p2'), kind: 'outcome-unknown', times: 1 },
    ],
  });
  await clearReports(h);
  const r = await flush(h);
  assert.equal(r.ok, true, JSON.stringify(r));
  assert.equal(r.affected, 0);
  const { blocked } = await waitForFlushReports(h);
  assert.deepEqual(blocked?.blocked.map((b) => [b.id, b.reason]).sort((p, q) => p[0] - q[0]),
    [[x.id, 'outcome-unknown'], [y.id, 'outcome-unknown']]);
  assert.deepEqual((await listQueue(h)).map((q) => [q.id, q.state, q.attentionReason]),
    [[x.id, 'needs-attention', 'outcome-unknown'], [y.id, 'needs-attention', 'outcome-unknown']]);
  assert.deepEqual(await h.applied(), []);

  // Only a needs-attention record of the signed-in owner can be recovered.
  const asBob = await h.evaluate((id) => window.demo.client.retry(id, 'bob'), x.id);
  assert.equal(asBob.ok, false, `retry as bob: ${JSON.stringify(asBob)}`);
  const gone = await h.evaluate(() => window.demo.client.discard(999999, 'alice'));
  assert.equal(gone.ok, false, `discard of a record that does not exist: ${JSON.stringify(gone)}`);

  const since = await lastSeq(h);
  const retried = await h.evaluate((id) => window.demo.client.retry(id, 'alice'), x.id);
  assert.deepEqual([retried.command, retried.ok, retried.affected], ['RECOVER_RECORD', true, 1], JSON.stringify(retried));
  const applied = await eventually(async () => { const a = await h.applied(); return a.length ? a : null; },
    { what: 'the retried record to be applied' });
  assert.equal(applied.length, 1, JSON.stringify(applied));
  assert.equal(applied[0].user, 'alice');
  assert.equal(applied[0].path, P('p1'));
  assert.match(applied[0].key ?? '', /^[A-Za-z0-9_-]{22,64}$/);
  assert.notEqual(applied[0].key, x.key, 'retried under a NEW idempotency key');
  assert.deepEqual(JSON.parse(applied[0].body), { title: 'retry me' });
  assert.ok(!writesIn(await h.requests(), since).some((s) => s.key === x.key), 'the old key is not sent again');

  const discarded = await h.evaluate((id) => window.demo.client.discard(id, 'alice'), y.id);
  assert.deepEqual([discarded.command, discarded.ok, discarded.affected], ['RECOVER_RECORD', true, 1], JSON.stringify(discarded));
  await flush(h);
  assert.deepEqual(await listQueue(h), [], 'both records are gone from the queue');
  assert.equal((await h.applied()).length, 1, 'the discarded record was never applied');
  assert.ok(!writesIn(await h.requests(), since).some((s) => s.path === P('p2')), 'the discarded record was not sent');
}));
