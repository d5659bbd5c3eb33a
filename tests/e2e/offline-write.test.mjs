// Walking skeleton: a write made while the server is unreachable is queued by the worker
// (202 with its key), and one FLUSH_QUEUE later it is applied exactly once, under the
// account that made it, with the key the 202 named.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { signInThroughUi, startHarness } from './harness.mjs';

let h;
before(async () => { h = await startHarness(); });
after(async () => { await h?.close(); });

test('an offline write is queued, then replayed exactly once under its account', async () => {
  try {
    const page = await h.openDemo();
    await signInThroughUi(page, 'alice');
    await page.waitForFunction(() => window.demo.sessionSynced === true);

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
  } catch (err) {
    err.message += `\n${h.diagnostics()}`;
    throw err;
  }
});
