// The page helper's state (OutboxStore, www/outbox-client.js) on its own, in Node: it uses
// no browser API, so the rules that decide when it re-reads the queue, what it keeps of an
// answer that raced a report, and when a settlement promise gives up are checked here
// message by message. The same store against the real worker, in the three engines, is
// tests/e2e-engines/outbox-state.test.mjs.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { INITIAL_STATE, OutboxStore, WriteNotSettledError } from '../../www/outbox-client.js';

const NO_DELIVERY = { stoppedBy: null, retryAt: null, lastAttemptAt: null };

/** A store whose LIST_QUEUE requests are counted, with a clock at 1000. */
function store() {
  const s = { relists: 0 };
  s.store = new OutboxStore({ relist: () => { s.relists += 1; }, now: () => 1000 });
  return s;
}

const queued = (id, ownerId = 'alice', workspace = 'p1') => ({
  type: 'MUTATION_QUEUED', id, method: 'POST', path: `/projects/${workspace}/tasks`, workspace, ownerId, background: false,
});
const record = (id, ownerId = 'alice', state = 'queued') => ({
  id, method: 'POST', path: '/projects/p1/tasks', ownerId, workspace: 'p1', state, attentionReason: null,
  lastStatus: null, timestamp: 1, bodySize: 2,
});
const signIn = (s, userId = 'alice') => s.store.onAnswer({ type: 'AUTH_SESSION', userId }, { type: 'COMMAND_RESULT', command: 'AUTH_SESSION', ok: true });
const listed = (s, records, mark = 0, delivery = NO_DELIVERY) => s.store.onAnswer({ type: 'LIST_QUEUE' }, { type: 'QUEUE_STATE', records, delivery }, mark);

test('starts empty and not ready; each change is a new frozen snapshot given to the subscribers', () => {
  const s = store();
  assert.equal(s.store.state, INITIAL_STATE);
  assert.equal(s.store.state.ready, false);
  const seen = [];
  const off = s.store.subscribe((state) => seen.push(state));
  signIn(s);
  s.store.onMessage(queued(1));
  off();
  s.store.onMessage(queued(2));
  assert.equal(seen.length, 2, 'called per change, not after unsubscribing');
  assert.notEqual(seen[0], seen[1]);
  for (const state of seen) assert.ok(Object.isFrozen(state) && Object.isFrozen(state.pending) && state.pending.every((r) => Object.isFrozen(r)));
  assert.deepEqual(s.store.state.pending.map((r) => r.id), [1, 2]);
  assert.equal(s.store.state.background, false);
  assert.throws(() => { s.store.state.pending.push(record(3)); }, TypeError);
});

test('a change keeps the identity of the parts it does not change', () => {
  const s = store();
  signIn(s);
  listed(s, [record(1), record(2, 'bob')]);
  const before = s.store.state;
  s.store.onMessage({ type: 'MUTATIONS_PARTIAL', replayed: 0, remaining: 2, stoppedBy: 'offline', retryAt: 5000 });
  const after = s.store.state;
  assert.notEqual(after, before);
  assert.notEqual(after.delivery, before.delivery);
  for (const part of ['records', 'pending', 'blocked', 'settled']) assert.equal(after[part], before[part], part);
  s.store.onMessage(queued(1)); // heard again: nothing new
  assert.equal(s.store.state.records, after.records);
  s.store.onMessage(queued(3));
  assert.notEqual(s.store.state.records, after.records);
  assert.notEqual(s.store.state.pending, after.pending);
});

test('pending is the signed-in account\'s records only; a change of account re-reads the queue', () => {
  const s = store();
  signIn(s, 'alice');
  assert.equal(s.relists, 1);
  listed(s, [record(1, 'alice'), record(2, 'bob'), record(3, null)]);
  assert.deepEqual(s.store.state.pending.map((r) => r.id), [1]);
  assert.deepEqual(s.store.state.records.map((r) => r.id), [1, 2, 3]);
  signIn(s, 'alice');
  assert.equal(s.relists, 1, 'the same account again: nothing to re-read');
  signIn(s, 'bob');
  assert.equal(s.relists, 2);
  assert.deepEqual(s.store.state.pending.map((r) => r.id), [2]);
});

