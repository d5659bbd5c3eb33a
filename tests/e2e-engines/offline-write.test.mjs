// Every engine: a write made while the server is unreachable (through the API or the
// demo's form) is queued (202 with its key) and replayed exactly once under its account.
// Where the engine has no Background Sync (Firefox, WebKit), the live worker retries on
// its own (contract 2.6), even for a page that has no page helper, and with no page of
// the app open and the worker stopped, the page helper's fallback triggers drain the
// queue: a signed-in page load (AUTH_SESSION + FLUSH_QUEUE) and the window's `online`
// event.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { lacks } from './engines.mjs';
import {
  apiCall, clearReports, eventually, flush, forEachEngine, freshStart, lastSeq, listQueue, messages,
  queuedWrite, readMutations, sentWithKey, signIn, waitForFlushReports, withDiagnostics, writesIn,
} from './outbox-helpers.mjs';

const P1 = '/api/projects/p1/tasks';
const P2 = '/api/projects/p2/tasks';

forEachEngine((engine, harness) => {
  test('an offline write answers 202, is listed, and one FLUSH_QUEUE applies it exactly once', withDiagnostics(harness, async () => {
    const h = harness();
    const page = await freshStart(h);
    await signIn(page, 'alice');
    await h.setNetwork(false);
    await clearReports(page);

    const title = `Written in ${engine}, offline`;
    const r = await page.evaluate(([path, t]) => fetch(path, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', 'X-CSRF-Token': window.demo.state.csrf, 'X-PM-Expected-Account': 'alice' },
      body: JSON.stringify({ title: t }),
    }).then(async (res) => ({ status: res.status, type: res.headers.get('content-type'), body: await res.json() })), [P1, title]);
    assert.equal(r.status, 202, JSON.stringify(r));
    assert.match(r.type ?? '', /application\/json/);
    assert.equal(r.body.queued, true, JSON.stringify(r));
    assert.equal(typeof r.body.id, 'number');
    assert.match(r.body.idempotencyKey, /^[A-Za-z0-9_-]{22,64}$/);
    const key = r.body.idempotencyKey;

    const queuedReport = await eventually(async () => (await messages(page)).find((m) => m.type === 'MUTATION_QUEUED'),
      { what: 'MUTATION_QUEUED' });
    // `background` (r3): Background Sync was registered for it, so it can be delivered
    // with no page open (Chromium); the 202 says the same.
    const background = !lacks(engine, 'backgroundSync');
    assert.equal(r.body.background, background, JSON.stringify(r.body));
    assert.deepEqual(queuedReport, { type: 'MUTATION_QUEUED', id: r.body.id, method: 'POST', path: '/projects/p1/tasks', workspace: 'p1', ownerId: 'alice', background });

    const records = await listQueue(page);
    assert.deepEqual(records.map((q) => [q.id, q.method, q.path, q.ownerId, q.workspace, q.state]),
      [[r.body.id, 'POST', '/projects/p1/tasks', 'alice', 'p1', 'queued']]);
    assert.equal(records[0].bodySize, JSON.stringify({ title }).length, 'the exact body bytes are stored');
    assert.deepEqual(await h.applied(), [], 'nothing may be applied while the server is down');

    await h.setNetwork(true);
    const since = await lastSeq(h);
    await clearReports(page);
    const flushed = await flush(page);
    assert.equal(flushed.ok, true, `flush refused: ${JSON.stringify(flushed)}`);
    assert.equal(flushed.affected, 1);
    const { blocked, summary } = await waitForFlushReports(page);
    assert.deepEqual(blocked?.blocked, [], 'nothing blocked');
    assert.deepEqual(summary, { type: 'MUTATIONS_REPLAYED', count: 1 });

    const applied = await h.applied();
    assert.equal(applied.length, 1, `applied exactly once: ${JSON.stringify(applied)}`);
    assert.equal(applied[0].user, 'alice');
    assert.equal(applied[0].method, 'POST');
    assert.equal(applied[0].path, P1);
    assert.equal(applied[0].key, key, 'applied with the key the 202 named');
    assert.deepEqual(JSON.parse(applied[0].body), { title });
    const sent = writesIn(await h.requests(), since);
    assert.deepEqual(sent.map((s) => [s.key, s.expectedAccount, Boolean(s.csrf), s.status]), [[key, 'alice', true, 201]],
      'one replay, with the key, the account and the CSRF token');
    assert.deepEqual(await listQueue(page), [], 'the queue is empty');

    // A second flush sends nothing again.
    const again = await flush(page);
    assert.equal(again.ok, true, JSON.stringify(again));
    assert.equal(again.affected, 0);
    assert.equal((await h.applied()).length, 1);
  }));

  test('through the demo\'s form: an offline task is queued, shown in the outbox, and applied once after a flush', withDiagnostics(harness, async () => {
    const h = harness();
    const page = await freshStart(h);
    await signIn(page, 'alice');

    await h.setNetwork(false);
    const title = 'Write the offline chapter';
    await page.getByTestId('task-title-p1').fill(title);
    await page.getByTestId('task-add-p1').click();
    await page.getByTestId('write-result').filter({ hasText: 'queued' }).first().waitFor();

    const result = await page.evaluate(() => window.demo.lastResult);
    assert.equal(result.status, 202, `expected 202, got ${JSON.stringify(result)}`);
    assert.equal(result.body.queued, true);
    assert.match(result.body.idempotencyKey, /^[A-Za-z0-9_-]{22,64}$/);
    const key = result.body.idempotencyKey;
    assert.deepEqual(await h.applied(), [], 'nothing may be applied while the server is down');

    await page.getByTestId(`record-${result.body.id}`).waitFor();

    await h.setNetwork(true);
    const flushed = await page.evaluate(() => window.demo.client.flush());
    assert.equal(flushed.type, 'COMMAND_RESULT');
    assert.equal(flushed.command, 'FLUSH_QUEUE');
    assert.equal(flushed.ok, true, `flush refused: ${JSON.stringify(flushed)}`);

    const applied = await h.applied();
    assert.equal(applied.length, 1, `applied exactly once: ${JSON.stringify(applied)}`);
    assert.equal(applied[0].user, 'alice');
    assert.equal(applied[0].method, 'POST');
    assert.equal(applied[0].path, '/api/projects/p1/tasks');
    assert.equal(applied[0].key, key);
    assert.equal(JSON.parse(applied[0].body).title, title);

    await page.getByTestId('task-list-p1').getByTestId('task').filter({ hasText: title }).waitFor();
    await page.getByTestId('outbox-count').filter({ hasText: /^0$/ }).waitFor();
  }));

  /** The premise of the fallback tests: this browser has no Background Sync. */
  async function assertNoBackgroundSync(page) {
    const hasSync = await page.evaluate(async () => 'sync' in (await navigator.serviceWorker.getRegistration('/')));
    assert.equal(hasSync, false, `${engine} has no Background Sync: these tests cover the fallback triggers`);
  }

  /**
   * Leaves nothing that could flush on its own: the tab on a page of the origin without
   * the page helper (an image: no scripts), and the worker stopped (its retry timer and
   * offline probe go with it: contract 2.4, 2.6). Only then does a fallback trigger have
   * the queue to itself.
   */
  async function quiet(h, page) {
    await page.goto(`${h.baseUrl}/icon.svg`);
    await h.stopWorkers();
  }

  test('without Background Sync, a signed-in page load drains the queue (no flush from the test)',
    { skip: lacks(engine, 'noBackgroundSync', 'stopWorkers') }, withDiagnostics(harness, async () => {
      const h = harness();
      let page = await freshStart(h);
      await assertNoBackgroundSync(page);
      await signIn(page, 'alice');
      await h.setNetwork(false);
      // Two independent lanes, each replayed by the page-load flush whatever order the
      // lanes run in.
      const a = await queuedWrite(page, P1, { title: 'queued before the reload' });
      const b = await queuedWrite(page, P2, { title: 'another project, queued before the reload' });
      await quiet(h, page);
      await h.setNetwork(true);

      // Nothing replays by itself while no page of the app is open and the worker is not
      // running: no sync event, no worker `online`.
      await new Promise((r) => setTimeout(r, 1500));
      assert.deepEqual(await h.applied(), [], 'no trigger, no replay');
      assert.equal(await readMutations(page, 'count'), 2);

      page = await h.openDemo({ page }); // the page loads again, signed in
      const applied = await eventually(async () => { const x = await h.applied(); return x.length >= 2 ? x : null; },
        { what: 'the reloaded page to drain the queue' });
      // Different workspaces replay in parallel lanes: compare without their relative order.
      const byPath = (x, y) => x[2].localeCompare(y[2]);
      assert.deepEqual(applied.map((x) => [x.user, x.key, x.path]).sort(byPath), [['alice', a.key, P1], ['alice', b.key, P2]].sort(byPath),
        'applied once each, under alice, with their keys');
      await eventually(async () => (await listQueue(page)).length === 0, { what: 'the queue to be empty' });
      assert.equal((await h.applied()).length, 2, 'nothing applied twice');
    }));

  test('without Background Sync, the window\'s online event drains the queue through the page helper',
    { skip: lacks(engine, 'noBackgroundSync', 'stopWorkers') }, withDiagnostics(harness, async () => {
      const h = harness();
      let page = await freshStart(h);
      await assertNoBackgroundSync(page);
      await signIn(page, 'alice');
      await h.setNetwork(false);
      const a = await queuedWrite(page, P1, { title: 'queued before online' });
      // The app loads again while the server is unreachable: its helper has seen no
      // report to retry on (a flush that fails its identity check reports nothing).
      await quiet(h, page);
      page = await h.openDemo({ page });
      await h.stopWorkers();
      await h.setNetwork(true);
      await new Promise((r) => setTimeout(r, 1500));
      assert.deepEqual(await h.applied(), [], 'no trigger, no replay');

      await clearReports(page);
      await page.evaluate(() => { window.dispatchEvent(new Event('online')); });
      const answer = await eventually(async () => (await messages(page)).find((m) => m.type === 'COMMAND_RESULT' && m.command === 'FLUSH_QUEUE'),
        { what: 'the helper\'s FLUSH_QUEUE to be answered' });
      assert.equal(answer.ok, true, JSON.stringify(answer));
      assert.equal(answer.affected, 1, 'the online event\'s flush replayed the record');
      const { summary } = await waitForFlushReports(page);
      assert.deepEqual(summary, { type: 'MUTATIONS_REPLAYED', count: 1 });
      const applied = await h.applied();
      assert.deepEqual(applied.map((x) => [x.user, x.key]), [['alice', a.key]], JSON.stringify(applied));
      assert.deepEqual(await listQueue(page), []);
    }));

  // Contract 2.6 (r2): the live worker retries on its backoff schedule, and the page helper
  // asks again on its own, so nothing waits for a reload while the user stays on a page.
  test('without Background Sync, writes queued while online are delivered without a reload, an online event or a flush',
    { skip: lacks(engine, 'noBackgroundSync') }, withDiagnostics(harness, async () => {
      const h = harness();
      const page = await freshStart(h);
      await signIn(page, 'alice');
      // One transient failure: the first write's connection is refused once; lane order
      // queues the next ones behind it.
      await h.control('faults', { rules: [{ path: P1, method: 'POST', kind: 'refuse', times: 1 }] });
      const titles = ['first, refused once', 'second, behind it', 'third, behind both'];
      for (const title of titles) {
        const r = await apiCall(page, 'POST', P1, { title });
        assert.equal(r.status, 202, `${title}: queued (${JSON.stringify(r)})`);
      }
      // Nothing more from the test.
      const applied = await eventually(async () => {
        const rows = await h.applied();
        return rows.length >= titles.length ? rows : null;
      }, { timeout: 30000, interval: 250, what: 'the queued writes to be delivered' });
      assert.deepEqual(applied.map((a) => JSON.parse(a.body).title), titles, 'each applied once, in order');
    }));

  // Only the worker's own retry timer (src/worker/retry.rs) can deliver here: the write
  // comes from a plain page of the origin (no page helper, so no FLUSH_QUEUE and no retry
  // of its own), the engine has no Background Sync, the browser never goes offline (no
  // `online` event), and the test does nothing after the write. The first replay, by
  // whichever of the worker's own triggers comes first (its retry 1 s after queuing, or
  // its offline probe, which flushes once when the server answers again), meets a 500;
  // after that only the backoff's timer is left to send it again.
  test('without Background Sync, a write from a page without the page helper is delivered by the worker\'s own retries',
    { skip: lacks(engine, 'noBackgroundSync') }, withDiagnostics(harness, async () => {
      const h = harness();
      const page = await freshStart(h);
      await signIn(page, 'alice');
      const csrf = await page.evaluate(() => window.demo.state.csrf);
      // The same tab, now on a page of the origin that loads no script of the app.
      await page.goto(`${h.baseUrl}/icon.svg`);
      const plain = await page.evaluate(() => ({ controlled: Boolean(navigator.serviceWorker.controller), demo: 'demo' in window }));
      assert.deepEqual(plain, { controlled: true, demo: false }, 'a controlled page without the page helper');
      await h.control('faults', { rules: [
        { path: P1, method: 'POST', kind: 'refuse', times: 1 }, // the first attempt: queued
        { path: P1, method: 'POST', kind: 'status', status: 500, detail: 'try again', times: 1 }, // the first replay
      ] });
      const r = await page.evaluate(([path, token]) => fetch(path, {
        method: 'POST',
        headers: { 'Content-Type': 'application/json', 'X-CSRF-Token': token },
        body: JSON.stringify({ title: 'from a plain page' }),
      }).then(async (res) => ({ status: res.status, body: await res.json() })), [P1, csrf]);
      assert.equal(r.status, 202, JSON.stringify(r));
      // Nothing more from the page or the test: only the server's logs are read.
      const applied = await eventually(async () => {
        const rows = await h.applied();
        return rows.length ? rows : null;
      }, { timeout: 30000, interval: 250, what: 'the worker to retry after the 500' });
      assert.deepEqual(applied.map((a) => [a.key, a.user, JSON.parse(a.body).title]),
        [[r.body.idempotencyKey, 'alice', 'from a plain page']], 'applied once, as alice');
      const answered = (await sentWithKey(h, r.body.idempotencyKey)).filter((x) => x.status !== null).map((x) => x.status);
      assert.deepEqual(answered, [500, 201], 'replayed, failed, and replayed again by the worker alone');
    }));
});
