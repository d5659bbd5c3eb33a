// Every engine: recovery commands (contract section 6) — REBIND_RECORDS adopts a record queued
// while signed out, only after the server confirms the account; RECOVER_RECORD retries a
// needs-attention record under a new key or discards it; the same through the demo's
// outbox panel, clicked as a user would; and the commands' refusals (another account's
// records, malformed messages).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  clearReports, forEachEngine, eventually, flush, freshStart, lastSeq, listQueue, queuedWrite, reconnectAs, reports, signIn,
  signOutThroughUi, waitForFlushReports, withDiagnostics, writesIn,
} from './outbox-helpers.mjs';

forEachEngine((engine, harness) => {
  const P = (pid) => `/api/projects/${pid}/tasks`;

  test('a record queued while signed out is blocked unknown-owner, then adopted and applied once under alice', withDiagnostics(harness, async () => {
    const h = harness();
    const page = await freshStart(h);
    await h.setNetwork(false);
    const q = await queuedWrite(page, P('p1'), { title: 'written while signed out' });
    assert.deepEqual((await listQueue(page)).map((r) => [r.id, r.ownerId]), [[q.id, null]], 'queued with no owner');

    await h.setNetwork(true);
    const queuedAt = await lastSeq(h);
    await clearReports(page);
    await signIn(page, 'alice'); // its flush reports the record, sends nothing
    const { blocked } = await waitForFlushReports(page);
    assert.deepEqual(blocked?.blocked.map((b) => [b.id, b.reason]), [[q.id, 'unknown-owner']]);
    assert.deepEqual(await h.applied(), []);

    // The identity check: adopting for an account that is not the signed-in one is refused.
    const asBob = await page.evaluate(() => window.demo.client.adopt('bob'));
    assert.equal(asBob.command, 'REBIND_RECORDS');
    assert.equal(asBob.ok, false, `REBIND for bob while alice is signed in: ${JSON.stringify(asBob)}`);
    assert.equal(typeof asBob.reason, 'string');
    const meChecks = (await h.requests()).filter((r) => r.seq > queuedAt && r.method === 'GET' && r.path === '/api/auth/me' && r.expectedAccount === 'bob');
    assert.deepEqual(meChecks.map((r) => [r.user, r.status]), [['alice', 409]],
      'the refusal rests on a fresh /api/auth/me naming bob, which the server answered 409');
    assert.deepEqual((await listQueue(page)).map((r) => [r.id, r.ownerId]), [[q.id, null]], 'nothing changed');

    const adopted = await page.evaluate(() => window.demo.client.adopt('alice'));
    assert.equal(adopted.ok, true, JSON.stringify(adopted));
    assert.equal(adopted.affected, 1);
    const applied = await eventually(async () => { const a = await h.applied(); return a.length ? a : null; },
      { what: 'the adopted record to be applied' });
    assert.deepEqual(applied.map((a) => [a.user, a.key, a.path]), [['alice', q.key, P('p1')]], 'applied with the key its 202 named');
    await eventually(async () => (await listQueue(page)).length === 0, { what: 'the queue to be empty' });
    const sent = writesIn(await h.requests(), queuedAt).filter((r) => r.key === q.key);
    assert.deepEqual(sent.map((r) => [r.expectedAccount, r.status]), [['alice', 201]], 'replayed once, as alice');
  }));

  test('needs-attention records: retry-new applies under a new key, discard removes without sending', withDiagnostics(harness, async () => {
    const h = harness();
    const page = await freshStart(h);
    await signIn(page, 'alice');
    await h.setNetwork(false);
    const x = await queuedWrite(page, P('p1'), { title: 'retry me' });
    const y = await queuedWrite(page, P('p2'), { title: 'discard me' });
    await h.control('faults', {
      rules: [
        { path: P('p1'), method: 'POST', kind: 'outcome-unknown', times: 1 },
        { path: P('p2'), method: 'POST', kind: 'outcome-unknown', times: 1 },
      ],
    });
    await clearReports(page);
    await h.setNetwork(true);
    const r = await flush(page);
    assert.equal(r.ok, true, JSON.stringify(r));
    assert.equal(r.affected, 0);
    const { blocked } = await waitForFlushReports(page);
    assert.deepEqual(blocked?.blocked.map((b) => [b.id, b.reason]).sort((p, q) => p[0] - q[0]),
      [[x.id, 'outcome-unknown'], [y.id, 'outcome-unknown']]);
    assert.deepEqual((await listQueue(page)).map((q) => [q.id, q.state, q.attentionReason]),
      [[x.id, 'needs-attention', 'outcome-unknown'], [y.id, 'needs-attention', 'outcome-unknown']]);
    assert.deepEqual(await h.applied(), []);

    // Only a needs-attention record of the signed-in owner can be recovered.
    const asBob = await page.evaluate((id) => window.demo.client.retry(id, 'bob'), x.id);
    assert.equal(asBob.ok, false, `retry as bob: ${JSON.stringify(asBob)}`);
    const gone = await page.evaluate(() => window.demo.client.discard(999999, 'alice'));
    assert.equal(gone.ok, false, `discard of a record that does not exist: ${JSON.stringify(gone)}`);

    const since = await lastSeq(h);
    const retried = await page.evaluate((id) => window.demo.client.retry(id, 'alice'), x.id);
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

    const discarded = await page.evaluate((id) => window.demo.client.discard(id, 'alice'), y.id);
    assert.deepEqual([discarded.command, discarded.ok, discarded.affected], ['RECOVER_RECORD', true, 1], JSON.stringify(discarded));
    await flush(page);
    assert.deepEqual(await listQueue(page), [], 'both records are gone from the queue');
    assert.equal((await h.applied()).length, 1, 'the discarded record was never applied');
    assert.ok(!writesIn(await h.requests(), since).some((s) => s.path === P('p2')), 'the discarded record was not sent');
  }));

  test('a record queued while signed out is adopted from the panel and applied once under alice', withDiagnostics(harness, async () => {
    const h = harness();
    const page = await freshStart(h);
    await h.setNetwork(false);
    const q = await queuedWrite(page, P('p1'), { title: 'written while signed out' });
    assert.deepEqual((await listQueue(page)).map((r) => [r.id, r.ownerId]), [[q.id, null]], 'queued with no owner');

    await h.setNetwork(true);
    const queuedAt = await lastSeq(h); // the first attempt (dropped) is in the log before this
    await clearReports(page);
    await signIn(page, 'alice'); // its flush reports the record as unknown-owner, sends nothing
    // A sync flush started while signed out (no-session) may report after the clear: the
    // sign-in flush's report is the one that is not no-session.
    const blocked = await eventually(async () => (await reports(page))
      .filter((m) => m.type === 'MUTATIONS_BLOCKED')
      .find((m) => m.blocked.length && m.blocked.every((b) => b.reason !== 'no-session')),
    { what: 'the sign-in flush\'s report' });
    assert.deepEqual(blocked.blocked.map((b) => [b.id, b.reason]), [[q.id, 'unknown-owner']]);
    assert.deepEqual(await h.applied(), []);

    const row = page.getByTestId(`record-${q.id}`);
    await row.and(page.locator('[data-reason="unknown-owner"]')).waitFor();
    await page.getByTestId(`reason-${q.id}`).filter({ hasText: 'queued while signed out' }).waitFor();
    const adopt = page.getByTestId(`adopt-${q.id}`);
    await adopt.waitFor();
    assert.match(await adopt.textContent(), /alice/);
    await adopt.click();

    const applied = await eventually(async () => { const a = await h.applied(); return a.length ? a : null; }, { what: 'the adopted record to be applied' });
    await row.waitFor({ state: 'detached' });
    await page.getByTestId('outbox-count').filter({ hasText: /^0$/ }).waitFor();
    assert.equal(applied.length, 1, JSON.stringify(applied));
    assert.equal(applied[0].user, 'alice');
    assert.equal(applied[0].key, q.key, 'applied with the key its 202 named');
    assert.equal(applied[0].path, P('p1'));
    assert.deepEqual(await listQueue(page), []);
    const sent = writesIn(await h.requests(), queuedAt).filter((r) => r.key === q.key);
    assert.deepEqual(sent.map((r) => [r.expectedAccount, r.status]), [['alice', 201]], 'replayed once, as alice');
  }));

  test('outcome-unknown records: "Retry as new" applies with a new key, "Discard" removes without applying', withDiagnostics(harness, async () => {
    const h = harness();
    const page = await freshStart(h);
    await signIn(page, 'alice');
    await h.setNetwork(false);
    const x = await queuedWrite(page, P('p1'), { title: 'retry me' });
    const y = await queuedWrite(page, P('p2'), { title: 'discard me' });
    await h.control('faults', {
      rules: [
        { path: P('p1'), method: 'POST', kind: 'outcome-unknown', times: 1 },
        { path: P('p2'), method: 'POST', kind: 'outcome-unknown', times: 1 },
      ],
    });
    await clearReports(page);
    await h.setNetwork(true);
    await page.getByTestId('outbox-flush').click(); // "Send now"
    const { blocked } = await waitForFlushReports(page);
    assert.deepEqual(blocked?.blocked.map((b) => [b.id, b.reason]).sort(), [[x.id, 'outcome-unknown'], [y.id, 'outcome-unknown']]);
    assert.deepEqual(await h.applied(), []);

    for (const r of [x, y]) {
      await page.getByTestId(`record-${r.id}`).and(page.locator('[data-state="needs-attention"]')).waitFor();
      await page.getByTestId(`reason-${r.id}`).filter({ hasText: 'may or may not have applied' }).waitFor();
    }

    const since = await lastSeq(h);
    await page.getByTestId(`retry-${x.id}`).click();
    const applied = await eventually(async () => { const a = await h.applied(); return a.length ? a : null; }, { what: 'the retried record to be applied' });
    await page.getByTestId(`record-${x.id}`).waitFor({ state: 'detached' });
    assert.equal(applied.length, 1, JSON.stringify(applied));
    assert.equal(applied[0].path, P('p1'));
    assert.equal(applied[0].user, 'alice');
    assert.match(applied[0].key ?? '', /^[A-Za-z0-9_-]{22,64}$/);
    assert.notEqual(applied[0].key, x.key, 'retried under a NEW idempotency key');
    assert.deepEqual(JSON.parse(applied[0].body), { title: 'retry me' });
    assert.ok(!writesIn(await h.requests(), since).some((r) => r.key === x.key), 'the old key is not sent again');

    await page.getByTestId(`discard-${y.id}`).click();
    await page.getByTestId(`record-${y.id}`).waitFor({ state: 'detached' });
    await page.getByTestId('outbox-count').filter({ hasText: /^0$/ }).waitFor();
    assert.deepEqual(await listQueue(page), [], 'LIST_QUEUE is empty');
    assert.equal((await h.applied()).length, 1, 'the discarded record was never applied');
    assert.ok(!writesIn(await h.requests(), since).some((r) => r.path === P('p2')), 'the discarded record was not sent');
  }));

  test('adoption never takes another account\'s record', withDiagnostics(harness, async () => {
    const h = harness();
    const page = await freshStart(h);
    await signIn(page, 'bob');
    await h.setNetwork(false);
    const bobs = await queuedWrite(page, P('p1'), { title: 'bob\'s' });
    await signOutThroughUi(page);
    const nobodys = await queuedWrite(page, P('p2'), { title: 'nobody\'s' });
    await reconnectAs(h, page, 'alice');
    const queuedAt = await lastSeq(h); // the first attempts (dropped) are in the log before this
    await signIn(page, 'alice');

    const adopted = await page.evaluate(() => window.demo.client.adopt('alice'));
    assert.equal(adopted.type, 'COMMAND_RESULT');
    assert.equal(adopted.command, 'REBIND_RECORDS');
    assert.equal(adopted.ok, true, JSON.stringify(adopted));
    assert.equal(adopted.affected, 1, `only the unknown-owner record is adopted: ${JSON.stringify(adopted)}`);

    const named = await page.evaluate((id) => window.demo.client.adopt('alice', [id]), bobs.id);
    assert.equal(named.ok, true, JSON.stringify(named));
    assert.equal(named.affected, 0, 'naming bob\'s record does not adopt it');

    const asBob = await page.evaluate(() => window.demo.client.adopt('bob'));
    assert.equal(asBob.command, 'REBIND_RECORDS');
    assert.equal(asBob.ok, false, `REBIND for bob while alice is signed in must be refused: ${JSON.stringify(asBob)}`);
    assert.equal(typeof asBob.reason, 'string');
    const meChecks = (await h.requests()).filter((r) => r.method === 'GET' && r.path === '/api/auth/me' && r.expectedAccount === 'bob');
    assert.deepEqual(meChecks.map((r) => [r.user, r.status]), [['alice', 409]],
      'the refusal rests on a fresh /api/auth/me naming bob, which the server answered 409');

    const recoverBobs = await page.evaluate((id) => window.demo.client.discard(id, 'alice'), bobs.id);
    assert.equal(recoverBobs.ok, false, `alice cannot discard bob's record: ${JSON.stringify(recoverBobs)}`);

    // The adoption's flush sent the adopted record; bob's stays his, unsent.
    await eventually(async () => (await h.applied()).length === 1, { what: 'the adopted record to be applied' });
    await flush(page);
    const applied = await h.applied();
    assert.deepEqual(applied.map((a) => [a.user, a.key]), [['alice', nobodys.key]], JSON.stringify(applied));
    assert.ok(!writesIn(await h.requests(), queuedAt).some((r) => r.key === bobs.key), 'bob\'s record was never replayed');
    assert.deepEqual((await listQueue(page)).map((r) => [r.id, r.ownerId, r.state]), [[bobs.id, 'bob', 'queued']]);
    // The panel shows another account's records only counted (recovery-edit), never as a
    // row of its own; there is nothing of bob's to adopt.
    await page.getByTestId('other-accounts').filter({ hasText: /1 unsent change of another account/ }).waitFor();
    assert.equal(await page.getByTestId(`record-${bobs.id}`).count(), 0, 'no row for bob\'s record on alice\'s screen');
    assert.equal(await page.getByTestId(`adopt-${bobs.id}`).count(), 0, 'the panel offers no Adopt for bob\'s record');
  }));

  test('malformed commands are refused with a reason naming the field, and change nothing', withDiagnostics(harness, async () => {
    const h = harness();
    const page = await freshStart(h);
    await signIn(page, 'alice');
    await h.setNetwork(false);
    const q = await queuedWrite(page, P('p1'), { title: 'kept' });
    // The network stays down until the queue is compared: otherwise a trigger of the
    // worker's own (its probe, the retry timer, `online`) may deliver `q` meanwhile (seen
    // in Firefox in CI), and the queue would change for a reason that is not a command.
    const before = await listQueue(page);

    const cases = [
      [{ type: 'RECOVER_RECORD', id: 'x', ownerId: 'alice', action: 'discard' }, 'RECOVER_RECORD', /\bid\b/],
      [{ type: 'RECOVER_RECORD', ownerId: 'alice', action: 'discard' }, 'RECOVER_RECORD', /\bid\b/],
      [{ type: 'RECOVER_RECORD', id: q.id, ownerId: 'alice', action: 'explode' }, 'RECOVER_RECORD', /\baction\b/],
      [{ type: 'RECOVER_RECORD', id: q.id, action: 'discard' }, 'RECOVER_RECORD', /\bownerId\b/],
      [{ type: 'RECOVER_RECORD', id: q.id, ownerId: 7, action: 'discard' }, 'RECOVER_RECORD', /\bownerId\b/],
      [{ type: 'REBIND_RECORDS' }, 'REBIND_RECORDS', /\bownerId\b/],
      [{ type: 'REBIND_RECORDS', ownerId: 'alice', ids: 'all' }, 'REBIND_RECORDS', /\bids\b/],
      [{ type: 'REBIND_RECORDS', ownerId: 'alice', ids: [1, 'two'] }, 'REBIND_RECORDS', /\bids\b/],
      [{ type: 'AUTH_SESSION' }, 'AUTH_SESSION', /\buserId\b/],
      [{ type: 'AUTH_SESSION', userId: 5 }, 'AUTH_SESSION', /\buserId\b/],
      [{ type: 'FLUSH_EVERYTHING' }, 'FLUSH_EVERYTHING', /\btype\b/],
      [{ type: 42 }, 42, /\btype\b/],
      [{ kind: 'FLUSH_QUEUE' }, null, /\btype\b/],
    ];
    for (const [message, command, field] of cases) {
      const r = await page.evaluate((m) => window.demo.client.send(m, { timeoutMs: 10000 }), message);
      const what = `${JSON.stringify(message)} → ${JSON.stringify(r)}`;
      assert.equal(r.type, 'COMMAND_RESULT', what);
      assert.equal(r.ok, false, what);
      if (command === 42) assert.ok(r.command === 42 || r.command === null, `command echoes the non-string type or is null: ${what}`);
      else assert.equal(r.command, command, `command holds the type as sent: ${what}`);
      assert.equal(typeof r.reason, 'string', what);
      assert.match(r.reason, field, `the reason names the field: ${what}`);
    }

    assert.deepEqual(await listQueue(page), before, 'the queue is unchanged');
    // The refused AUTH_SESSION changed nothing: the next write is still bound to alice.
    const next = await page.evaluate(() => fetch('/api/notes', {
      method: 'POST', headers: { 'Content-Type': 'application/json', 'X-CSRF-Token': window.demo.state.csrf },
      body: JSON.stringify({ text: 'no expected-account header: the worker binds it' }),
    }).then((r) => r.json()));
    await h.setNetwork(true);
    assert.equal(next.queued, true, JSON.stringify(next));
    const rec = (await listQueue(page)).find((r) => r.id === next.id);
    assert.equal(rec?.ownerId, 'alice', `the session is still alice: ${JSON.stringify(rec)}`);
  }));
});
