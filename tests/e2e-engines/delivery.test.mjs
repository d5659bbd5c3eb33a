// Every engine: issue 27 (reliability round 3) against the reference server, each case
// through a real failure the server makes (its fault rules) or a record as a real
// browser stores it:
// - a flush stopped by a 502 from /auth/me is reported (MUTATIONS_PARTIAL stoppedBy,
//   retryAt; LIST_QUEUE delivery) and retried by the worker alone, no page open (4.8);
// - a large /auth/me (900 KiB) is an answer: the flush replays, and the network is not
//   taken for down (4.1 r3);
// - a 403 permission page that carries a CSRF token in its layout is a refusal, not a
//   stall of the queue (4.5 r3); a second account_mismatch stops the flush, reported;
// - a 401 to a replay is reported `unauthorized` with no retry time, and the next
//   AUTH_SESSION naming the account delivers it (choice, docs/PROTOCOL.md);
// - the key window is checked again when a record is handed to its lane, and a first
//   send later than the clock reads keeps a record from being sent (4.7 r3);
// - a notification that is not the outbox's is left alone (Firefox: a real click).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { lacks } from './engines.mjs';
import {
  apiCall, clearReports, eventually, flush, forEachEngine, freshStart, listQueue, messages, openWith,
  queuedWrite, reports, send, sentWithKey, signIn, waitForFlushReports, withDiagnostics,
} from './outbox-helpers.mjs';

const P1 = '/api/projects/p1/tasks';
const P2 = '/api/projects/p2/tasks';
const HOUR = 3600000;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** The statuses the server answered to sends carrying `key` (a dropped first attempt has none). */
const answered = async (h, key) => (await sentWithKey(h, key)).filter((x) => x.status !== null).map((x) => x.status);

/** Changes fields of a stored record straight in IndexedDB from the page, no worker involved. */
function patchRecord(page, id, patch) {
  return page.evaluate(([i, p]) => new Promise((res, rej) => {
    const open = indexedDB.open('sw-outbox');
    open.onerror = () => rej(open.error);
    open.onsuccess = () => {
      const db = open.result;
      const tx = db.transaction('mutations', 'readwrite');
      const store = tx.objectStore('mutations');
      const get = store.get(i);
      get.onsuccess = () => store.put(Object.assign(get.result, p));
      tx.oncomplete = () => { db.close(); res(true); };
      tx.onerror = () => rej(tx.error);
    };
  }), [id, patch]);
}

