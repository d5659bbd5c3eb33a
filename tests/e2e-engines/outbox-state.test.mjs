// Every engine: the page helper's state (`outbox.state` / `outbox.subscribe`, issue 28),
// read in the demo's page while the reference server makes the failures (its network
// switch, its fault rules) and the real worker reports:
// - an offline write is pending in the state (with `background` as the engine can),
//   and after its replay it is gone and its settled result (the created task) is there;
//   `settlement(id)` resolves with it; each change is a new frozen snapshot; nothing is
//   polled while nothing happens;
// - a write the server refuses on replay is blocked with its reason, and a flush that
//   stops (the network down) leaves `delivery` with its reason and its retry time, as
//   LIST_QUEUE says, and the demo's panel says so in words;
// - offline, the demo's panel reads and edits a queued write (and refuses to edit one
//   whose attempt went out), and cancels another: gone from the state, its settlement
//   rejected, never sent; back online the edit is applied once, in its place.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { lacks } from './engines.mjs';
import {
  apiCall, clearReports, eventually, flush, forEachEngine, freshStart, lastSeq, messages, queuedWrite, sentWithKey, signIn,
  storedRecord, withDiagnostics,
} from './outbox-helpers.mjs';

const P1 = '/api/projects/p1/tasks';
const P2 = '/api/projects/p2/tasks';

/** The page helper's state, as plain data. */
const outboxState = (page) => page.evaluate(() => JSON.parse(JSON.stringify(window.demo.client.state)));

/** Waits until `check(state)` holds in the page (polled from the test, not by the page). */
async function stateWhere(page, check, what) {
  let last = null;
  return eventually(async () => {
    last = await outboxState(page);
    return check(last) ? last : null;
  }, { timeout: 30000, what }).catch((err) => {
    err.message += `; last state ${JSON.stringify(last)}`;
    throw err;
  });
}

/** Records every snapshot the store hands its subscribers, in the page. */
const recordSnapshots = (page) => page.evaluate(() => {
  window.__snapshots = [];
  window.__unsubscribe?.();
  window.__unsubscribe = window.demo.client.subscribe((s) => window.__snapshots.push(s));
});

