// Firefox: a write made while the server is unreachable is queued (202 with its key) and
// replayed exactly once under its account; and, since Firefox has no Background Sync and
// the browser never sees the network go down here (so no `online` event reaches the
// worker), the fallback triggers of the page helper drain the queue on their own: a
// signed-in page load (AUTH_SESSION + FLUSH_QUEUE) and the window's `online` event.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import {
  clearReports, eventually, flush, freshStart, lastSeq, listQueue, messages, queuedWrite,
  signIn, startHarness, waitForFlushReports, withDiagnostics, writesIn,
} from './harness.mjs';

let h;
before(async () => { h = await startHarness(); });
after(async () => { await h?.close(); });

const P1 = '/api/projects/p1/tasks';
const P2 = '/api/projects/p2/tasks';

test('an offline write answers 202, is listed, and one FLUSH_QUEUE applies it exactly once', withDiagnostics(() => h, async () => {
  await freshStart(h);
  await signIn(h, 'alice');
  await h.setNetwork(false);
  await clearReports(h);

  const r = await h.evaluate((path) => fetch(path, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'X-CSRF-Token': window.demo.state.csrf, 'X-PM-Expected-Account': 'alice' },
    body: JSON.stringify({ title: 'Written in Firefox, offline' }),
  }).then(async (res) => ({ status: res.status, type: res.headers.get('content-type'), body: await res.json() })), P1);
  assert.equal(r.status, 202, JSON.stringify(r));
  assert.match(r.type ?? '', /application\/json/);
  assert.equal(r.body.queued, true, JSON.stringify(r));
  assert.equal(typeof r.body.id, 'number');
  assert.match(r.body.idempotencyKey, /^[A-Za-z0-9_-]{22,64}$/);
  const key = r.body.idempotencyKey;

  const queuedReport = await eventually(async () => (await messages(h)).find((m) => m.type === 'MUTATION_QUEUED'),
    { what: 'MUTATION_QUEUED' });
  assert.deepEqual(queuedReport, { type: 'MUTATION_QUEUED', id: r.body.id, method: 'POST', path: '/projects/p1/tasks', workspace: 'p1', ownerId: 'alice' });

  const records = await listQueue(h);
  assert.deepEqual(records.map((q) => [q.id, q.method, q.path, q.ownerId, q.workspace, q.state]),
    [[r.body.id, 'POST', '/projects/p1/tasks', 'alice', 'p1', 'queued']]);
  assert.equal(records[0].bodySize, JSON.stringify({ title: 'Written in Firefox, offline' }).length, 'the exact body bytes are stored');
  assert.deepEqual(await h.applied(), [], 'nothing may be applied while the server is down');

  await h.setNetwork(true);
  const since = await lastSeq(h);
  await clearReports(h);
  const flushed = await flush(h);
  assert.equal(flushed.ok, true, `flush refused: ${JSON.stringify(flushed)}`);
  assert.equal(flushed.affected, 1);
  const { blocked, summary } = await waitForFlushReports(h);
  assert.deepEqual(blocked?.blocked, [], 'nothing blocked');
  assert.deepEqual(summary, { type: 'MUTATIONS_REPLAYED', count: 1 });

  const applied = await h.applied();
  assert.equal(applied.length, 1, `applied exactly once: ${JSON.stringify(applied)}`);
  assert.equal(applied[0].user, 'alice');
  assert.equal(applied[0].method, 'POST');
  assert.equal(applied[0].path, P1);
  assert.equal(applied[0].key, key, 'applied with the key the 202 named');
  assert.deepEqual(JSON.parse(applied[0].body), { title: 'Written in Firefox, offline' });
  const sent = writesIn(await h.requests(), since);
  assert.deepEqual(sent.map((s) => [s.key, s.expectedAccount, Boolean(s.csrf), s.status]), [[key, 'alice', true, 201]],
    'one replay, with the key, the account and the CSRF token');
  assert.deepEqual(await listQueue(h), [], 'the queue is empty');

  // A second flush sends nothing again.
  const again = await flush(h);
  assert.equal(again.ok, true, JSON.stringify(again));
  assert.equal(again.affected, 0);
  assert.equal((await h.applied()).length, 1);
}));

/** The premise of the fallback tests: this browser has no Background Sync. */
async function assertNoBackgroundSync() {
  const hasSync = await h.evaluate(async () => 'sync' in (await navigator.serviceWorker.getRegistration('/')));
  assert.equal(hasSync, false, 'Firefox has no Background Sync: these tests cover the fallback triggers');
}

test('without Background Sync, a signed-in page load drains the queue (no flush from the test)', withDiagnostics(() => h, async () => {
  await freshStart(h);
  await assertNoBackgroundSync();
  await signIn(h, 'alice');
  await h.setNetwork(false);
  // Two independent lanes, each replayed by the page-load flush whatever order the
  // lanes run in.
  const a = await queuedWrite(h, P1, { title: 'queued before the reload' });
  const b = await queuedWrite(h, P2, { title: 'another project, queued before the reload' });
  await h.setNetwork(true);

  // Nothing replays by itself while the page stays idle: no sync event, no worker `online`.
  await new Promise((r) => setTimeout(r, 1500));
  assert.deepEqual(await h.applied(), [], 'no trigger, no replay');
  assert.equal((await listQueue(h)).length, 2);

  await h.openDemo(); // the page loads again, signed in
  const applied = await eventually(async () => { const x = await h.applied(); return x.length >= 2 ? x : null; },
    { what: 'the reloaded page to drain the queue' });
  // Different workspaces replay in parallel lanes: compare without their relative order.
  const byPath = (x, y) => x[2].localeCompare(y[2]);
  assert.deepEqual(applied.map((x) => [x.user, x.key, x.path]).sort(byPath), [['alice', a.key, P1], ['alice', b.key, P2]].sort(byPath),
    'applied once each, under alice, with their keys');
  await eventually(async () => (await listQueue(h)).length === 0, { what: 'the queue to be empty' });
  assert.equal((await h.applied()).length, 2, 'nothing applied twice');
}));

test('without Background Sync, the window\'s online event drains the queue through the page helper', withDiagnostics(() => h, async () => {
  await freshStart(h);
  await assertNoBackgroundSync();
  await signIn(h, 'alice');
  await h.setNetwork(false);
  const a = await queuedWrite(h, P1, { title: 'queued before online' });
  await h.setNetwork(true);
  await new Promise((r) => setTimeout(r, 1500));
  assert.deepEqual(await h.applied(), [], 'no trigger, no replay');

  await clearReports(h);
  await h.evaluate(() => { window.dispatchEvent(new Event('online')); });
  const answer = await eventually(async () => (await messages(h)).find((m) => m.type === 'COMMAND_RESULT' && m.command === 'FLUSH_QUEUE'),
    { what: 'the helper\'s FLUSH_QUEUE to be answered' });
  assert.equal(answer.ok, true, JSON.stringify(answer));
  assert.equal(answer.affected, 1, 'the online event\'s flush replayed the record');
  const { summary } = await waitForFlushReports(h);
  assert.deepEqual(summary, { type: 'MUTATIONS_REPLAYED', count: 1 });
  const applied = await h.applied();
  assert.deepEqual(applied.map((x) => [x.user, x.key]), [['alice', a.key]], JSON.stringify(applied));
  assert.deepEqual(await listQueue(h), []);
}));