forEachEngine((engine, harness) => {
  test('a flush stopped by a 502 from /auth/me is reported and retried by the worker alone, with no page open',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await freshStart(h);
      await signIn(page, 'alice');
      await h.setNetwork(false);
      const w = await queuedWrite(page, P1, { title: 'waits out a gateway error' });
      await h.control('faults', { rules: [{ path: '/api/auth/me', method: 'GET', kind: 'status', status: 502, detail: 'bad_gateway' }] });
      await h.setNetwork(true);
      await clearReports(page);
      const before = Date.now();
      const r = await flush(page);
      assert.equal(r.ok, false, JSON.stringify(r));
      assert.match(r.reason, /502/);
      // Reported (r3, contract 5): why, and when the worker tries again on its own.
      // (A flush that started while the server was still unreachable may report `offline`
      // first: the one of this flush is the identity check's.)
      const partial = await eventually(async () => (await reports(page)).find((m) => m.type === 'MUTATIONS_PARTIAL' && m.stoppedBy === 'identity-check'),
        { what: 'the stop to be reported' });
      const { retryAt, ...counts } = partial;
      assert.deepEqual(counts, { type: 'MUTATIONS_PARTIAL', replayed: 0, remaining: 1, stoppedBy: 'identity-check' });
      assert.ok(retryAt > before && retryAt <= Date.now() + HOUR, `retryAt within maxRetryAfterMs: ${JSON.stringify(partial)}`);
      const state = await page.evaluate(() => window.demo.client.list());
      assert.equal(state.delivery.stoppedBy, 'identity-check', JSON.stringify(state.delivery));
      assert.equal(typeof state.delivery.retryAt, 'number', JSON.stringify(state.delivery));
      assert.ok(state.delivery.lastAttemptAt >= before, JSON.stringify(state.delivery));

      // The worker's retry of a freshly queued write (1 s after it, where there is no
      // Background Sync) meets the 502 too: what follows is the stop's own retry.
      await eventually(async () => (await h.requests()).filter((x) => x.path === '/api/auth/me' && x.status === 502).length >= 2,
        { what: 'a second identity check answered 502' });
      // No page of the app is open any more (a blank tab stays), the gateway recovers, and
      // nobody asks: no page helper, no sync retry within this time (Chromium's is 5 min).
      const blank = await h.browser.newPage();
      await page.goto('about:blank'); // unloaded first: its helper's timers go with it
      await page.close();
      await h.control('faults', { rules: [] });
      await eventually(async () => (await h.applied()).some((a) => a.key === w.key),
        { timeout: 60000, interval: 500, what: 'the worker to retry on its own' });
      assert.deepEqual((await h.applied()).map((a) => [a.key, a.user]), [[w.key, 'alice']], 'applied once, as alice');
      const again = await h.openDemo({ page: blank });
      assert.deepEqual(await listQueue(again), []);
    }));

  test('a 900 KiB /auth/me answer is read: the flush replays, and the next write is sent, not queued',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await freshStart(h);
      await signIn(page, 'alice');
      const csrf = await page.evaluate(() => window.demo.state.csrf);
      await h.setNetwork(false);
      const w = await queuedWrite(page, P1, { title: 'replayed past a large profile' });
      const profile = { user: { id: 'alice' }, csrfToken: csrf, avatar: 'x'.repeat(900 * 1024) };
      await h.control('faults', { rules: [{
        path: '/api/auth/me', method: 'GET', kind: 'status', status: 200, body: JSON.stringify(profile), contentType: 'application/json',
      }] });
      await h.setNetwork(true);
      const r = await flush(page);
      assert.equal(r.ok, true, `the identity was read: ${JSON.stringify(r)}`);
      await eventually(async () => (await h.applied()).some((a) => a.key === w.key), { what: 'the replay' });
      // A large answer never marks the network down: a new write goes to the server.
      const online = await apiCall(page, 'POST', P2, { title: 'sent at once' });
      assert.equal(online.status, 201, JSON.stringify(online));
      assert.deepEqual((await h.applied()).map((a) => a.user), ['alice', 'alice']);
    }));

  test('a 403 permission page with a CSRF token in its layout is a refusal: rejected at once, and the queue goes on',
    withDiagnostics(harness, async () => {
      const h = harness();
      // One lane at a time, so a stalled record would hold the next workspace too.
      const page = await openWith(h, { replayConcurrency: 1 });
      await h.setNetwork(false);
      const a = await queuedWrite(page, P1, { title: 'not allowed here' });
      const b = await queuedWrite(page, P2, { title: 'another project, after it' });
      const rails = '<!DOCTYPE html><html><head><title>Forbidden</title>'
        + '<meta name="csrf-param" content="authenticity_token" />'
        + '<meta name="csrf-token" content="Zm9vYmFyLWludmFsaWQtbG9va2luZw" />'
        + '<script>window.csrfToken = document.querySelector("meta[name=csrf-token]").content;</script>'
        + '</head><body><h1>You are not allowed to change this project.</h1></body></html>';
      await h.control('faults', { rules: [{ path: P1, method: 'POST', kind: 'status', status: 403, body: rails, contentType: 'text/html; charset=utf-8' }] });
      await h.setNetwork(true);
      await clearReports(page);
      const r = await flush(page);
      assert.equal(r.ok, true, JSON.stringify(r));
      await eventually(async () => (await h.applied()).some((x) => x.key === b.key), { what: 'the other workspace to be delivered' });
      const rec = (await listQueue(page)).find((x) => x.id === a.id);
      assert.deepEqual([rec?.state, rec?.attentionReason, rec?.lastStatus], ['needs-attention', 'rejected', 403], JSON.stringify(rec));
      assert.deepEqual(await answered(h, a.key), [403], 'refused once: not taken for a stale identity');
      assert.deepEqual((await h.applied()).map((x) => x.key), [b.key]);
    }));

  test('a second account_mismatch stops the flush and is reported (stoppedBy account-mismatch, retryAt)',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await freshStart(h);
      await signIn(page, 'alice');
      await h.setNetwork(false);
      const a = await queuedWrite(page, P1, { title: 'the server keeps seeing another account' });
      await h.control('faults', { rules: [{ path: P1, method: 'POST', kind: 'status', status: 409, detail: 'account_mismatch' }] });
      await h.setNetwork(true);
      await clearReports(page);
      await flush(page);
      const { summary } = await waitForFlushReports(page);
      const { retryAt, ...counts } = summary;
      assert.deepEqual(counts, { type: 'MUTATIONS_PARTIAL', replayed: 0, remaining: 1, stoppedBy: 'account-mismatch' });
      assert.equal(typeof retryAt, 'number', JSON.stringify(summary));
      const rec = (await listQueue(page)).find((x) => x.id === a.id);
      assert.equal(rec?.state, 'queued', 'the record is unchanged');
      const statuses = await answered(h, a.key);
      assert.deepEqual(statuses.slice(0, 2), [409, 409], 'checked again once, resent once, then stopped');
      assert.deepEqual(await h.applied(), []);
      await h.control('faults', { rules: [] });
    }));

  test('a 401 to a replay is reported unauthorized with no retry time; the next AUTH_SESSION delivers it',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await freshStart(h);
      await signIn(page, 'alice');
      await h.setNetwork(false);
      const a = await queuedWrite(page, P1, { title: 'refused as signed out' });
      await h.control('faults', { rules: [{ path: P1, method: 'POST', kind: 'status', status: 401, detail: 'not_signed_in' }] });
      await h.setNetwork(true);
      await clearReports(page);
      await flush(page);
      const { summary } = await waitForFlushReports(page);
      assert.deepEqual(summary, { type: 'MUTATIONS_PARTIAL', replayed: 0, remaining: 1, stoppedBy: 'unauthorized', retryAt: null });
      const state = await page.evaluate(() => window.demo.client.list());
      assert.deepEqual([state.delivery.stoppedBy, state.delivery.retryAt], ['unauthorized', null]);
      // A flush another trigger had already started (the worker's offline probe when the
      // server answered again, a retry due from before) runs before this one is answered,
      // and meets the same 401: after it, nothing is pending.
      await flush(page);
      await sleep(1000);
      await h.control('faults', { rules: [] });
      // Where Background Sync exists the page helper does not retry on its own, and the
      // sync's own retry is minutes away: only the AUTH_SESSION can deliver it now.
      if (!lacks(engine, 'backgroundSync')) {
        await sleep(2500);
        assert.deepEqual(await h.applied(), [], 'nothing retries a 401 on a timer');
      }
      const session = await send(page, { type: 'AUTH_SESSION', userId: 'alice' });
      assert.equal(session.ok, true, JSON.stringify(session));
      await eventually(async () => (await h.applied()).some((x) => x.key === a.key), { what: 'the sign-in to deliver it' });
      assert.deepEqual((await h.applied()).map((x) => [x.key, x.user]), [[a.key, 'alice']]);
    }));

  test('the key window is checked again when a record is handed to its lane',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await openWith(h, { serverKeyTtlMs: 8000 });
      await h.setNetwork(false);
      const a = await queuedWrite(page, P1, { title: 'held 6 s by the server' });
      const b = await queuedWrite(page, P1, { title: 'behind it, first sent 3 s ago' });
      // b went out once 3 s ago (as far as its record says): inside the 8 s window when the
      // flush starts, past it once a's replay, held 6 s, is answered.
      await patchRecord(page, b.id, { firstSentAt: Date.now() - 3000 });
      await h.control('faults', { rules: [{ path: P1, method: 'POST', kind: 'delay', delayMs: 6000, times: 1 }] });
      await h.setNetwork(true);
      await flush(page);
      await eventually(async () => (await h.applied()).some((x) => x.key === a.key), { what: 'a to be applied' });
      const rec = await eventually(async () => (await listQueue(page)).find((x) => x.id === b.id && x.state === 'needs-attention'),
        { what: 'b to need attention' });
      assert.equal(rec.attentionReason, 'key-expired', JSON.stringify(rec));
      assert.deepEqual(await answered(h, b.key), [], 'b was never sent with its old key');
      assert.deepEqual((await h.applied()).map((x) => x.key), [a.key]);
    }));

  test('a record whose first send is later than the clock reads is not sent; other workspaces are',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await freshStart(h);
      await signIn(page, 'alice');
      await h.setNetwork(false);
      const a = await queuedWrite(page, P1, { title: 'first sent "in an hour"' });
      const c = await queuedWrite(page, P2, { title: 'an ordinary record' });
      // As if the clock had been moved back an hour since a went out.
      await patchRecord(page, a.id, { firstSentAt: Date.now() + HOUR });
      await h.setNetwork(true);
      const r = await flush(page);
      assert.equal(r.ok, true, JSON.stringify(r));
      await eventually(async () => (await h.applied()).some((x) => x.key === c.key), { what: 'c to be applied' });
      await sleep(1000);
      assert.deepEqual(await answered(h, a.key), [], 'a was not sent: its age cannot be known');
      const rec = (await listQueue(page)).find((x) => x.id === a.id);
      assert.equal(rec?.state, 'queued', 'kept as it was');
    }));

  test('a notification that is not the outbox\'s is left to its own listeners',
    { skip: lacks(engine, 'grantNotifications', 'clickNotification') }, withDiagnostics(harness, async () => {
      const h = harness();
      const page = await freshStart(h);
      await h.grantNotifications();
      await signIn(page, 'alice');
      await clearReports(page);
      const tabs = (await h.browser.openPages()).length;
      await page.evaluate(async () => {
        const reg = await navigator.serviceWorker.ready;
        await reg.showNotification('From the site', { tag: 'site-news', body: 'not the outbox', data: { record: 5, url: 'https://example.com/' } });
      });
      const clicked = await eventually(() => h.clickNotification(), { what: 'the site\'s notification to be clicked' });
      assert.equal(clicked.title, 'From the site');
      await sleep(1500);
      assert.deepEqual((await messages(page)).filter((m) => m.type === 'SHOW_RECORD'), [], 'the outbox did not act on it');
      assert.equal((await h.browser.openPages()).length, tabs, 'no window was opened');
    }));
});
