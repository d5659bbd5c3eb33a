// Worker life: the persisted session binds writes after the worker is restarted, and
// FLUSH_QUEUEs asked for during a flush are coalesced into exactly one more flush.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { signInThroughUi, startHarness } from './harness.mjs';

let h;
before(async () => { h = await startHarness(); });
after(async () => { await h?.close(); });

/** A write from the page without the page's own expected-account header. */
function bareWrite(page, path, body) {
  return page.evaluate(async ([p, b]) => {
    const r = await fetch(p, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', 'X-CSRF-Token': window.demo.state.csrf ?? '' },
      body: JSON.stringify(b),
    });
    return { status: r.status, body: await r.json().catch(() => null) };
  }, [path, body]);
}

test('AUTH_SESSION survives a worker restart and binds the next queued write', async () => {
  try {
    await h.reset();
    const page = await h.openDemo();
    await signInThroughUi(page, 'alice');
    await page.waitForFunction(() => window.demo.sessionSynced === true);
    await h.stopWorkers(page);
    await h.setNetwork(false);
    const r = await bareWrite(page, '/api/projects/p1/tasks', { title: 'after restart' });
    assert.equal(r.status, 202, JSON.stringify(r));
    const state = await page.evaluate(() => window.demo.client.list());
    const rec = state.records.find((x) => x.id === r.body.id);
    assert.ok(rec, `record ${r.body.id} listed: ${JSON.stringify(state)}`);
    assert.equal(rec.ownerId, 'alice', 'bound to the persisted session, not unknown');
    assert.equal(rec.workspace, 'p1');
    await h.setNetwork(true);
    const flushed = await page.evaluate(() => window.demo.client.flush());
    assert.equal(flushed.ok, true, JSON.stringify(flushed));
    const applied = await h.applied();
    assert.equal(applied.length, 1);
    assert.equal(applied[0].key, r.body.idempotencyKey);
  } catch (err) {
    err.message += `\n${h.diagnostics()}`;
    throw err;
  }
});

test('FLUSH_QUEUEs during a flush run exactly one more flush, not one each', async () => {
  try {
    await h.reset();
    const page = await h.openDemo();
    await signInThroughUi(page, 'alice');
    await page.waitForFunction(() => window.demo.sessionSynced === true);
    await h.setNetwork(false);
    const n = 40;
    for (let i = 0; i < n; i += 1) {
      const r = await bareWrite(page, `/api/projects/p${i % 2}/tasks`, { title: `t${i}` });
      assert.equal(r.status, 202);
    }
    await h.setNetwork(true);
    const before = (await h.requests()).filter((r) => r.path === '/api/auth/me').length;
    const results = await page.evaluate(async () => {
      const c = window.demo.client;
      const first = c.flush();
      const more = [c.flush(), c.flush(), c.flush()];
      return Promise.all([first, ...more]);
    });
    for (const r of results) assert.equal(r.ok, true, JSON.stringify(results));
    assert.equal(results[0].affected, n, 'the first flush replays the whole queue');
    const identityChecks = (await h.requests()).filter((r) => r.path === '/api/auth/me').length - before;
    assert.equal(identityChecks, 2, 'one flush plus exactly one coalesced rerun');
    assert.equal((await h.applied()).length, n, 'each write applied once');
    const keys = new Set((await h.applied()).map((a) => a.key));
    assert.equal(keys.size, n);
  } catch (err) {
    err.message += `\n${h.diagnostics()}`;
    throw err;
  }
});