forEachEngine((engine, harness) => {
  test('an offline write is pending in the state; after its replay the settled result is there, and settlement() resolves with it',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await freshStart(h);
      await signIn(page, 'alice');
      await stateWhere(page, (s) => s.ready && s.account === 'alice' && s.records.length === 0, 'the state read, as alice');
      await recordSnapshots(page);

      await h.setNetwork(false);
      const w = await queuedWrite(page, P1, { title: 'pending, then settled' });
      const background = !lacks(engine, 'backgroundSync');
      const queued = await stateWhere(page, (s) => s.pending.some((r) => r.id === w.id), 'the write pending');
      assert.deepEqual(queued.pending.map((r) => [r.id, r.method, r.path, r.ownerId, r.workspace, r.state]),
        [[w.id, 'POST', '/projects/p1/tasks', 'alice', 'p1', 'queued']]);
      assert.equal(queued.background, background, 'background delivery as the engine can (Background Sync)');
      assert.equal(w.background, background);
      const snapshots = await page.evaluate(() => ({
        frozen: window.__snapshots.every((s) => Object.isFrozen(s) && Object.isFrozen(s.pending) && Object.isFrozen(s.records)),
        distinct: new Set(window.__snapshots).size === window.__snapshots.length,
        current: window.__snapshots.at(-1) === window.demo.client.state,
        count: window.__snapshots.length,
      }));
      assert.deepEqual(snapshots, { frozen: true, distinct: true, current: true, count: snapshots.count });
      assert.ok(snapshots.count >= 1, 'the subscriber was called');

      // Nothing happens, nothing is asked: no LIST_QUEUE while the page only waits.
      await clearReports(page);
      await new Promise((r) => setTimeout(r, 3000));
      const idle = (await messages(page)).filter((m) => m.type === 'QUEUE_STATE');
      assert.deepEqual(idle, [], 'no LIST_QUEUE answer while nothing happened');

      await page.evaluate((id) => {
        window.__settlement = window.demo.client.settlement(id).then((s) => ({ ok: s }), (e) => ({ error: `${e.name}: ${e.message}` }));
      }, w.id);
      await h.setNetwork(true);
      await flush(page);
      const after = await stateWhere(page, (s) => s.pending.length === 0 && s.settled.some((x) => x.id === w.id), 'the write settled');
      const settled = after.settled.find((x) => x.id === w.id);
      assert.deepEqual([settled.idempotencyKey, settled.ownerId, settled.status], [w.key, 'alice', 201]);
      const entity = JSON.parse(settled.body);
      const listed = await apiCall(page, 'GET', P1);
      assert.deepEqual(listed.body.tasks.map((t) => [t.id, t.title]), [[entity.id, 'pending, then settled']], 'the created task, its server id');
      assert.deepEqual(after.records, []);
      assert.equal(after.delivery.stoppedBy, null);
      const resolved = await page.evaluate(() => window.__settlement);
      assert.deepEqual(resolved.ok && [resolved.ok.id, resolved.ok.status, resolved.ok.body], [w.id, 201, settled.body], JSON.stringify(resolved));
      assert.deepEqual((await h.applied()).map((a) => a.key), [w.key], 'applied once');
    }));

  test('a write refused on replay is blocked with its reason; a flush stopped offline leaves the delivery status, shown in the panel',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await freshStart(h);
      await signIn(page, 'alice');
      await stateWhere(page, (s) => s.ready && s.account === 'alice', 'the state read, as alice');

      await h.setNetwork(false);
      const refused = await queuedWrite(page, P1, { title: 'refused by the server' });
      const waiting = await queuedWrite(page, P2, { title: 'waits for the network' });
      // Back online, the server refuses P1's replay (400); P2's, in another workspace, goes through.
      await h.control('faults', { rules: [{ path: P1, method: 'POST', kind: 'status', status: 400, times: 1 }] });
      await h.setNetwork(true);
      await flush(page);
      const blocked = await stateWhere(page, (s) => s.blocked.some((b) => b.id === refused.id), 'the refused write blocked');
      assert.deepEqual(blocked.blocked.map((b) => [b.id, b.reason]), [[refused.id, 'rejected']]);
      assert.deepEqual(blocked.pending.map((r) => [r.id, r.state, r.attentionReason]), [[refused.id, 'needs-attention', 'rejected']],
        'still pending: it needs attention');
      assert.ok(blocked.settled.some((x) => x.id === waiting.id), 'the other write settled');
      await page.getByTestId(`record-${refused.id}`).and(page.locator('[data-reason="rejected"]')).waitFor({ timeout: 10000 });

      // A flush that meets a dead network stops, and says when it tries again.
      await h.setNetwork(false);
      const later = await queuedWrite(page, P2, { title: 'sent after the stop' });
      await clearReports(page);
      await page.evaluate(() => window.demo.client.flush().catch(() => null));
      const stopped = await stateWhere(page, (s) => s.delivery.stoppedBy === 'offline', 'the stop in the delivery status');
      assert.equal(typeof stopped.delivery.retryAt, 'number', JSON.stringify(stopped.delivery));
      assert.equal(typeof stopped.delivery.lastAttemptAt, 'number', JSON.stringify(stopped.delivery));
      const listed = await page.evaluate(() => window.demo.client.list());
      assert.equal(listed.delivery.stoppedBy, 'offline', JSON.stringify(listed.delivery));
      const fromList = await outboxState(page);
      assert.equal(fromList.delivery.stoppedBy, 'offline', JSON.stringify(fromList.delivery));
      assert.deepEqual(fromList.pending.map((r) => r.id), [refused.id, later.id]);
      // The panel, in words: why, when, and whether it can be sent with no page open.
      const status = page.getByTestId('delivery-status');
      await status.filter({ hasText: 'the server cannot be reached' }).waitFor({ timeout: 10000 });
      // Read at once (the page's own retries, without Background Sync, move retryAt on).
      const shown = await page.evaluate(() => {
        const node = document.querySelector('[data-testid="delivery-status"]');
        const retryAt = Number(node.dataset.retryAt);
        // The time as the page's locale writes it.
        const at = new Date(retryAt).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' });
        return { text: node.textContent, retryAt, at, stoppedBy: node.dataset.stoppedBy };
      });
      const text = shown.text;
      assert.ok(shown.retryAt > 0 && text.includes(`Will retry at ${shown.at}.`), JSON.stringify(shown));
      assert.equal(shown.stoppedBy, 'offline');
      assert.ok(text.includes(lacks(engine, 'backgroundSync') ? 'next time you open the app' : 'in the background'), text);

      await h.setNetwork(true);
      await flush(page);
      const done = await stateWhere(page, (s) => s.settled.some((x) => x.id === later.id), 'the last write settled');
      assert.equal(done.delivery.stoppedBy, null);
      assert.deepEqual(done.pending.map((r) => r.id), [refused.id], 'only the refused write waits, for a person');
    }));

  test('offline, the demo\'s panel reads, edits and cancels queued writes: the cancelled one gone from the state, its settlement rejected, never sent',
    withDiagnostics(harness, async () => {
      const h = harness();
      // The browser's own switch where it has one; else the server drops every connection.
      const offline = (on) => (lacks(engine, 'setOffline') ? h.setNetwork(!on) : h.setOffline(on));
      const page = await freshStart(h);
      await signIn(page, 'alice');
      // What the panel said of the last action (the flush report after it has its own line),
      // added to a failure of `waiting`.
      const telling = (waiting) => waiting.catch(async (err) => {
        err.message += `; the panel says ${JSON.stringify(await page.evaluate(() => document.querySelector('[data-testid="action-result"]').textContent))}`;
        throw err;
      });
      const said = (text) => telling(page.getByTestId('action-result').filter({ hasText: text }).waitFor({ timeout: 20000 }));
      let w0;
      let w1;
      let w2;
      let seq;
      // The first write's attempt goes out and meets dropped connections (it may have
      // been applied, for all the worker knows); then the browser goes offline, and the
      // next writes are queued without an attempt (the network known down).
      await h.setNetwork(false);
      try {
        w0 = await queuedWrite(page, P1, { title: 'first, attempted' });
        assert.equal(typeof (await storedRecord(page, w0.id)).firstSentAt, 'number', 'the first went out');
        await offline(true);
        w1 = await queuedWrite(page, P1, { title: 'with a typo' });
        assert.equal((await storedRecord(page, w1.id)).firstSentAt, null, 'the second never left the worker');
        w2 = await queuedWrite(page, P2, { title: 'cancelled before it was sent' });
        await stateWhere(page, (s) => s.pending.length === 3, 'three writes pending');

        // Read and edit the one that never left.
        await page.getByTestId(`show-${w1.id}`).click();
        await telling(page.getByTestId(`opened-${w1.id}`).waitFor({ timeout: 20000 }));
        const body = await page.evaluate((id) => document.querySelector(`[data-testid="edit-body-${id}"]`).value, w1.id);
        assert.deepEqual(JSON.parse(body), { title: 'with a typo' });
        await page.getByTestId(`edit-body-${w1.id}`).fill(JSON.stringify({ title: 'fixed offline' }));
        await page.getByTestId(`resend-${w1.id}`).click();
        await said('Resend edited: done');
        await page.getByTestId(`opened-${w1.id}`).waitFor({ state: 'detached', timeout: 10000 });
        // The one whose attempt went out is shown as such, and its edit refused.
        await page.getByTestId(`show-${w0.id}`).click();
        await telling(page.getByTestId(`opened-${w0.id}`).filter({ hasText: 'may already have been applied' }).waitFor({ timeout: 20000 }));
        await page.getByTestId(`resend-${w0.id}`).click();
        await said('Resend edited refused: may-have-been-applied');

        // Cancel the third.
        await page.evaluate((id) => {
          window.__settlement = window.demo.client.settlement(id).then((s) => ({ ok: s }), (e) => ({ error: e.name }));
        }, w2.id);
        await page.getByTestId(`cancel-${w2.id}`).click();
        await page.getByTestId(`record-${w2.id}`).waitFor({ state: 'detached', timeout: 20000 });
        await page.getByTestId('outbox-count').filter({ hasText: /^2$/ }).waitFor({ timeout: 10000 });
        const s = await outboxState(page);
        assert.deepEqual(s.pending.map((r) => [r.id, r.state]), [[w0.id, 'queued'], [w1.id, 'queued']]);
        assert.deepEqual(await page.evaluate(() => window.__settlement), { error: 'WriteNotSettledError' });
        // (Where offline is the server dropping connections, a first attempt reached its
        // listener and was dropped unanswered: in the log, never applied.)
        seq = await lastSeq(h);
      } finally {
        await offline(false);
        await h.setNetwork(true);
      }
      await flush(page);
      await stateWhere(page, (s) => s.pending.length === 0, 'both writes delivered');
      const applied = (await h.applied()).map((a) => JSON.parse(a.body).title);
      assert.deepEqual(applied, ['first, attempted', 'fixed offline'], 'the edit once, in its place; the cancelled write never');
      assert.deepEqual((await sentWithKey(h, w2.key)).filter((r) => r.seq > seq), [], 'the cancelled write never sent after the cancel');
    }));
});
