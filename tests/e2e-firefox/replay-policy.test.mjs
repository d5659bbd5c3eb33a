// Firefox: the replay policy (contract sections 4 and 5) — a record replays only under
// the account that queued it, and in FIFO order within its workspace, a failed record
// holding back the later ones of its workspace and no other.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import {
  clearReports, flush, freshStart, lastSeq, listQueue, queuedWrite, signIn, signOut,
  startHarness, waitForFlushReports, withDiagnostics, writesIn,
} from './harness.mjs';

let h;
before(async () => { h = await startHarness(); });
after(async () => { await h?.close(); });

const P = (pid) => `/api/projects/${pid}/tasks`;

test('another account\'s record is blocked owner-mismatch and not sent; it replays once under its owner', withDiagnostics(() => h, async () => {
  await freshStart(h);
  await signIn(h, 'alice');
  await h.setNetwork(false);
  const a = await queuedWrite(h, P('p1'), { title: 'alice, offline' });
  await signOut(h); // offline: the server is not told, the worker is

  await h.setNetwork(true);
  const beforeBob = await lastSeq(h);
  await clearReports(h);
  await signIn(h, 'bob');
  const bobs = await waitForFlushReports(h);
  assert.deepEqual(bobs.blocked?.blocked.map((x) => [x.id, x.reason, x.ownerId]), [[a.id, 'owner-mismatch', 'alice']],
    `bob's flush reports alice's record blocked: ${JSON.stringify(bobs.all)}`);
  assert.deepEqual(bobs.summary, { type: 'MUTATIONS_PARTIAL', replayed: 0, remaining: 1 });
  assert.deepEqual(writesIn(await h.requests(), beforeBob), [], 'bob\'s flush sent none of alice\'s records');
  assert.deepEqual((await listQueue(h)).map((q) => [q.id, q.ownerId, q.state]), [[a.id, 'alice', 'queued']],
    'still queued, still alice\'s');

  const explicit = await flush(h);
  assert.equal(explicit.ok, true, JSON.stringify(explicit));
  assert.equal(explicit.affected, 0, 'an explicit flush as bob replays nothing');
  assert.deepEqual(await h.applied(), []);

  await signOut(h);
  await clearReports(h);
  await signIn(h, 'alice');
  const alices = await waitForFlushReports(h);
  assert.deepEqual(alices.blocked?.blocked, []);
  assert.deepEqual(alices.summary, { type: 'MUTATIONS_REPLAYED', count: 1 });
  const applied = await h.applied();
  assert.deepEqual(applied.map((x) => [x.user, x.key, x.path]), [['alice', a.key, P('p1')]], JSON.stringify(applied));
  assert.deepEqual(await listQueue(h), []);
}));

test('a rejected record blocks the later records of its workspace (workspace-order), not other workspaces', withDiagnostics(() => h, async () => {
  await freshStart(h);
  await signIn(h, 'alice');
  await h.setNetwork(false);
  const x = await queuedWrite(h, P('p1'), { title: 'p1 first (rejected)' });
  const y = await queuedWrite(h, P('p2'), { title: 'p2 first' });
  const z = await queuedWrite(h, P('p1'), { title: 'p1 second' });
  const w = await queuedWrite(h, P('p2'), { title: 'p2 second' });
  await h.setNetwork(true);
  await h.control('faults', { rules: [{ path: P('p1'), method: 'POST', kind: 'status', status: 400, times: 1 }] });

  const since = await lastSeq(h);
  await clearReports(h);
  const r = await flush(h);
  assert.equal(r.ok, true, JSON.stringify(r));
  assert.equal(r.affected, 2, 'the two p2 records were replayed');
  const { blocked, summary } = await waitForFlushReports(h);

  const applied = await h.applied();
  assert.deepEqual(applied.map((a) => a.key), [y.key, w.key], `only p2 applied, in order: ${JSON.stringify(applied)}`);
  const sent = writesIn(await h.requests(), since);
  assert.deepEqual(sent.filter((s) => s.path === P('p1')).map((s) => [s.key, s.status]), [[x.key, 400]],
    'the first p1 record was sent once (400), the later one never');
  assert.deepEqual(blocked?.blocked.map((b) => [b.id, b.reason, b.workspace]),
    [[x.id, 'rejected', 'p1'], [z.id, 'workspace-order', 'p1']]);
  assert.deepEqual(summary, { type: 'MUTATIONS_PARTIAL', replayed: 2, remaining: 2 });
  assert.deepEqual((await listQueue(h)).map((q) => [q.id, q.state, q.attentionReason ?? null, q.lastStatus ?? null]),
    [[x.id, 'needs-attention', 'rejected', 400], [z.id, 'queued', null, null]]);

  // Discarding the rejected record frees its workspace: the later one goes, once.
  const d = await h.evaluate((id) => window.demo.client.discard(id, 'alice'), x.id);
  assert.equal(d.ok, true, JSON.stringify(d));
  const after = await flush(h);
  assert.equal(after.ok, true, JSON.stringify(after));
  const final = await h.applied();
  assert.deepEqual(final.map((a) => a.key), [y.key, w.key, z.key], JSON.stringify(final));
  assert.deepEqual(await listQueue(h), []);
}));
