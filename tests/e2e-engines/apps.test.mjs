// Every engine: issue 28, apps as they are (contract r3, 2.3, 4.1, 5, 6), against the
// reference server, each case through a real failure the server makes (its fault rules,
// its network switch, its bearer tokens expiring) or the browser's own offline switch:
// - a bearer-token app (the server's `--auth bearer`: no cookie at all) queues offline,
//   its token expires, the page is asked (AUTH_NEEDED) and refreshes it, and the queue
//   replays once under the right account; the page's own Authorization passes through
//   on a first attempt and is never stored;
// - a worker restarted with persistAuthorization false asks before it replays; with
//   true it replays with the credential it kept (engines that can stop a worker);
// - MUTATION_SETTLED carries the created entity, to the windows of that account only;
// - offline (the browser's switch where it has one, else the server's connections
//   dropped) a person reads, edits and cancels their own writes; the edit of a queued
//   write whose first attempt went out is refused `may-have-been-applied`;
// - a record of no known owner is read and discarded without anything of it reaching
//   the server;
// - a gateway's 502 to a first attempt is queued (202, `background` as the engine can)
//   and replayed once; `queueStatuses: []` passes it to the page; a 503 the server's
//   ledger replays (`Idempotent-Replayed: true`) is passed to the page.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { lacks } from './engines.mjs';
import {
  apiCall, clearReports, eventually, flush, forEachEngine, freshStart, lastSeq, listQueue, openWith,
  queuedWrite, reports, send, sentWithKey, signIn, storedRecord, withDiagnostics,
} from './outbox-helpers.mjs';

const P1 = '/api/projects/p1/tasks';
const P2 = '/api/projects/p2/tasks';
const NOTES = '/api/notes';

/** The outbox's own requests in a requests log: identity checks, token refreshes, writes. */
const outboxRequests = (rs) => rs.filter((r) => r.path.startsWith('/api/auth/') || r.method !== 'GET');

/** The titles (tasks) or texts (notes) of the writes the server applied. */
const appliedTexts = async (h) => (await h.applied()).map((a) => {
  const b = JSON.parse(a.body || '{}');
  return b.title ?? b.text;
});

// ---------------------------------------------------------------- bearer tokens

forEachEngine((engine, harness) => {
  test('a bearer-token app queues offline, its token expires, the page is asked and refreshes it, and the queue replays once as its account',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await freshStart(h);
      await signIn(page, 'alice');
      const token = await page.evaluate(() => window.demo.state.auth?.accessToken);
      assert.equal(typeof token, 'string', 'signed in with a token, no cookie');
      // A first attempt carries the page's own Authorization as the page sent it.
      const online = await apiCall(page, 'POST', P1, { title: 'sent with the page token' });
      assert.equal(online.status, 201, JSON.stringify(online));

      await h.setNetwork(false);
      const a = await queuedWrite(page, P1, { title: 'queued a' });
      const b = await queuedWrite(page, P2, { title: 'queued b' });
      // The page's token went with the first attempt; it is never stored with the write.
      for (const w of [a, b]) {
        const stored = JSON.stringify(await storedRecord(page, w.id));
        assert.ok(!stored.includes(token) && !/authorization/i.test(stored), `stored without a credential: ${stored}`);
      }
      await h.control('expire-tokens', {});
      await clearReports(page);
      const seq = await lastSeq(h);
      await h.setNetwork(true);
      await page.evaluate(() => window.demo.client.flush().catch(() => null));
      await eventually(async () => {
        const keys = (await h.applied()).map((x) => x.key);
        return keys.includes(a.key) && keys.includes(b.key);
      }, { timeout: 30000, what: 'both replays after the refresh' });

      const asked = (await reports(page)).filter((m) => m.type === 'AUTH_NEEDED');
      assert.ok(asked.length >= 1, 'the page was asked for a credential');
      assert.deepEqual(asked[0], { type: 'AUTH_NEEDED', userId: 'alice' });
      const rs = outboxRequests((await h.requests()).filter((r) => r.seq > seq));
      const refresh = rs.findIndex((r) => r.path === '/api/auth/refresh' && r.status === 200);
      assert.ok(refresh >= 0, `the page refreshed its token: ${JSON.stringify(rs)}`);
      assert.ok(rs.slice(0, refresh).some((r) => r.path === '/api/auth/me' && r.status === 401),
        `the expired token was refused before: ${JSON.stringify(rs)}`);
      const replays = rs.filter((r) => r.key === a.key || r.key === b.key);
      assert.ok(replays.every((r) => r.seq > rs[refresh].seq), 'no replay went out before the new token');
      assert.deepEqual(replays.filter((r) => r.status === 201).map((r) => r.user).sort(), ['alice', 'alice']);
      const applied = await h.applied();
      for (const w of [a, b]) {
        assert.deepEqual(applied.filter((x) => x.key === w.key).map((x) => x.user), ['alice'], `${w.body.title}: once, as alice`);
      }
      assert.deepEqual(await listQueue(page), []);
    }));

  for (const persist of [false, true]) {
    test(`a worker restarted with persistAuthorization ${persist} ${persist ? 'replays with the credential it kept' : 'asks for the credential before it replays'}`,
      { skip: lacks(engine, 'stopWorkers') }, withDiagnostics(harness, async () => {
        const h = harness();
        const page = await openWith(h, { persistAuthorization: persist });
        await h.setNetwork(false);
        const w = await queuedWrite(page, P1, { title: `restarted, persist ${persist}` });
        await h.stopWorkers();
        await h.setNetwork(true);
        await clearReports(page);
        const seq = await lastSeq(h);
        // The command starts the worker again: its start flush and this one.
        await page.evaluate(() => window.demo.client.flush().catch(() => null));
        await eventually(async () => (await h.applied()).some((x) => x.key === w.key),
          { timeout: 30000, what: 'the replay after the restart' });
        const rs = outboxRequests((await h.requests()).filter((r) => r.seq > seq));
        const asked = (await reports(page)).filter((m) => m.type === 'AUTH_NEEDED');
        if (persist) {
          assert.equal(asked.length, 0, 'nothing to ask: the credential was kept');
          assert.ok(!rs.some((r) => r.path === '/api/auth/refresh'), JSON.stringify(rs));
        } else {
          assert.deepEqual(asked[0], { type: 'AUTH_NEEDED', userId: 'alice' });
          // Asked first: nothing of the outbox reached the server before the page's refresh.
          assert.equal(rs[0]?.path, '/api/auth/refresh', `the first request after the restart: ${JSON.stringify(rs)}`);
        }
        assert.ok(!rs.some((r) => r.status === 401), `never refused: ${JSON.stringify(rs)}`);
        assert.deepEqual((await h.applied()).filter((x) => x.key === w.key).map((x) => x.user), ['alice']);
      }));
  }
}, { name: 'bearer tokens', setup: () => ({ serverArgs: ['--auth', 'bearer'] }) });

