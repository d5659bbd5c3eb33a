// Every engine: round 4's flush rules against the reference server (contract r4):
// - first-send marks are committed ahead of their sends (4.7): a record marked while the
//   one before it was on the wire, and then not sent (its lane held by a 5xx; a sign-in
//   as another account), has its mark cleared — `firstSentAt` null, `attempts` 0 — so
//   it stays editable and outside the key window, as a record that never left;
// - another account's record whose first send is later than the clock does not make
//   this account's flushes back off (no retry timer for a queue it cannot send);
// - a read the page aborted is not a network failure: the online writes after it get
//   their real answers, not 202 queued (where the browser passes the page's abort to
//   the worker; elsewhere the read simply runs on).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  apiCall, eventually, flush, forEachEngine, freshStart, lastSeq, listQueue, queuedWrite, reconnectAs, sentWithKey,
  openWith, signIn, signOutThroughUi, storedRecord, withDiagnostics,
} from './outbox-helpers.mjs';


const P = (pid) => `/api/projects/${pid}/tasks`;

/** Queues three writes of p1 offline: the first had a first attempt, the others never left. */
async function threeQueued(h, page) {
  await h.setNetwork(false);
  const a = await queuedWrite(page, P('p1'), { title: 'A' });
  const b = await queuedWrite(page, P('p1'), { title: 'B' });
  const c = await queuedWrite(page, P('p1'), { title: 'C' });
  for (const w of [b, c]) {
    const stored = await storedRecord(page, w.id);
    assert.equal(stored.firstSentAt ?? null, null, `queued behind A without an attempt: ${JSON.stringify(stored)}`);
  }
  return [a, b, c];
}

/** Asserts a record is stored as one that never left the worker. */
async function neverLeft(page, w, what) {
  const stored = await storedRecord(page, w.id);
  assert.ok(stored, `${what} is still queued`);
  assert.equal(stored.firstSentAt ?? null, null, `${what}'s mark was cleared: ${JSON.stringify(stored)}`);
  assert.equal(stored.attempts ?? 0, 0, `${what}: ${JSON.stringify(stored)}`);
  const read = await page.evaluate((id) => window.demo.client.send({ type: 'READ_RECORD', id, ownerId: 'alice' }, { timeoutMs: 20000 }), w.id);
  assert.equal(read.record?.sentBefore, false, `READ_RECORD says it was never sent: ${JSON.stringify(read)}`);
}

