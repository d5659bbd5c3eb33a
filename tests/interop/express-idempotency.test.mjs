// End to end against a third-party idempotency middleware: the outbox worker in Chromium,
// the Express app of server.mjs using express-idempotency 1.0.6 (npm) as its README says.
// Each case asserts the server's ground truth (/__control/applied: what the route really
// ran) and the requests log (what the middleware answered). The middleware's answers are
// listed, with where in its source they come from, in tests/interop/README.md.
//
// An automatic flush (Background Sync, which Chromium may fire as soon as a write is
// queued) can replay a record before the test's own FLUSH_QUEUE does; the assertions are
// therefore on what the server applied and answered and on the queue afterwards, never on
// which flush did the work.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, before, test } from 'node:test';
import { eventually, withDiagnostics } from '../e2e/outbox-helpers.mjs';
import { startInteropHarness } from './harness.mjs';

const UUID_V4 = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/i;
const TASKS = '/api/projects/p1/tasks';
// A first attempt held this long is still running when the test replays it: the test ends
// the wait itself (/__control/release), so nothing depends on how long anything takes.
const HELD_MS = 120000;
const TIMEOUT = { timeout: 180000 };

let h;
before(async () => { h = await startInteropHarness(); });
after(async () => { await h?.close(); });

const run = (fn) => withDiagnostics(() => h, fn);

/** Queue and session cleared in the worker, the server reset, the page reloaded and signed in as alice. */
async function freshStart() {
  let page = h.context.pages()[0];
  if (page && await page.evaluate(() => Boolean(window.interop?.client)).catch(() => false)) {
    const cleared = await page.evaluate(() => window.interop.clearDevice());
    assert.equal(cleared.ok, true, `CLEAR_DEVICE refused: ${JSON.stringify(cleared)}`);
  }
  await h.reset();
  page = await h.openPage(page);
  const signed = await page.evaluate(() => window.interop.signIn('alice'));
  assert.equal(signed.status, 200, `sign-in: ${JSON.stringify(signed)}`);
  assert.equal(signed.session?.ok, true, `AUTH_SESSION: ${JSON.stringify(signed.session)}`);
  assert.deepEqual(await listQueue(page), [], 'a fresh start has an empty queue');
  return page;
}

/** One task write from the page; `headers` are the page's own extra headers. */
function write(page, title, headers = {}) {
  return page.evaluate(([t, hs]) => window.interop.write('p1', t, hs), [title, headers]);
}

/** Asserts the worker queued the write (202) and returns the 202's body. */
function assertQueued(r, what) {
  assert.equal(r.status, 202, `${what} should have been queued: ${JSON.stringify(r)}`);
  assert.equal(r.body?.queued, true, `${what}: ${JSON.stringify(r)}`);
  assert.equal(typeof r.body.id, 'number', `${what}: ${JSON.stringify(r)}`);
  assert.equal(typeof r.body.idempotencyKey, 'string', `${what}: ${JSON.stringify(r)}`);
  return r.body;
}

async function listQueue(page) {
  const qs = await page.evaluate(() => window.interop.list());
  assert.equal(qs.type, 'QUEUE_STATE', `LIST_QUEUE answered ${JSON.stringify(qs)}`);
  return qs.records;
}

async function flush(page) {
  const r = await page.evaluate(() => window.interop.flush());
  assert.equal(r.type, 'COMMAND_RESULT', JSON.stringify(r));
  assert.equal(r.command, 'FLUSH_QUEUE', JSON.stringify(r));
  assert.equal(r.ok, true, `FLUSH_QUEUE refused: ${JSON.stringify(r)}`);
  return r;
}

/** The statuses the server answered to the task writes carrying `key`, in arrival order
 * (null: the connection was dropped before an answer). */
async function statusesFor(key) {
  return (await h.requests()).filter((r) => r.path === TASKS && r.key === key).map((r) => r.status);
}

/** Asserts the server applied exactly one write, under `key`, with `title`. */
async function assertAppliedOnce(key, title) {
  const applied = await h.applied();
  assert.equal(applied.length, 1, `applied exactly once: ${JSON.stringify(applied)}`);
  assert.equal(applied[0].key, key, `applied under the record's key: ${JSON.stringify(applied)}`);
  assert.equal(applied[0].account, 'alice');
  assert.equal(applied[0].pid, 'p1');
  assert.equal(applied[0].title, title);
  assert.equal(applied[0].body, JSON.stringify({ title }), 'the exact body the page sent');
}

test('1. an online write passes through: the 201 reaches the page, applied once under the minted key', TIMEOUT, run(async () => {
  const page = await freshStart();
  const r = await write(page, 'online write');
  assert.equal(r.status, 201, `the server's answer passes through: ${JSON.stringify(r)}`);
  assert.equal(r.body.title, 'online write');
  assert.equal(r.body.owner, 'alice');
  // express-idempotency echoes the key it was given on every keyed answer.
  const key = r.headers['idempotency-key'];
  assert.match(key ?? '', UUID_V4, `the worker minted a UUID v4 key: ${JSON.stringify(r.headers)}`);
  await assertAppliedOnce(key, 'online write');
  assert.deepEqual(await statusesFor(key), [201]);
  assert.deepEqual(await listQueue(page), [], 'nothing queued');
}));

test('2. lost response: applied, answer dropped → 202 queued → replay gets the stored 201, applied exactly once', TIMEOUT, run(async () => {
  const page = await freshStart();
  await h.fault('drop-after-apply');
  const queued = assertQueued(await write(page, 'lost answer'), 'a write whose answer was lost');
  const key = queued.idempotencyKey;
  await assertAppliedOnce(key, 'lost answer');

  await flush(page);
  assert.deepEqual(await listQueue(page), [], 'the record is delivered and gone');
  await assertAppliedOnce(key, 'lost answer');
  assert.deepEqual(await statusesFor(key), [null, 201],
    'the first attempt lost its answer, the replay got the middleware\'s stored 201 (the route did not run again)');
}));