// ---------------------------------------------------------------- cookie sessions

forEachEngine((engine, harness) => {
  test('MUTATION_SETTLED carries the created entity, to the windows of its account only',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await freshStart(h);
      await signIn(page, 'alice');
      // A second window whose last AUTH_SESSION was a sign-out: not alice's window.
      const other = await h.browser.newPage();
      try {
        await h.openDemo({ page: other });
        await other.waitForFunction(() => window.demo.sessionSynced === true, null, { timeout: 30000 });
        assert.equal((await send(other, { type: 'AUTH_SESSION', userId: null })).ok, true);
        assert.equal((await send(page, { type: 'AUTH_SESSION', userId: 'alice' })).ok, true);
        await h.setNetwork(false);
        const w = await queuedWrite(page, P1, { title: 'settled with its id' });
        await h.setNetwork(true);
        await clearReports(page);
        await clearReports(other);
        await flush(page);
        const settled = await eventually(async () => (await reports(page)).find((m) => m.type === 'MUTATION_SETTLED' && m.id === w.id),
          { what: 'MUTATION_SETTLED' });
        const { body, ...rest } = settled;
        assert.deepEqual(rest, {
          type: 'MUTATION_SETTLED', id: w.id, idempotencyKey: w.key, ownerId: 'alice', status: 201, contentType: 'application/json',
        });
        const entity = JSON.parse(body);
        const listed = await apiCall(page, 'GET', P1);
        assert.deepEqual(listed.body.tasks.map((t) => [t.id, t.title]), [[entity.id, 'settled with its id']],
          'the created task, its server id included');
        // The other window heard the flush, never what alice's write answered.
        await eventually(async () => (await reports(other)).some((m) => m.type === 'MUTATIONS_REPLAYED'),
          { what: 'the other window to get the flush report' });
        assert.deepEqual((await reports(other)).filter((m) => m.type === 'MUTATION_SETTLED'), []);
      } finally {
        await other.close();
      }
    }));

  test('offline, a person reads, edits and cancels their own writes; editing a queued write that went out is refused',
    withDiagnostics(harness, async () => {
      const h = harness();
      // The browser's own switch where it has one; else the server drops every connection.
      const offline = (on) => (lacks(engine, 'setOffline') ? h.setNetwork(!on) : h.setOffline(on));
      const page = await freshStart(h);
      await signIn(page, 'alice');
      await offline(true);
      try {
        const w1 = await queuedWrite(page, P1, { title: 'first, attempted' });
        const w2 = await queuedWrite(page, P1, { title: 'second, with a typo' });
        const w3 = await queuedWrite(page, P2, { title: 'to be cancelled' });
        assert.equal(typeof (await storedRecord(page, w1.id)).firstSentAt, 'number', 'the first went out');
        assert.equal((await storedRecord(page, w2.id)).firstSentAt, null, 'the second never left the worker');

        const read = await send(page, { type: 'READ_RECORD', id: w2.id, ownerId: 'alice' });
        assert.equal(read.type, 'RECORD', JSON.stringify(read));
        assert.deepEqual(JSON.parse(read.record.body), { title: 'second, with a typo' });
        assert.equal(read.record.sentBefore, false);
        const edited = await send(page, {
          type: 'RECOVER_RECORD', id: w2.id, ownerId: 'alice', action: 'edit', body: JSON.stringify({ title: 'second, fixed' }),
        });
        assert.deepEqual([edited.ok, edited.affected], [true, 1], JSON.stringify(edited));
        const refused = await send(page, {
          type: 'RECOVER_RECORD', id: w1.id, ownerId: 'alice', action: 'edit', body: JSON.stringify({ title: 'twice?' }),
        });
        assert.deepEqual([refused.ok, refused.reason], [false, 'may-have-been-applied'], JSON.stringify(refused));
        await clearReports(page);
        const cancelled = await send(page, { type: 'RECOVER_RECORD', id: w3.id, ownerId: 'alice', action: 'discard' });
        assert.deepEqual([cancelled.ok, cancelled.affected], [true, 1], JSON.stringify(cancelled));
        const report = await eventually(async () => (await reports(page)).find((m) => m.type === 'MUTATIONS_PARTIAL'),
          { what: 'a report after the cancel' });
        assert.equal(report.remaining, 2, JSON.stringify(report));
        assert.deepEqual((await listQueue(page)).map((r) => r.id), [w1.id, w2.id]);
      } finally {
        await offline(false);
      }
      await flush(page);
      await eventually(async () => (await h.applied()).length >= 2, { what: 'the two writes left' });
      assert.deepEqual(await appliedTexts(h), ['first, attempted', 'second, fixed'], 'the edit once, the cancelled write never');
      assert.deepEqual(await listQueue(page), []);

      // The last write cancelled offline: its flush stops before it can report, and a
      // report follows all the same (the queue is empty), so every window drops it.
      await offline(true);
      try {
        const last = await queuedWrite(page, NOTES, { text: 'cancelled, the queue then empty' });
        await clearReports(page);
        const cancelled = await send(page, { type: 'RECOVER_RECORD', id: last.id, ownerId: 'alice', action: 'discard' });
        assert.deepEqual([cancelled.ok, cancelled.affected], [true, 1], JSON.stringify(cancelled));
        const report = await eventually(async () => (await reports(page)).find((m) => m.type === 'MUTATIONS_REPLAYED'),
          { timeout: 10000, what: 'a report after the last write was cancelled' });
        assert.deepEqual(report, { type: 'MUTATIONS_REPLAYED', count: 0 });
      } finally {
        await offline(false);
      }
      await flush(page);
      assert.equal((await h.applied()).length, 2, 'the cancelled write never sent');
    }));

  test('a record of no known owner is read and discarded by the signed-in account, nothing of it reaching the server',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await freshStart(h);
      await h.setNetwork(false);
      // Signed out: no owner. The first write's attempt tells the worker the network is
      // down; the second is queued without one, so nothing of it ever left the browser.
      const first = await queuedWrite(page, NOTES, { text: 'written signed out, attempted' });
      const w = await queuedWrite(page, NOTES, { text: 'written signed out' });
      assert.equal((await storedRecord(page, w.id)).firstSentAt, null);
      await h.setNetwork(true);
      await signIn(page, 'alice');
      assert.deepEqual((await listQueue(page)).map((r) => [r.id, r.ownerId]), [[first.id, null], [w.id, null]]);
      const seq = await lastSeq(h);
      // Offline, the persisted session stands in for the server; online, /auth/me is all.
      await h.setNetwork(false);
      const read = await send(page, { type: 'READ_RECORD', id: w.id, ownerId: 'alice' });
      assert.equal(read.type, 'RECORD', JSON.stringify(read));
      assert.deepEqual(JSON.parse(read.record.body), { text: 'written signed out' });
      await h.setNetwork(true);
      for (const r of [w, first]) {
        const gone = await send(page, { type: 'RECOVER_RECORD', id: r.id, ownerId: 'alice', action: 'discard' });
        assert.deepEqual([gone.ok, gone.affected], [true, 1], JSON.stringify(gone));
      }
      assert.deepEqual(await listQueue(page), []);
      const rs = outboxRequests((await h.requests()).filter((r) => r.seq > seq));
      assert.deepEqual([...new Set(rs.map((r) => `${r.method} ${r.path}`))], ['GET /api/auth/me'], JSON.stringify(rs));
      assert.deepEqual(await sentWithKey(h, w.key), [], 'the write itself never reached the server');
      assert.deepEqual(await h.applied(), []);
    }));

  test('a gateway\'s 502 to a first attempt is queued and replayed once; queueStatuses [] passes it to the page',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await freshStart(h);
      await signIn(page, 'alice');
      await clearReports(page);
      const gateway = '<html><body><h1>502 Bad Gateway</h1><p>nginx</p></body></html>';
      await h.control('faults', { rules: [{ path: P1, method: 'POST', kind: 'status', status: 502, times: 1, body: gateway, contentType: 'text/html' }] });
      const w = await queuedWrite(page, P1, { title: 'through a gateway restart' });
      // Whether it can be delivered with no page open: Background Sync (Chromium only).
      assert.equal(w.background, !lacks(engine, 'backgroundSync'), JSON.stringify(w));
      const queued = await eventually(async () => (await reports(page)).find((m) => m.type === 'MUTATION_QUEUED' && m.id === w.id));
      assert.equal(queued.background, w.background);
      // (Chromium's Background Sync may have replayed it already: the wire log below
      // shows the attempt and the replay either way.)
      const stored = await storedRecord(page, w.id);
      if (stored) assert.equal(typeof stored.firstSentAt, 'number', 'it reached something: the key window applies');
      await flush(page);
      await eventually(async () => (await h.applied()).some((a) => a.key === w.key), { what: 'the replay' });
      assert.deepEqual((await sentWithKey(h, w.key)).map((r) => r.status), [502, 201], 'one attempt, one replay');
      assert.equal((await h.applied()).length, 1);

      const passing = await openWith(h, { queueStatuses: [] });
      await h.control('faults', { rules: [{ path: P1, method: 'POST', kind: 'status', status: 502, times: 1, body: gateway, contentType: 'text/html' }] });
      const r = await apiCall(passing, 'POST', P1, { title: 'the page decides' });
      assert.equal(r.status, 502, JSON.stringify(r));
      assert.deepEqual(await listQueue(passing), []);
    }));

  test('a 503 the server\'s ledger replays (Idempotent-Replayed: true) is passed to the page, not queued',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await freshStart(h);
      await signIn(page, 'alice');
      // The same write, under the same key, made earlier by another client of alice's
      // (a session of her own, outside this browser) whose answer the ledger stored: 503.
      const login = await fetch(`${h.baseUrl}/api/auth/login`, {
        method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ userId: 'alice', password: 'alice' }),
      });
      const cookie = login.headers.get('set-cookie').split(';')[0];
      const { csrfToken } = await login.json();
      const key = `app-key-${Date.now()}`;
      const body = JSON.stringify({ title: 'stored as failed' });
      await h.control('faults', { rules: [{ path: P1, method: 'POST', kind: 'stored-status', status: 503, detail: 'database_down', times: 1 }] });
      const before = await fetch(`${h.baseUrl}${P1}`, {
        method: 'POST', body,
        headers: { 'Content-Type': 'application/json', Cookie: cookie, 'X-CSRF-Token': csrfToken, 'Idempotency-Key': key },
      });
      assert.equal(before.status, 503);
      await h.control('faults', { rules: [] });
      const r = await page.evaluate(async ([k, b]) => {
        const res = await fetch('/api/projects/p1/tasks', {
          method: 'POST', body: b,
          headers: {
            'Content-Type': 'application/json', 'Idempotency-Key': k,
            'X-CSRF-Token': window.demo.state.csrf, 'X-PM-Expected-Account': 'alice',
          },
        });
        return { status: res.status, replayed: res.headers.get('Idempotent-Replayed'), body: await res.json() };
      }, [key, body]);
      assert.deepEqual(r, { status: 503, replayed: 'true', body: { detail: 'database_down' } });
      assert.deepEqual(await listQueue(page), [], 'not queued: every resend of this key gets the same answer');
      assert.deepEqual(await h.applied(), []);
    }));
});
