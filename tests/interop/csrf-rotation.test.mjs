// The CSRF re-check is once per record, not once per flush (contract 4.5, r4): against a
// server that rotates its CSRF token after every write (server.mjs's `rotate` mode: the
// token a replay carries is spent by the write before it), each record of one flush meets
// a 403 with the token the flush read, earns its own re-check (a fresh /auth/me, a fresh
// token) and is delivered — none is left `rejected`.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { eventually, withDiagnostics } from '../e2e/outbox-helpers.mjs';
import { startInteropHarness } from './harness.mjs';

const TASKS = '/api/projects/p1/tasks';

let h;
before(async () => { h = await startInteropHarness(); });
after(async () => { await h?.close(); });

test('a token rotated per request: every record of a flush gets its fresh token and is applied once',
  { timeout: 120000 }, withDiagnostics(() => h, async () => {
    await h.reset();
    const page = await h.openPage();
    await h.csrfMode('rotate');
    const signed = await page.evaluate(() => window.interop.signIn('alice'));
    assert.equal(signed.session?.ok, true, `AUTH_SESSION: ${JSON.stringify(signed)}`);

    // Offline (the server drops connections): three writes of one workspace queue in order.
    await h.setNetwork(false);
    const titles = ['first', 'second', 'third'];
    const queued = [];
    for (const t of titles) {
      const r = await page.evaluate((title) => window.interop.write('p1', title), t);
      assert.equal(r.status, 202, `queued offline: ${JSON.stringify(r)}`);
      queued.push(r.body);
    }
    await h.setNetwork(true);
    const r = await page.evaluate(() => window.interop.flush());
    assert.equal(r.ok, true, JSON.stringify(r));

    await eventually(async () => (await h.applied()).length === 3 && (await page.evaluate(() => window.interop.list())).records.length === 0,
      { timeout: 60000, interval: 250, what: 'the three writes applied and the queue empty' });
    const applied = await h.applied();
    assert.deepEqual(applied.map((a) => a.title), titles, `each applied once, in order: ${JSON.stringify(applied)}`);
    assert.deepEqual(applied.map((a) => a.key), queued.map((q) => q.idempotencyKey));
    const replays = (await h.requests()).filter((q) => q.path === TASKS && q.status !== null);
    const refused = replays.filter((q) => q.status === 403).length;
    assert.ok(refused >= 2,
      `the rotated token was refused (403) for the later records, and each was re-checked: ${JSON.stringify(replays)}`);
    const blocked = (await page.evaluate(() => window.interop.messages))
      .filter((m) => m.type === 'MUTATIONS_BLOCKED').flatMap((m) => m.blocked);
    assert.deepEqual(blocked, [], 'no record was reported needing a person');
  }));