test('3. a replay that meets the first attempt still running (bare HTML 409) waits, then applies once', TIMEOUT, run(async () => {
  const page = await freshStart();
  const { attemptTimeoutMs } = await page.evaluate(() => window.interop.config);
  assert.ok(HELD_MS > attemptTimeoutMs * 10, 'the first attempt is held far past the worker\'s timeout');
  await h.fault('slow', HELD_MS);
  const queued = assertQueued(await write(page, 'slow first attempt'), 'a write whose first attempt timed out');
  const key = queued.idempotencyKey;
  assert.equal(await h.running(), 1, 'the first attempt still runs on the server');
  assert.deepEqual(await h.applied(), [], 'nothing applied yet');

  await flush(page);
  const during = await statusesFor(key);
  assert.equal(during[0], null, `the timed-out first attempt has no answer yet: ${JSON.stringify(during)}`);
  assert.ok(during.length >= 2 && during.slice(1).every((s) => s === 409),
    `each replay so far met the running first attempt and got 409: ${JSON.stringify(during)}`);
  const records = await listQueue(page);
  assert.deepEqual(records.map((x) => ({ id: x.id, state: x.state, attentionReason: x.attentionReason ?? null })),
    [{ id: queued.id, state: 'queued', attentionReason: null }],
    `a bare 409 from a running first attempt leaves the record queued for the next flush: ${JSON.stringify(records)}`);

  await h.release();
  await eventually(async () => (await h.running()) === 0 && (await h.applied()).length === 1,
    { timeout: 30000, what: 'the first attempt to finish on the server' });
  await flush(page);
  assert.deepEqual(await listQueue(page), [], 'delivered and gone');
  await assertAppliedOnce(key, 'slow first attempt');
  const statuses = await statusesFor(key);
  assert.equal(statuses.at(-1), 201, `the last replay got the stored 201: ${JSON.stringify(statuses)}`);
}));

test('4. an uncached 5xx: queued offline, first replay 500 (not stored), retried, applied once', TIMEOUT, run(async () => {
  const page = await freshStart();
  await h.setNetwork(false);
  const queued = assertQueued(await write(page, 'after a 500'), 'a write made offline');
  const key = queued.idempotencyKey;
  // Armed before the network is back: the worker's own retries (the offline probe) may
  // replay the record as soon as it is. The offline first attempt never reached the
  // handler, so the fault waits for the first replay.
  await h.fault('fail-once');
  await h.setNetwork(true);
  assert.deepEqual(await h.applied(), [], 'nothing applied while offline');

  // A late Background Sync flush may take the first replay, and a FLUSH_QUEUE asked for
  // during it then shares the rerun after it; so flush until the queue is empty (at most
  // twice for one 500), checking the record after each flush that left it queued.
  let flushes = 0;
  for (;;) {
    await flush(page);
    flushes += 1;
    const records = await listQueue(page);
    if (records.length === 0) break;
    assert.deepEqual(records.map((x) => [x.id, x.state]), [[queued.id, 'queued']],
      `a first 5xx leaves the record queued: ${JSON.stringify(records)}`);
    assert.deepEqual(await h.applied(), [], 'the 500 applied nothing');
    assert.ok(flushes < 2, `still queued after ${flushes} flushes: ${JSON.stringify(await statusesFor(key))}`);
  }
  await assertAppliedOnce(key, 'after a 500');
  const statuses = await statusesFor(key);
  assert.deepEqual(statuses.filter((s) => s !== null), [500, 201],
    `the first replay got 500, which the middleware did not store, so the retry ran the route once: ${JSON.stringify(statuses)}`);
}));

/** Page keys of other shapes than the ones the outbox mints; each pair: [online, lost-response]. */
const hex80 = () => randomBytes(40).toString('hex');
const PAGE_KEYS = [
  ['an order number', 'order_1234', 'order_1235'],
  ['an 80-character hex hash', hex80(), hex80()],
  ['a key with a colon', 'k:7f3e', 'k:7f3f'],
];

for (const [shape, onlineKey, lostKey] of PAGE_KEYS) {
  test(`5. a page key (${shape}, ${onlineKey.length} chars) passes through unchanged, online and replayed`, TIMEOUT, run(async () => {
    const page = await freshStart();
    const online = await write(page, `online ${shape}`, { 'Idempotency-Key': onlineKey });
    assert.equal(online.status, 201, `the page's key ${JSON.stringify(onlineKey)} reaches the server: ${JSON.stringify(online)}`);
    assert.equal(online.headers['idempotency-key'], onlineKey, 'the server saw exactly the page\'s key');
    await assertAppliedOnce(onlineKey, `online ${shape}`);
    await h.reset(); // ground truth per half; the page's session is gone with it
    const signed = await page.evaluate(() => window.interop.signIn('alice'));
    assert.equal(signed.status, 200, JSON.stringify(signed));

    await h.fault('drop-after-apply');
    const queued = assertQueued(await write(page, `lost ${shape}`, { 'Idempotency-Key': lostKey }),
      `a write with the page's key ${JSON.stringify(lostKey)} whose answer was lost`);
    assert.equal(queued.idempotencyKey, lostKey, 'the record keeps the page\'s key');
    await flush(page);
    assert.deepEqual(await listQueue(page), [], 'delivered and gone');
    await assertAppliedOnce(lostKey, `lost ${shape}`);
    assert.deepEqual(await statusesFor(lostKey), [null, 201], 'replayed under the page\'s key, answered from the middleware\'s store');
  }));
}