test('until the page says who is signed in, the worker\'s session says whose writes are pending (an offline reload)', () => {
  const s = store();
  // The reloaded page could not reach /auth/me, so it said nothing; the queue's answer
  // names the session the worker persisted.
  const fromWorker = (records, account, mark = 0) => s.store.onAnswer({ type: 'LIST_QUEUE' },
    { type: 'QUEUE_STATE', records, delivery: NO_DELIVERY, account }, mark);
  fromWorker([record(1, 'alice'), record(2, 'bob'), record(3, 'alice')], 'alice');
  assert.equal(s.store.state.account, 'alice');
  assert.equal(s.store.state.accountFrom, 'worker');
  assert.deepEqual(s.store.state.pending.map((r) => r.id), [1, 3], 'alice\'s writes, pending while offline');
  // The page then says the same account: nothing to re-read, now the page's word.
  signIn(s, 'alice');
  assert.equal(s.relists, 0);
  assert.equal(s.store.state.accountFrom, 'page');
  // The page's word stands over the worker's later answers.
  signIn(s, 'bob');
  fromWorker([record(1, 'alice'), record(2, 'bob')], 'alice');
  assert.equal(s.store.state.account, 'bob');
  assert.deepEqual(s.store.state.pending.map((r) => r.id), [2]);
  // A sign-out said by the page is the page's word too.
  s.store.onAnswer({ type: 'AUTH_SESSION', userId: null }, { type: 'COMMAND_RESULT', command: 'AUTH_SESSION', ok: true });
  fromWorker([record(1, 'alice')], 'alice');
  assert.equal(s.store.state.account, null);
  assert.deepEqual(s.store.state.pending, []);
});

test('a worker with no session, or one that does not name it, leaves the account unknown; a clear forgets the worker\'s', () => {
  const s = store();
  listed(s, [record(1, 'alice')]); // no account field: an older worker
  assert.equal(s.store.state.account, null);
  assert.equal(s.store.state.accountFrom, null);
  s.store.onAnswer({ type: 'LIST_QUEUE' }, { type: 'QUEUE_STATE', records: [record(1, 'alice')], delivery: NO_DELIVERY, account: null });
  assert.deepEqual([s.store.state.account, s.store.state.accountFrom, s.store.state.pending.length], [null, null, 0]);
  s.store.onAnswer({ type: 'LIST_QUEUE' }, { type: 'QUEUE_STATE', records: [record(1, 'alice')], delivery: NO_DELIVERY, account: 'alice' });
  assert.equal(s.store.state.pending.length, 1);
  s.store.onAnswer({ type: 'CLEAR_DEVICE' }, { type: 'COMMAND_RESULT', command: 'CLEAR_DEVICE', ok: true, affected: 1 });
  assert.deepEqual([s.store.state.account, s.store.state.accountFrom, s.store.state.pending.length], [null, null, 0]);
});

test('a settled write leaves the lists and its answer is kept; its settlement resolves', async () => {
  const s = store();
  signIn(s);
  s.store.onMessage(queued(1));
  const waiting = s.store.settlement(1);
  const settled = { type: 'MUTATION_SETTLED', id: 1, idempotencyKey: 'k1', ownerId: 'alice', status: 201, contentType: 'application/json', body: '{"id":7}' };
  s.store.onMessage(settled);
  assert.deepEqual(await waiting, { ...settled, settledAt: 1000 });
  assert.deepEqual(s.store.state.pending, []);
  assert.deepEqual(s.store.state.settled.map((x) => x.id), [1]);
  assert.equal((await s.store.settlement(1)).idempotencyKey, 'k1', 'asked after it settled: at once');
});

test('a blocked write takes its reason; one the flush just moved to needs-attention is listed with its old state', () => {
  const s = store();
  signIn(s);
  s.store.onMessage(queued(1));
  s.store.onMessage(queued(2));
  s.store.onMessage({
    type: 'MUTATIONS_BLOCKED',
    blocked: [
      { id: 1, method: 'POST', path: '/projects/p1/tasks', ownerId: 'alice', workspace: 'p1', state: 'queued', reason: 'rejected' },
      { id: 2, method: 'POST', path: '/projects/p1/tasks', ownerId: 'alice', workspace: 'p1', state: 'queued', reason: 'workspace-order' },
      { id: 9, method: null, path: null, ownerId: 'bob', workspace: null, state: 'queued', reason: 'owner-mismatch' },
    ],
  });
  const { records, blocked } = s.store.state;
  assert.deepEqual(records.map((r) => [r.id, r.state, r.attentionReason]),
    [[1, 'needs-attention', 'rejected'], [2, 'queued', null], [9, 'queued', null]]);
  assert.deepEqual(blocked.map((b) => b.reason), ['rejected', 'workspace-order', 'owner-mismatch']);
});

