// "Still running" is patience (contract 4.5, r4), against two third-party idempotency
// layers whose "still running" answer is a bare 409: express-idempotency (server.mjs: an
// HTML error page) and @node-idempotency/nestjs (nest-server.mjs: JSON, `Retry-After: 1`).
// The write's first attempt runs 8 s, then 30 s, on the server; the worker's attempt
// times out after 3 s (the test page's `attemptTimeoutMs`) and queues it. From then on
// the page does nothing: only the worker's own retries run (the offline probe, the
// backoff timer, Background Sync). They meet the running attempt and get 409s — more than
// `maxServerFailures` of them within seconds — and must keep waiting: the write is
// applied once, delivered, and never reported as needing a person (`conflict`).
import assert from 'node:assert/strict';
import { resolve } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { repoRoot } from '../e2e/harness.mjs';
import { eventually, withDiagnostics } from '../e2e/outbox-helpers.mjs';
import { startInteropHarness } from './harness.mjs';

const TASKS = '/api/projects/p1/tasks';
const SERVERS = [
  ['express-idempotency', resolve(repoRoot, 'tests/interop/server.mjs')],
  ['@node-idempotency/nestjs', resolve(repoRoot, 'tests/interop/nest-server.mjs')],
];

for (const [name, script] of SERVERS) {
  describe(`a slow first attempt on ${name}`, () => {
    let h;
    before(async () => { h = await startInteropHarness({ script }); });
    after(async () => { await h?.close(); });

    for (const heldMs of [8000, 30000]) {
      test(`held ${heldMs / 1000} s: the worker's own retries wait for it; applied once, never needs-attention`,
        { timeout: heldMs + 150000 }, withDiagnostics(() => h, async (t) => {
          let page = h.context.pages()[0];
          if (page && await page.evaluate(() => Boolean(window.interop?.client)).catch(() => false)) {
            assert.equal((await page.evaluate(() => window.interop.clearDevice())).ok, true);
          }
          await h.reset();
          page = await h.openPage(page);
          const signed = await page.evaluate(() => window.interop.signIn('alice'));
          assert.equal(signed.session?.ok, true, `AUTH_SESSION: ${JSON.stringify(signed)}`);
          const { attemptTimeoutMs } = await page.evaluate(() => window.interop.config);
          assert.ok(heldMs > attemptTimeoutMs * 2, 'the first attempt outlives the worker\'s timeout');

          await h.fault('slow', heldMs);
          const startedAt = Date.now();
          await page.evaluate(() => { window.interop.messages.length = 0; });
          const queued = await page.evaluate(() => window.interop.write('p1', 'slow first attempt'));
          assert.equal(queued.status, 202, `queued when the attempt timed out: ${JSON.stringify(queued)}`);
          const key = queued.body.idempotencyKey;

          // Nothing from the page from here on: the server and the page's passive inbox
          // are watched until the worker delivered the write.
          const answers = async () => (await h.requests())
            .filter((r) => r.path === TASKS && r.key === key).map((r) => r.status);
          await eventually(async () => (await answers()).some((s) => s >= 200 && s < 300 && s !== 202), {
            timeout: heldMs + 120000, interval: 500, what: 'a replay answered 2xx',
          });
          const elapsed = Date.now() - startedAt;
          const statuses = await answers();
          const conflicts = statuses.filter((s) => s === 409).length;
          assert.ok(conflicts >= 1,
            `the worker's own retries met the running first attempt: ${JSON.stringify(statuses)}`);
          assert.ok(elapsed >= heldMs, `delivered after the first attempt ended (${elapsed} ms)`);

          const applied = await h.applied();
          assert.equal(applied.length, 1, `applied exactly once: ${JSON.stringify(applied)}`);
          assert.equal(applied[0].key, key);
          const messages = await page.evaluate(() => window.interop.messages);
          const attention = messages
            .filter((m) => m.type === 'MUTATIONS_BLOCKED')
            .flatMap((m) => m.blocked)
            .filter((b) => b.id === queued.body.id);
          assert.deepEqual(attention, [],
            `never reported as needing a person (${conflicts} answers 409): ${JSON.stringify(messages)}`);
          await eventually(async () => (await page.evaluate(() => window.interop.messages))
            .some((m) => m.type === 'MUTATIONS_REPLAYED'), { timeout: 10000, what: 'MUTATIONS_REPLAYED' });
          const qs = await page.evaluate(() => window.interop.list());
          assert.deepEqual(qs.records, [], 'delivered and gone');
          t.diagnostic(`${name}, held ${heldMs} ms: ${conflicts} answers 409, delivered after ${elapsed} ms`);
        }));
    }
  });
}