forEachEngine((engine, harness) => {
  test('marks made ahead for records that are then not sent are cleared: a lane held by a 5xx', withDiagnostics(harness, async () => {
    const h = harness();
    // One lane, and 5xx answers counted far past this test: A stays queued.
    const page = await openWith(h, { replayConcurrency: 1, maxServerFailures: 100 });
    const [a, b, c] = await threeQueued(h, page);
    // Every replay of A is answered 500: B and C are marked ahead when A is handed out,
    // and A's 5xx then holds the lane for the flush.
    await h.control('faults', { rules: [{ path: P('p1'), method: 'POST', kind: 'status', status: 500, detail: 'boom' }] });
    await h.setNetwork(true);
    await eventually(async () => {
      await flush(page);
      return (await sentWithKey(h, a.key)).filter((x) => x.status === 500).length >= 2;
    }, { timeout: 20000, interval: 300, what: 'two flushes meeting A\'s 500' });
    await flush(page); // and one whose end is surely stored
    assert.deepEqual([...await sentWithKey(h, b.key), ...await sentWithKey(h, c.key)], [], 'B and C never left');
    await neverLeft(page, b, 'B');
    await neverLeft(page, c, 'C');
    await h.control('faults', { rules: [] });
    await eventually(async () => (await flush(page)).ok && (await listQueue(page)).length === 0,
      { timeout: 30000, interval: 500, what: 'the queue to drain' });
    assert.deepEqual((await h.applied()).map((x) => x.key), [a.key, b.key, c.key], 'applied once each, in order');
  }));

  test('a record marked ahead and then held at the sign-in barrier (another account signed in) keeps no mark', withDiagnostics(harness, async () => {
    const h = harness();
    const page = await openWith(h, { replayConcurrency: 1 });
    const [a, b, c] = await threeQueued(h, page);
    // A stays on the wire long enough for bob to sign in meanwhile.
    await h.control('faults', { rules: [{ path: P('p1'), method: 'POST', kind: 'delay', delayMs: 3000, times: 1 }] });
    const since = await lastSeq(h); // A's offline first attempt is logged unanswered too
    const replaysOfA = async () => (await sentWithKey(h, a.key)).filter((x) => x.seq > since);
    await h.setNetwork(true);
    await eventually(async () => (await replaysOfA()).some((x) => x.status === null),
      { what: 'A on the wire', interval: 50 });
    const signedIn = await page.evaluate(() => fetch('/api/auth/login', {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ userId: 'bob', password: 'bob' }),
    }).then((r) => r.status));
    assert.equal(signedIn, 200, 'bob signed in while A was on the wire');
    await eventually(async () => (await replaysOfA()).some((x) => x.status !== null), { what: 'A answered', timeout: 15000 });
    // The flush under alice ends at the barrier: bob is signed in now; alice's B and C
    // are never sent under him, and their marks are cleared with the flush's end.
    await eventually(async () => (await storedRecord(page, b.id))?.attempts === 0 && (await storedRecord(page, c.id))?.attempts === 0,
      { timeout: 15000, interval: 200, what: 'the flush to end with B and C unmarked' });
    assert.deepEqual([...await sentWithKey(h, b.key), ...await sentWithKey(h, c.key)], [], 'B and C never left');
    for (const [w, name] of [[b, 'B'], [c, 'C']]) {
      const stored = await storedRecord(page, w.id);
      assert.equal(stored.firstSentAt ?? null, null, `${name}'s mark was cleared: ${JSON.stringify(stored)}`);
    }
  }));

  test('another account\'s record with a first send later than the clock does not make this account\'s flushes back off', withDiagnostics(harness, async () => {
    const h = harness();
    const page = await freshStart(h);
    await signIn(page, 'bob');
    await h.setNetwork(false);
    const w = await queuedWrite(page, P('p1'), { title: 'bob\'s, sent once' });
    // Its first send as a clock running an hour ahead stored it.
    await page.evaluate((id) => new Promise((res, rej) => {
      const open = indexedDB.open('sw-outbox');
      open.onerror = () => rej(open.error);
      open.onsuccess = () => {
        const tx = open.result.transaction('mutations', 'readwrite');
        const store = tx.objectStore('mutations');
        const get = store.get(id);
        get.onsuccess = () => { store.put({ ...get.result, firstSentAt: Date.now() + 3600000 }); };
        tx.oncomplete = () => { open.result.close(); res(); };
        tx.onerror = () => rej(tx.error);
      };
    }), w.id);
    await signOutThroughUi(page);
    await reconnectAs(h, page, 'alice');
    await signIn(page, 'alice');
    const r = await flush(page);
    assert.equal(r.ok, true, JSON.stringify(r));
    const state = await page.evaluate(() => window.demo.client.list());
    assert.deepEqual([state.delivery?.stoppedBy ?? null, state.delivery?.retryAt ?? null], [null, null],
      `nothing of alice's to send: no stop, no retry timer: ${JSON.stringify(state.delivery)}`);
    assert.deepEqual(await sentWithKey(h, w.key).then((s) => s.filter((x) => x.status !== null && x.user === 'alice')), []);
  }));

  test('a read the page aborts is not a network failure: the online write after it gets its real answer', withDiagnostics(harness, async () => {
    const h = harness();
    const page = await freshStart(h);
    await signIn(page, 'alice');
    await h.control('faults', { rules: [{ path: P('p9'), method: 'GET', kind: 'hang' }] });
    const aborted = await page.evaluate(async (path) => {
      const c = new AbortController();
      const read = fetch(path, { signal: c.signal }).then((res) => `answered ${res.status}`, (e) => e.name);
      await new Promise((r) => setTimeout(r, 300));
      c.abort();
      return read;
    }, P('p9'));
    assert.equal(aborted, 'AbortError', 'the page saw its own abort');
    await new Promise((r) => setTimeout(r, 300)); // the worker's side of the abort settles
    const online = await apiCall(page, 'POST', P('p1'), { title: 'right after the abort' });
    assert.equal(online.status, 201, `sent and answered, not queued as if offline: ${JSON.stringify(online)}`);
    const invalid = await apiCall(page, 'POST', P('p1'), { title: '' });
    assert.equal(invalid.status, 400, `the server's own refusal reaches the page: ${JSON.stringify(invalid)}`);
    assert.deepEqual(await listQueue(page), []);
  }));
});