test('a flush summary the page can explain asks nothing; one it cannot re-reads the queue once', () => {
  const s = store();
  signIn(s);
  listed(s, [record(1), record(2)]);
  const before = s.relists;
  s.store.onMessage({ type: 'MUTATIONS_BLOCKED', blocked: [] });
  s.store.onMessage({ type: 'MUTATIONS_PARTIAL', replayed: 0, remaining: 2, stoppedBy: 'offline', retryAt: 5000 });
  assert.equal(s.relists, before, 'two known, two remaining');
  assert.deepEqual(s.store.state.delivery, { stoppedBy: 'offline', retryAt: 5000, lastAttemptAt: 1000 });
  s.store.onMessage({ type: 'MUTATIONS_PARTIAL', replayed: 0, remaining: 3, stoppedBy: null, retryAt: null });
  assert.equal(s.relists, before + 1, 'a record the page never heard of: read again');
});

test('MUTATIONS_REPLAYED empties the lists, keeping (and checking) writes queued during that flush', async () => {
  const s = store();
  signIn(s);
  s.store.onMessage(queued(1));
  const dropped = s.store.settlement(1).catch((e) => e);
  s.store.onMessage({ type: 'MUTATIONS_BLOCKED', blocked: [] });
  s.store.onMessage(queued(2)); // committed after the flush re-read the queue
  const before = s.relists;
  s.store.onMessage({ type: 'MUTATIONS_REPLAYED', count: 1 });
  assert.deepEqual(s.store.state.records.map((r) => r.id), [2]);
  assert.equal(s.relists, before + 1, 'the newer write is checked with one LIST_QUEUE');
  assert.ok(await dropped instanceof WriteNotSettledError, 'settled without this page hearing: the promise gives up');
  s.store.onMessage({ type: 'MUTATIONS_BLOCKED', blocked: [] });
  s.store.onMessage({ type: 'MUTATIONS_REPLAYED', count: 1 });
  assert.deepEqual(s.store.state.records, []);
  assert.equal(s.relists, before + 1, 'nothing newer: nothing asked');
});

test('a LIST_QUEUE answer keeps a write heard queued after it was sent', () => {
  const s = store();
  signIn(s);
  const mark = s.store.mark();
  s.store.onMessage(queued(5)); // reached the page before the (older) answer
  s.store.onMessage(queued(6));
  listed(s, [record(5)], mark, { stoppedBy: 'offline', retryAt: 9, lastAttemptAt: 8 });
  assert.deepEqual(s.store.state.records.map((r) => r.id), [5, 6]);
  assert.equal(s.store.state.ready, true);
  assert.deepEqual(s.store.state.delivery, { stoppedBy: 'offline', retryAt: 9, lastAttemptAt: 8 });
  listed(s, [record(5)], s.store.mark());
  assert.deepEqual(s.store.state.records.map((r) => r.id), [5], 'an answer sent after it was heard is the truth');
});

test('a cancel, an edit and a clear of this page change the lists at once; a cancelled write\'s settlement rejects', async () => {
  const s = store();
  signIn(s);
  listed(s, [record(1), record(2, 'alice', 'needs-attention'), record(3)]);
  const cancelled = s.store.settlement(1).catch((e) => e);
  const ok = (command) => s.store.onAnswer(command, { type: 'COMMAND_RESULT', command: command.type, ok: true, affected: 1 });
  s.store.onAnswer({ type: 'RECOVER_RECORD', id: 3, ownerId: 'alice', action: 'discard' }, { type: 'COMMAND_RESULT', command: 'RECOVER_RECORD', ok: false, reason: 'gone' });
  assert.deepEqual(s.store.state.records.map((r) => r.id), [1, 2, 3], 'a refusal changes nothing');
  ok({ type: 'RECOVER_RECORD', id: 1, ownerId: 'alice', action: 'discard' });
  const error = await cancelled;
  assert.ok(error instanceof WriteNotSettledError && error.id === 1, String(error));
  ok({ type: 'RECOVER_RECORD', id: 2, ownerId: 'alice', action: 'edit', body: '{}' });
  assert.deepEqual(s.store.state.records.map((r) => [r.id, r.state]), [[2, 'queued'], [3, 'queued']]);
  const cleared = s.store.settlement(3).catch((e) => e);
  ok({ type: 'CLEAR_DEVICE' });
  assert.deepEqual([s.store.state.records, s.store.state.delivery], [[], NO_DELIVERY]);
  assert.ok(await cleared instanceof WriteNotSettledError);
});
